"""A run's life as a user sees it: stopping by signal under the launcher and under torchrun (checkpoint, exit 0, no
traceback), a used run_dir refused without losing anything, --overwrite, resuming into a new run_dir, a rank-count
mismatch caught before anything starts, exit codes, what the console and train.log show."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ENV, ROOT, alive, descendants, metrics, rl_args, run, start, trainer_cmd
from launch import complete_checkpoints


def stop_with(proc, target: str, sig) -> None:
    """Send sig to the launcher, its process group, or one rank (a child process running trainer.py)."""
    if target == "group":
        os.killpg(proc.pid, sig)
        return
    pid = proc.pid
    if target == "rank":
        ranks = [p for p in descendants(proc.pid) if b"trainer.py" in open(f"/proc/{p}/cmdline", "rb").read()
                 and b"torch.distributed.run" not in open(f"/proc/{p}/cmdline", "rb").read()]
        assert ranks, "no rank process found"
        pid = ranks[-1]
    os.kill(pid, sig)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, target, sig", [
    ("launcher-2", "launcher", signal.SIGTERM),  # kill -TERM <pid> of `python trainer.py --nproc_per_node 2`
    ("launcher-1", "group", signal.SIGINT),  # Ctrl-C in a terminal: SIGINT to the foreground process group
    ("torchrun-2", "rank", signal.SIGTERM),  # plain torchrun: SIGTERM to one rank
])
def test_signal_checkpoints_and_exits_zero(tiny, tmp_path, launcher, target, sig):
    args = rl_args(tiny, tmp_path, "--steps=50", "--save_every=0")
    nproc = int(launcher[-1])
    cmd = trainer_cmd(nproc, *args) if launcher.startswith("launcher") else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "trainer.py", *args]
    proc = start(cmd)
    deadline = time.time() + 600
    while not (tmp_path / "metrics.jsonl").exists() or len((tmp_path / "metrics.jsonl").read_text().splitlines()) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:] if proc.poll() else "slow"
        time.sleep(0.2)
    tree = descendants(proc.pid)
    stop_with(proc, target, sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by signal after step" in out and "Traceback" not in err, err[-3000:]
    (ckpt,) = complete_checkpoints(tmp_path / "checkpoints")
    step = json.loads((ckpt / "manifest.json").read_text())["step"]
    assert [r["step"] for r in metrics(tmp_path)] == list(range(step + 1))
    assert not alive(tree, wait_s=10), f"processes left running after the run ended: {alive(tree)}"


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    """A finished 1-rank run of 2 steps (checkpoints at 1 and 2, an export)."""
    run_dir = tmp_path_factory.mktemp("finished")
    p = run(trainer_cmd(1, *rl_args(tiny, run_dir, "--steps=2")))
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir, p


@pytest.mark.slow
def test_last_step_is_checkpointed_and_console_is_quiet(finished):
    run_dir, p = finished
    assert [c.name for c in complete_checkpoints(run_dir / "checkpoints")] == ["step_000001", "step_000002"]
    noisy = [line for line in p.stdout.splitlines() + p.stderr.splitlines()
             if any(w in line for w in ("WARNING", "INFO", "Warning", "Loading safetensors"))]
    assert not noisy, noisy[:10]  # library logs, vLLM's C++ warnings (NUMA binding) go to train.log only
    log = (run_dir / "train.log").read_text()
    assert "rl:" not in log.splitlines()[0] and "train: " in log  # rank 0's stdout, without progress redraws
    first = metrics(run_dir)[0]
    assert first["step"] == 0 and first["data/train_rows"] + first["data/train_skipped"] == 400


@pytest.mark.slow
def test_used_run_dir_is_refused_and_nothing_is_lost(tiny, finished):
    run_dir, _ = finished
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    t0 = time.time()
    p = run(trainer_cmd(1, *rl_args(tiny, run_dir, "--steps=2")))
    assert p.returncode == 2 and "already holds a run" in p.stderr and "--resume=auto" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and time.time() - t0 < 60  # refused before any rank starts
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_rank_count_mismatch_is_refused_before_anything_starts(tiny, finished):
    run_dir, _ = finished
    config = (run_dir / "config.yaml").read_text()
    p = run(trainer_cmd(2, *rl_args(tiny, run_dir, "--steps=3", "--resume=auto")))
    assert p.returncode == 2 and "was written by 1 ranks" in p.stderr and "this run has 2" in p.stderr, p.stderr[-2000:]
    assert p.stderr.count("config error") == 1 and "Traceback" not in p.stderr
    assert (run_dir / "config.yaml").read_text() == config


@pytest.mark.slow
def test_resume_into_a_new_run_dir_and_extend(tiny, finished, tmp_path):
    run_dir, _ = finished
    ckpt = complete_checkpoints(run_dir / "checkpoints")[-1]
    p = run(trainer_cmd(1, *rl_args(tiny, tmp_path, "--steps=3", f"--resume={ckpt}")))
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["step"] for r in metrics(tmp_path)] == [3]  # steps 1-2 live in the first run's folder


@pytest.mark.slow
def test_overwrite_clears_the_old_run(tiny, tmp_path):
    (tmp_path / "checkpoints" / "step_000009").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000009" / "manifest.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"step": 9}\n')
    p = run(trainer_cmd(None, *rl_args(tiny, tmp_path, "--steps=1", "--overwrite=true")))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"overwrite: deleting the earlier run in {tmp_path}" in p.stdout  # said on the console
    assert [c.name for c in complete_checkpoints(tmp_path / "checkpoints")] == ["step_000001"]
    assert [r["step"] for r in metrics(tmp_path)] == [0, 1]


@pytest.mark.slow
def test_errors_in_a_rank_keep_their_exit_code_under_the_launcher(tiny, tmp_path):
    """A problem found only once the ranks run (here every prompt is over max_prompt_len) is said once, exit 2."""
    p = run(trainer_cmd(2, *rl_args(tiny, tmp_path, "--max_prompt_len=2")))
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.count("config error") == 1 and "usable prompts" in p.stderr and "Traceback" not in p.stderr, \
        p.stderr[-3000:]


def test_reward_workers_ignore_stop_signals():
    """The trainer owns shutdown: a SIGTERM or SIGINT that reaches a reward worker leaves it serving."""
    from rewards.pool import RewardPool
    pool = RewardPool(workers=1, timeout_s=30)
    try:
        row = {"task": "math", "answer": "2"}
        assert pool.score([(row, "\\boxed{2}")])[0][0] == 1.0  # the worker is up and has installed its handlers
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(pool.procs[0][0].pid, sig)
        time.sleep(0.5)
        assert pool.procs[0][0].is_alive() and pool.score([(row, "\\boxed{2}")])[0] == (1.0, {"reason": "ok", "pred": "2"})
    finally:
        pool.close()


def test_help_lists_every_key_with_type_default_and_comment(tmp_path):
    """--help prints every key with its type, default and whole comment (a field over several lines, a comment
    continued below its field), and imports no torch, transformers or vLLM to do it (stand-ins that raise)."""
    import re
    from tests.test_docs import config_keys
    for name in ("torch", "transformers", "vllm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('--help imported {name}')")
    p = subprocess.run([sys.executable, "trainer.py", "--help"], cwd=ROOT, env={**ENV, "PYTHONPATH": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    for needle in ("[copris]", "--copris.concurrency=<int>  (default: 64)", "requests in flight per engine",
                   "--prime.ref=<frozen|policy>", "--correction.mode=<none|token_truncate", "--dual_clip=<float|null>",
                   "NCCL's default is 10 min", '--lora.target_modules=<list>  (default: ["q_proj"'):
        assert needle in p.stdout, needle
    listed = dict(re.findall(r"^  --(\S+)=<.*\n      (.*)$", p.stdout, re.M))
    assert set(listed) == config_keys()
    assert not [k for k, comment in listed.items() if not comment.strip()], "keys without a comment"


def test_exit_process_runs_atexit_hooks_flushes_and_keeps_the_code(tmp_path):
    """launch.exit_process ends a rank without interpreter finalization (where a native thread taking the GIL aborts
    the process), but what finalization is relied on for still happens: atexit hooks, buffered output, the exit code,
    leaving the process group."""
    script = tmp_path / "w.py"
    script.write_text(f"""
import atexit, sys, torch.distributed as dist
import launch
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
atexit.register(lambda: open({str(tmp_path / 'hook')!r}, "w").write(f"ran, group left: {{not dist.is_initialized()}}"))
sys.stdout.write("buffered, no newline")
sys.stderr.write("err, no newline")
launch.exit_process(3)
""")
    env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # stdout to a pipe is block-buffered then
    p = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and p.stdout == "buffered, no newline" and p.stderr.endswith("err, no newline"), p
    assert (tmp_path / "hook").read_text() == "ran, group left: True"


def test_resume_into_a_used_run_dir_sets_aside_what_it_would_overwrite(world_of_one, tmp_path, capsys):
    """--resume=<an older checkpoint> in a run_dir that went further: the metric lines after it, the newer checkpoints
    (the resumed run would prune or overwrite them) and the export are moved to before-resume-1/, and it says so."""
    import json
    import trainer
    from launch import start_run_dir
    for s in (2, 4):
        (tmp_path / "checkpoints" / f"step_{s:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{s:06d}" / "manifest.json").write_text(
            json.dumps({"step": s, "world": 1, "policy_version": s}))
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.safetensors").write_text("w")
    lines = "".join(json.dumps({"step": s, "reward": s / 10}) + "\n" for s in range(6))
    (tmp_path / "metrics.jsonl").write_text(lines)
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert start_run_dir(trainer.Config(run_dir=str(tmp_path), resume=str(ckpt)), 0) == ckpt
    aside = tmp_path / "before-resume-1"
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert (aside / "metrics.jsonl").read_text() == lines
    assert [c.name for c in complete_checkpoints(tmp_path / "checkpoints")] == ["step_000002"]
    assert (aside / "checkpoints" / "step_000004" / "manifest.json").is_file()
    assert (aside / "export" / "model.safetensors").read_text() == "w" and not (tmp_path / "export").exists()
    said = capsys.readouterr().out
    assert "3 metric lines after step 2" in said and "checkpoints/step_000004" in said and str(aside) in said
    start_run_dir(trainer.Config(run_dir=str(tmp_path), resume=str(ckpt)), 0)  # nothing after step 2 now: no move
    assert not (tmp_path / "before-resume-2").exists()


def used_run_dir(run_dir, last: int, checkpoints=(), **config) -> None:
    """A run_dir as a run leaves it: config.yaml (trainer.Config with `config`), metric lines for steps 0..last (an
    evaluation at 0 and at the last), complete checkpoints at `checkpoints`, a half-written one after them."""
    import dataclasses
    import json
    import trainer
    import yaml
    (run_dir / "checkpoints").mkdir(parents=True)
    for s in checkpoints:
        (run_dir / "checkpoints" / f"step_{s:06d}").mkdir()
        (run_dir / "checkpoints" / f"step_{s:06d}" / "manifest.json").write_text(
            json.dumps({"step": s, "world": 1, "policy_version": s}))
    (run_dir / "checkpoints" / f"step_{last + 1:06d}.tmp").mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward": 0.5, **({"eval/greedy_acc": 0.9} if s in (0, last) else {})}) + "\n"
        for s in range(last + 1)))
    cfg = trainer.Config(run_dir=str(run_dir), **config)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def test_resume_sets_aside_the_config_it_replaces(world_of_one, tmp_path, capsys):
    """A resume with other settings (steps 40 -> 31) moves the config.yaml it replaces to before-resume-1/; one that
    differs only in how it was started (resume, overwrite) moves nothing."""
    import trainer
    import yaml
    from launch import start_run_dir
    used_run_dir(tmp_path, 40, checkpoints=(40,), steps=40)
    start_run_dir(trainer.Config(run_dir=str(tmp_path), steps=40, resume="auto"), 0)
    assert not (tmp_path / "before-resume-1").exists() and capsys.readouterr().out == ""
    start_run_dir(trainer.Config(run_dir=str(tmp_path), steps=31, resume="auto"), 0)
    assert yaml.safe_load((tmp_path / "before-resume-1" / "config.yaml").read_text())["steps"] == 40
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["steps"] == 31
    assert "config.yaml" in capsys.readouterr().out


def test_resume_auto_without_a_complete_checkpoint_is_refused(world_of_one, tmp_path, capsys):
    """--resume=auto in a run_dir with metrics but no complete checkpoint would start over and append steps 0, 1...
    to the old run's: refused, saying what is there and how to go on; --overwrite=true then replaces the old run
    and says so on the console."""
    import trainer
    from launch import check_run_dir, start_run_dir
    used_run_dir(tmp_path, 40)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(trainer.ConfigError) as e:
        check_run_dir(trainer.Config(run_dir=str(tmp_path), resume="auto"), 1)
    said = str(e.value)
    for needle in ("--resume=auto", "metrics.jsonl with steps 0..40", "no complete checkpoint (step_000041.tmp)",
                   "--overwrite=true", "fresh --run_dir"):
        assert needle in said, said
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    cfg = trainer.Config(run_dir=str(tmp_path), resume="auto", overwrite=True)
    check_run_dir(cfg, 1)
    assert start_run_dir(cfg, 0) is None and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert f"overwrite: deleting the earlier run in {tmp_path} (metrics.jsonl with steps 0..40" in capsys.readouterr().out


def test_resume_from_another_run_dirs_checkpoint_into_a_used_run_dir_is_refused(tmp_path):
    """--resume=<checkpoint of run A> with run_dir B that holds a run: B's metric lines would be kept up to the
    checkpoint's step and mixed with A's; refused. Into a fresh run_dir, or from B's own checkpoints, it goes."""
    import trainer
    from launch import check_run_dir
    used_run_dir(tmp_path / "a", 4, checkpoints=(2, 4))
    used_run_dir(tmp_path / "b", 3, checkpoints=(3,))
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    with pytest.raises(trainer.ConfigError, match="holds another run"):
        check_run_dir(trainer.Config(run_dir=str(tmp_path / "b"), resume=str(ckpt)), 1)
    check_run_dir(trainer.Config(run_dir=str(tmp_path / "fresh"), resume=str(ckpt)), 1)
    check_run_dir(trainer.Config(run_dir=str(tmp_path / "a"), resume=str(ckpt)), 1)


def test_end_of_run_summary_gives_every_evaluation_with_pass_at_k(tmp_path, capsys):
    """The summary lists each held-out evaluation of the run (before, every eval_every steps, after) with greedy,
    mean@k, pass@k and the tool-call rate, not only the first and last greedy and mean@k."""
    import json
    import report
    rows = [{"step": s, "reward": 0.1 * s, "eval/greedy_acc": 0.5 + s / 100, "eval/mean@4": 0.3 + s / 200,
             "eval/pass@4": 0.6 + s / 1000, "eval/tool_call_rate": 0.2 + s / 50, "eval/rows": 493}
            for s in (0, 10, 20)]
    rows.insert(1, {"step": 5, "reward": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.report_rl(tmp_path, 4, 10.0, 20)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "held-out accuracy (493 prompts)" and out[1].split() == ["step", "greedy_acc", "mean@4", "pass@4",
                                                                             "tool_call_rate"]
    assert [line.split() for line in out[2:5]] == [["0", "0.500", "0.300", "0.600", "0.200"],
                                                   ["10", "0.600", "0.350", "0.610", "0.400"],
                                                   ["20", "0.700", "0.400", "0.620", "0.600"]]
    assert out[5].startswith("20 steps in 10 s")
    assert report.steps_done(3, 4) == "1 step (resumed after step 3: step 4)"  # not "1 steps"
    assert report.steps_done(3, 6) == "3 steps (resumed after step 3: steps 4..6)"
    assert report.steps_done(0, 1) == "1 step"


def test_native_stderr_goes_to_the_log_for_the_block_only(tmp_path, capfd):
    """What native code writes to file descriptor 2 during the engine's start (vLLM's C++ NUMA warning) lands in
    train.log, not on the console; stderr is the console again afterwards, after an exception too."""
    import report
    log = tmp_path / "train.log"
    with report.native_stderr_to(log):
        os.write(2, b"[W utils.cpp:68] Warning: NUMA binding\n")
    with pytest.raises(RuntimeError), report.native_stderr_to(log):
        raise RuntimeError("engine start failed")
    os.write(2, b"after\n")
    assert log.read_text() == "[W utils.cpp:68] Warning: NUMA binding\n" and capfd.readouterr().err == "after\n"


def test_openmp_wait_is_chosen_before_torch_loads():
    """trainer.py decides how OpenMP threads wait (config.openmp_wait) before torch loads its OpenMP runtime, which
    reads it once, at load: GOMP_SPINCOUNT=30000 or OMP_WAIT_POLICY=PASSIVE by the idle CPUs (either here: the test
    cannot know this machine's load). A user's own setting of either variable is kept, and nothing else is set."""
    probe = ("import os, sys\n"
             "class Seen:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'torch':\n"
             "            print('torch loads with', os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'),"
             " flush=True)\n"
             "sys.meta_path.insert(0, Seen())\n"
             "import trainer\n")
    env = {k: v for k, v in ENV.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for given, want in (({}, ("torch loads with None 30000", "torch loads with PASSIVE None")),
                        ({"OMP_WAIT_POLICY": "ACTIVE"}, ("torch loads with ACTIVE None",)),
                        ({"GOMP_SPINCOUNT": "7"}, ("torch loads with None 7",))):
        p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**env, **given})
        assert p.returncode == 0 and p.stdout.splitlines()[0] in want, (given, p.stdout + p.stderr[-2000:])


def test_openmp_wait_spins_only_with_the_threads_idle(monkeypatch, tmp_path):
    """config.openmp_wait's rule on fake loads (2 CPUs, one process: 2 threads): spin with 1.5 CPUs idle or more,
    sleep below (two busy neighbours: none idle) or where the load cannot be read; 2 ranks on 2 CPUs (1 thread each)
    spin with half a CPU idle. idle_cpus reads /proc/stat's format."""
    import config
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: {0, 1})
    for local, idle, want in ((None, 2.0, "GOMP_SPINCOUNT=30000"), (None, 1.5, "GOMP_SPINCOUNT=30000"),
                              (None, 1.4, "OMP_WAIT_POLICY=PASSIVE"), (None, 0.0, "OMP_WAIT_POLICY=PASSIVE"),
                              (None, None, "OMP_WAIT_POLICY=PASSIVE"), ("2", 0.5, "GOMP_SPINCOUNT=30000")):
        for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(var, raising=False)
        if local:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert config.openmp_wait(lambda: idle).startswith(want + " "), (local, idle)
        assert os.environ[want.split("=")[0]] == want.split("=")[1]
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\n")
    assert config.idle_cpus(0.0, str(stat)) is None  # no time passed: nothing to divide
    assert config.idle_cpus(0.0, str(tmp_path / "missing")) is None
    assert 0.0 <= config.idle_cpus(0.05) <= os.cpu_count() + 0.01  # this machine's, whatever its load

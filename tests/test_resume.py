"""Crash safety: SIGKILL at a random step (a fixed one with a tensor-parallel engine) then --resume=auto
reproduces the uninterrupted run's per-step metrics exactly; SIGTERM checkpoints and exits 0; half-written
checkpoints are ignored."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import complete_checkpoints

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
TIMING = ("time/", "elapsed_s", "rollout_tok_per_s")  # wall-clock figures differ between runs


def args(tiny, run_dir, *extra):
    return ["trainer.py", f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            f"--run_dir={run_dir}", "--steps=4", "--save_every=1", "--n_samples=4", "--batch_groups=4",
            "--copris.concurrency=6", "--max_prompt_len=64", "--max_response_len=48", "--token_budget=1024",
            "--lr=1e-3", "--entropy_coef=0.05", *extra]  # the entropy bonus makes every step move the weights


def torchrun(argv):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *argv]


def metrics(run_dir):
    rows = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def sigkill_then_resume(tiny, tmp_path, kill_after: int, *extra) -> Path:
    """An uninterrupted run, and one SIGKILLed once step kill_after's checkpoint exists then resumed: the
    per-step metrics must be equal; -> the uninterrupted run's folder."""
    ref = tmp_path / "ref"
    p = subprocess.run(torchrun(args(tiny, ref, *extra)), cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    want = metrics(ref)
    assert [r["step"] for r in want] == [0, 1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 for r in want[1:])

    run = tmp_path / "killed"
    proc = subprocess.Popen(torchrun(args(tiny, run, *extra)), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while not (run / "checkpoints" / f"step_{kill_after:06d}" / "manifest.json").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before the kill point"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    p = subprocess.run(torchrun(args(tiny, run, *extra, "--resume=auto")), cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from" in p.stdout
    got = metrics(run)
    assert got == want, f"killed after step {kill_after}"  # exact: same tokens, rewards, losses, grad norms
    return ref


def test_sigkill_then_resume_matches_uninterrupted_run(tiny, tmp_path):
    sigkill_then_resume(tiny, tmp_path, random.Random(os.getpid()).choice([1, 2]))


def test_sigkill_then_resume_with_tensor_parallel_engine(tiny, tmp_path):
    """t=2: one engine over both ranks. The group's prompt cursor and CoPRIS buffer are saved once, by its first
    rank, and both ranks resume from them."""
    import torch
    ref = sigkill_then_resume(tiny, tmp_path, 2, "--engine.tensor_parallel_size=2")
    ckpt = complete_checkpoints(ref / "checkpoints")[-1]
    first, second = (torch.load(ckpt / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert first["scheduler"]["buffer"] and first["prompts"]["cursor"] > 0, "rank 0 holds the group's state"
    assert "scheduler" not in second and "prompts" not in second, "rank 1 must not save the group's state again"
    assert json.loads((ckpt / "manifest.json").read_text())["tensor_parallel_size"] == 2


def test_sigterm_checkpoints_and_exits_zero(tiny, tmp_path):
    run = tmp_path / "term"
    proc = subprocess.Popen([sys.executable, *args(tiny, run, "--steps=50", "--save_every=0")], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:] if proc.poll() else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by signal after step" in out
    ckpts = complete_checkpoints(run / "checkpoints")
    assert len(ckpts) == 1
    step = json.loads((ckpts[0] / "manifest.json").read_text())["step"]
    assert step >= 1 and [r["step"] for r in metrics(run)] == list(range(0, step + 1))


def test_half_written_checkpoints_are_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step_000002").mkdir(parents=True)
    (root / "step_000002" / "manifest.json").write_text("{}")
    (root / "step_000003.tmp").mkdir()  # killed while writing
    (root / "step_000003.tmp" / "manifest.json").write_text("{}")
    (root / "step_000004").mkdir()  # no manifest: never completed
    assert complete_checkpoints(root) == [root / "step_000002"]


def test_resume_path_must_be_a_complete_checkpoint(tiny, tmp_path):
    from trainer import ConfigError, load_config
    with pytest.raises(ConfigError, match="not off, auto, or a complete checkpoint"):
        load_config(args(tiny, tmp_path)[1:] + [f"--resume={tmp_path}"])


def test_non_finite_updates_are_skipped_counted_then_stop():
    import torch
    from trainer import Config, Run, TrainingError, make_optimizer, optimizer_step
    model = torch.nn.Linear(3, 2)
    cfg = Config(max_skipped_updates=3)
    optim, sched = make_optimizer(cfg, model, 10)
    run = Run(cfg, 0, 1, torch.device("cpu"), None, None, model, optim, sched)
    before = model.weight.detach().clone()
    for i in range(2):
        model(torch.ones(1, 3)).sum().mul(float("nan")).backward()
        norm, applied = optimizer_step(run)
        assert not applied and run.counters["skipped_updates"] == i + 1
    assert torch.equal(model.weight, before) and run.policy_version == 0  # nothing applied
    model(torch.ones(1, 3)).sum().backward()
    assert optimizer_step(run)[1] and run.counters["consecutive_skips"] == 0  # a good step resets the run
    for _ in range(2):
        model(torch.ones(1, 3)).sum().mul(float("inf")).backward()
        optimizer_step(run)
    model(torch.ones(1, 3)).sum().mul(float("nan")).backward()
    with pytest.raises(TrainingError, match="3 consecutive updates had a non-finite gradient norm"):
        optimizer_step(run)

"""Beyond one machine: the torchrun line of examples/slurm/grpo.sbatch, read from the file and run as it is, as two
torchrun agents on this host (--nnodes 2, one rank each, c10d rendezvous on 127.0.0.1) gives the metrics of one
agent with two ranks; SIGKILLing one agent's process tree stops the other with nothing left running; RESUME=auto on
both continues to the end, exactly as the run that was never stopped. Engine groups never span a node: refused in
one line. What a real cluster adds (a network between the nodes, NCCL, a shared filesystem's latency, Slurm's own
signals) is in docs/running.md."""
import os
import socket
import subprocess
import time

import pytest

from helpers import ENV, ROOT, TIMING, alive, descendants, kill_tree, metrics, rl_args, run, trainer_cmd

SBATCH = ROOT / "examples" / "slurm" / "grpo.sbatch"


def torchrun_line() -> str:
    """The sbatch file's one line that starts with `torchrun`."""
    (line,) = [x.strip() for x in SBATCH.read_text().splitlines() if x.strip().startswith("torchrun ")]
    return line


def test_the_recipe_is_srun_and_torchrun_with_a_rendezvous_on_the_first_node():
    text = SBATCH.read_text()
    line = torchrun_line()
    for part in ('--nnodes="$NNODES"', "--rdzv_backend=c10d", '--rdzv_endpoint="$HEAD:$PORT"', '--run_dir="$RUN_DIR"',
                 '--resume="$RESUME"', "--dist_timeout_s="):
        assert part in line, part
    for part in ("srun --kill-on-bad-exit=1", 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1',
                 "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "#SBATCH --ntasks-per-node=1"):
        assert part in text, part


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agents(tiny, tmp_path, run_dir, nnodes: int, nproc: int, resume: str = "off") -> list[subprocess.Popen]:
    """nnodes torchrun agents of the sbatch file's line on this host, nproc ranks each, one rendezvous; a job of
    4 steps of 4 groups, a checkpoint after each. Each agent is pinned (taskset) to its own share of this host's CPUs,
    as on its own node: every rank gets the same CPU count (its torch threads) whatever the layout, so the float
    sums, and the metrics, do not depend on it."""
    config = tmp_path / "job.yaml"
    config.write_text("".join(f"{a[2:].replace('=', ': ', 1)}\n" for a in rl_args(tiny, run_dir)))
    env = {**ENV, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", "NNODES": str(nnodes),
           "NPROC": str(nproc), "HEAD": "127.0.0.1", "PORT": str(free_port()), "RDZV_ID": f"test-{time.time()}",
           "CONFIG": str(config), "RUN_DIR": str(run_dir), "RESUME": resume, "EXTRA": "--dist_timeout_s=300",
           "OMP_NUM_THREADS": "1"}
    cpus, share = sorted(os.sched_getaffinity(0)), nproc * (len(os.sched_getaffinity(0)) // (nnodes * nproc))
    assert share, "fewer CPUs than ranks"
    return [subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus[i * share:(i + 1) * share])), "bash", "-c",
                              torchrun_line()], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True) for i in range(nnodes)]


def finish(procs: list[subprocess.Popen], timeout: float = 900) -> list[str]:
    """Wait for every agent; -> their stderr; fails with it when one did not exit 0."""
    outs = [p.communicate(timeout=timeout) for p in procs]
    assert all(p.returncode == 0 for p in procs), [(p.returncode, e[-3000:]) for p, (_, e) in zip(procs, outs)]
    return [e for _, e in outs]


def untimed(run_dir) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in metrics(run_dir, timing=True)]


@pytest.fixture(scope="module")
def two_agents(tiny, tmp_path_factory):
    """The uninterrupted two-agent run's run_dir."""
    tmp = tmp_path_factory.mktemp("two_agents")
    finish(agents(tiny, tmp, tmp / "run", nnodes=2, nproc=1))
    return tmp / "run"


@pytest.mark.slow
def test_two_agents_give_the_metrics_of_one_agent_with_two_ranks(tiny, tmp_path, two_agents):
    finish(agents(tiny, tmp_path, tmp_path / "one", nnodes=1, nproc=2))
    got, want = untimed(two_agents), untimed(tmp_path / "one")
    assert [m["step"] for m in got] == [0, 1, 2, 3, 4]
    assert got == want


@pytest.mark.slow
def test_a_killed_agent_stops_the_other_and_resume_auto_continues(tiny, tmp_path, two_agents):
    """SIGKILL one agent's whole process tree (agent, ranks, engine and reward workers) once step 2 is
    checkpointed: the other agent exits non-zero soon after, and none of either tree is left running; then both
    agents again with RESUME=auto reach step 4 with the metrics of the run that was never stopped."""
    run_dir = tmp_path / "run"
    a, b = agents(tiny, tmp_path, run_dir, nnodes=2, nproc=1)
    deadline = time.time() + 900
    while not (run_dir / "checkpoints" / "step_000002" / "manifest.json").exists():
        assert a.poll() is None and b.poll() is None and time.time() < deadline, "the run ended or stalled first"
        time.sleep(0.2)
    tree = [a.pid, b.pid, *descendants(a.pid), *descendants(b.pid)]
    killed = time.time()
    kill_tree(b)
    a.communicate(timeout=300)
    assert a.returncode != 0, "the surviving agent claims success"
    assert not alive(tree, wait_s=30), f"left running: {alive(tree)}"
    print(f"the other agent stopped {time.time() - killed:.1f} s after the kill")
    finish(agents(tiny, tmp_path, run_dir, nnodes=2, nproc=1, resume="auto"))
    got = untimed(run_dir)
    assert [m["step"] for m in got] == [0, 1, 2, 3, 4], got
    assert got == untimed(two_agents)


def test_an_engine_group_across_two_nodes_is_refused_in_one_line(tiny, tmp_path):
    """engine.tensor_parallel_size 2 with one rank per node: the launcher (--nnodes 2 --nproc_per_node 1) refuses it
    before any rendezvous, exit 2, one line."""
    p = run(trainer_cmd(1, "--nnodes=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                        *rl_args(tiny, tmp_path / "run", "--engine.tensor_parallel_size=2")), timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and lines == [
        "config error: engine.tensor_parallel_size=2 does not divide the 1 ranks per node: an engine group (t "
        "consecutive ranks) would span two nodes, which is not supported: use a t that divides it"], p.stderr[-2000:]
    assert "Traceback" not in p.stderr

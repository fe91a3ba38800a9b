"""Shared by the tests that run the trainer as a user would: the command, a tiny RL job, metrics, process trees,
vLLM's OpenAI server."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
TIMING = ("time/", "elapsed_s", "rollout_tok_per_s", "tools/wait_s")  # wall-clock figures differ between runs


def trainer_cmd(nproc: int | None, *args) -> list[str]:
    """python trainer.py [--nproc_per_node N] ARGS: the launcher when nproc is given, else one plain process."""
    return [sys.executable, "trainer.py", *([f"--nproc_per_node={nproc}"] if nproc else []), *args]


def rl_args(tiny: Path, run_dir: Path, *extra) -> list[str]:
    """A small RL job on the tiny model: 4 groups of 4 per step, short responses, a checkpoint every step."""
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            f"--run_dir={run_dir}", "--steps=4", "--save_every=1", "--n_samples=4", "--batch_groups=4",
            "--copris.concurrency=6", "--max_prompt_len=64", "--max_response_len=48", "--token_budget=1024",
            "--lr=1e-3", "--entropy_coef=0.05", *extra]  # the entropy bonus makes every step move the weights


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def result_of(argv: list[str], timeout: int = 600) -> dict:
    """Run `python ARGV` (a worker script) and parse its last `RESULT {json}` line; fails with its output if none."""
    p = run([sys.executable, *argv], timeout)
    line = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(line[-1][7:])


def metrics(run_dir: Path, timing: bool = False) -> list[dict]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return rows if timing else [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def start(cmd: list[str], **kw) -> subprocess.Popen:
    """A run in its own session (so the test can signal its process group), output captured."""
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Until `path` exists (the run got that far); fails if the run ended first."""
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"run ended (rc {proc.returncode}) before {path}: {proc.stderr.read()[-3000:]}"
        assert time.time() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below pid (torchrun's ranks run in their own sessions: a group kill misses them)."""
    children = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except (OSError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    """Signal a run and everything it started, then reap it."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    proc.wait(timeout=120)


@contextlib.contextmanager
def openai_server(cmd: list[str], timeout: float = 300):
    """Start a vLLM OpenAI server command (without --host / --port) on a free local port, wait until it answers, yield
    its URL; then kill its whole process tree (the engine runs in a child) and check that none of it is left."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT,
                              env={**ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + timeout
    try:
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            assert time.time() < deadline, f"the server did not come up in {timeout} s"
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        tree = descendants(server.pid)
        kill_tree(server)
    assert not alive(tree, wait_s=30), f"server processes left running: {alive(tree)}"


def alive(pids: list[int], wait_s: float = 0.0) -> list[int]:
    """Those of pids still running (zombies do not count), polled for up to wait_s seconds until none is: a SIGKILLed
    process takes a moment to go, more on a busy machine."""
    deadline = time.time() + wait_s
    while True:
        left = []
        for p in pids:
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        left.append(p)
            except OSError:
                pass
        if not left or time.time() >= deadline:
            return left
        time.sleep(0.2)


def post(url: str, body: dict, timeout: float = 120) -> dict:
    """POST a JSON body, -> the JSON reply."""
    req = urllib.request.Request(url, method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode())
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())

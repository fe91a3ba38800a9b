"""Issue 36, class 5: scoring killed from outside left its files. Every sandbox run in a reward or tool pool job takes
its wall limit from the job's (rewards/sandbox.py inner_limit: the time the pool leaves it minus CLEANUP_S), so the
sandbox, not the pool's SIGKILL of the worker, ends an overlong run, and its clean-up (captured output, the
candidate, the hidden inputs) runs. A program that writes 60 MB to stdout and to stderr and then sleeps leaves
nothing in TMPDIR after scoring, under the trainer's default limits, through the reward pool (the code reward: its
own 10 s per test against the pool's 10 s) and the tool pool (the python tool; Triton refinement: its 60 s against
the pool's 30 s), and no worker is killed for it.
"""
import json
import tempfile
import time
from pathlib import Path

import pytest

from data.triton_tasks import load_tasks
from rewards import deadline
from rewards.pool import RewardPool
from rewards.sandbox import CLEANUP_S, run_python
from rollout.environments import CALL_CLOSE, CALL_OPEN, Episodes
from trainer import Config, ToolsConfig
from triton_corpus.gpu_rules import RELU_KERNEL, RELU_OK, model

FLOOD = """import sys, time
sys.stdout.write("x" * 60_000_000)
sys.stdout.flush()
sys.stderr.write("y" * 60_000_000)
sys.stderr.flush()
time.sleep(600)"""
# the most a Triton candidate can write (its files are capped at 16 MiB), then it spins in forward
TRITON_FLOOD = model(RELU_KERNEL, RELU_OK + "print(TEXT * 15_000_000)\nwhile True:\n    pass\nreturn out",
                     prelude='\nTEXT = "x"\n')


@pytest.fixture
def tmpdir_only(tmp_path, monkeypatch):
    """TMPDIR is tmp_path for this test and the pools it starts (their workers' roots go below it)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


def files_below(path) -> list:
    return [p for p in Path(path).rglob("*") if p.is_file()]


def scratch_below(root) -> list:
    """A pool root's files but its shared/ cache (a Triton task's reference, computed once per pool and kept until
    close: rewards/pool.py), which holds nothing else."""
    shared = Path(root) / "shared"
    assert all(p.name.startswith("ref-") for p in files_below(shared)), files_below(shared)
    return [p for p in files_below(root) if shared not in p.parents]


def test_a_sandbox_ends_before_its_pool_job(tmpdir_only, monkeypatch):
    """Inside a job with 6 s left a 60 s sandbox gets 6 - CLEANUP_S s, and its files are gone when it returns."""
    monkeypatch.setattr(deadline, "_DEADLINE", time.monotonic() + 6.0)
    t0 = time.monotonic()
    res = run_python(FLOOD, timeout_s=60.0)
    assert res.status == "timeout" and time.monotonic() - t0 < 6.0 - CLEANUP_S + 2.0, (res.status, res.wall_s)
    assert len(res.stdout) <= 1 << 16 and not files_below(tmpdir_only)


def tool_call(tok, name: str, **arguments) -> list:
    return tok(CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + CALL_CLOSE,
               add_special_tokens=False)["input_ids"]


def test_the_reward_pool_leaves_nothing(tmpdir_only):
    """The code reward with the trainer's default reward_timeout_s: the test's sandbox times out by itself."""
    pool = RewardPool(Config.reward_workers, Config.reward_timeout_s)
    try:
        row = {"task": "code", "tests": {"inputs": [""], "outputs": ["x"]}}
        score, info = pool.score([(row, f"```python\n{FLOOD}\n```")])[0]
        assert (score, info.get("per_test")) == (0.0, ["timeout"]), info     # not the pool's {"reason": "timeout"}
        assert pool.starts == 1 and not files_below(pool.root), "the pool killed the worker: its files stayed"
    finally:
        pool.close()
    assert list(tmpdir_only.iterdir()) == []


def test_the_tool_pool_leaves_nothing(tmpdir_only, tool_tok):
    """The python tool (10 s of its own) in a tool pool of 6 s: the sandbox times out after 6 - CLEANUP_S s."""
    ep = Episodes(tool_tok, False, lambda row: "python", max_turns=2, max_obs_tokens=64, tool_steps=1, timeout_s=6.0,
                  workers=1)
    try:
        ids, reason = ep.result(ep.submit("python", {}, tool_call(tool_tok, "python", code=FLOOD)))
        assert reason in ("ok", "truncated") and "[timeout" in tool_tok.decode(ids), (reason, tool_tok.decode(ids))
        assert ep.pool.starts == 1 and not files_below(ep.pool.root)
    finally:
        ep.close()
    assert list(tmpdir_only.iterdir()) == []


@pytest.mark.slow
def test_the_tool_pool_with_default_limits_leaves_nothing(tmpdir_only, tool_tok):
    """The trainer's default tool limits: the python tool and Triton refinement, whose reward allows itself 60 s in
    a pool of 30 s, both end by their own limits."""
    tools = ToolsConfig()
    task = next(t for t in load_tasks() if t["name"] == "relu")
    ep = Episodes(tool_tok, False, lambda row: None, max_turns=2, max_obs_tokens=64, tool_steps=1,
                  timeout_s=tools.timeout_s, workers=tools.workers)
    try:
        python = ep.submit("python", {}, tool_call(tool_tok, "python", code=FLOOD))
        triton = ep.submit("triton_refine", task, tool_call(tool_tok, "test_kernel", code=TRITON_FLOOD))
        ids, reason = ep.result(python)
        assert reason in ("ok", "truncated") and "[timeout" in tool_tok.decode(ids), reason
        ids, reason = ep.result(triton)
        assert reason == "ok" and "failed: timeout" in tool_tok.decode(ids), (reason, tool_tok.decode(ids))
        assert ep.pool.starts == tools.workers and not scratch_below(ep.pool.root)
    finally:
        ep.close()
    assert list(tmpdir_only.iterdir()) == []

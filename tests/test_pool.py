"""rewards/pool.py: a job's wall limit counts the job alone, never a worker's start-up (importing the job's module,
the row's reward module), on a fresh pool and after every replaced worker; a worker that never gets ready is a start
failure of its own (the job goes to another worker, not scored 0); a killed worker's files go with it; spawned
workers do not import the parent's main module (torch, vLLM, the trainer)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.pool import RewardPool, WorkerStartError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def slow_import(monkeypatch):
    """Job modules take 4 s to import in a worker: longer than the 2.5 s wall limit of the tests."""
    monkeypatch.setenv("SLOW_IMPORT_S", "4")


def test_start_up_is_not_the_jobs_time(slow_import):
    from slow_import_jobs import job
    pool = RewardPool(workers=1, timeout_s=2.5, fn=job)
    try:
        first = pool.score([("quick",)])[0]
        assert first[1]["reason"] == "ok", f"the first quick job on a fresh pool: {first}"
        assert 0 < first[1]["time_left"] <= 2.5, first  # the job saw the pool's limit (time_left)
        out = pool.score([("hang",), ("quick",), ("quick",)])
        assert [i["reason"] for _, i in out] == ["timeout", "ok", "ok"], out  # the replacement imports for 4 s too
    finally:
        pool.close()


def test_start_up_is_not_the_tools_time(slow_import, tool_tok):
    import rollout.environments as E
    from slow_import_jobs import tool
    ep = E.Episodes(tool_tok, False, lambda row: "t", max_turns=2, max_obs_tokens=32, tool_steps=1, timeout_s=2.5,
                    workers=1, tool_fn=tool)
    ids = lambda text: tool_tok(E.CALL_OPEN + text + E.CALL_CLOSE, add_special_tokens=False)["input_ids"]  # noqa
    try:
        reasons = [ep.result(ep.submit("t", {}, ids(x)))[1] for x in ("ping", "hang", "ping", "ping")]
        assert reasons == ["ok", "timeout", "ok", "ok"], reasons
    finally:
        ep.close()


def test_a_worker_that_never_gets_ready_is_not_a_score(tmp_path):
    """The first worker hangs while preparing its job (startup_s 3 s): it is replaced and the job scores on the next
    one; workers that can never start raise WorkerStartError naming the function instead of scoring 0 forever."""
    from slow_import_jobs import hang_once, job
    pool = RewardPool(workers=1, timeout_s=2.5, fn=job, prepare=hang_once, startup_s=3.0)
    try:
        out = pool.score([("quick", str(tmp_path / "marker"))])
        assert out[0][1]["reason"] == "ok", out
    finally:
        pool.close()
    with pytest.raises(WorkerStartError, match="slow_import_jobs.job"):
        pool = RewardPool(workers=1, timeout_s=2.5, fn=job, prepare=hang_once, startup_s=1.0)
        pool.score([("quick",)])  # no marker: every worker hangs preparing


def test_killed_workers_leave_no_files(tmp_path, monkeypatch):
    """A job that writes 60 MB of temporary files and hangs is killed at its limit: its files go with the worker;
    close() removes the pool's root; a new pool removes the root a SIGKILLed pool left."""
    from slow_import_jobs import job
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    stale = tmp_path / "rlpool-999999999-abc"  # no process has this pid
    (stale / "w1").mkdir(parents=True)
    pool = RewardPool(workers=1, timeout_s=2.0, fn=job)
    try:
        assert not stale.exists(), "the stale root of a dead pool was not swept"
        assert pool.score([("litter", 60)])[0][1]["reason"] == "timeout"
        left = [p for p in Path(pool.root).rglob("*") if p.is_file()]
        assert not left, f"a killed worker's files stayed: {left}"
    finally:
        pool.close()
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_workers_do_not_import_the_main_module(tmp_path):
    """A script whose own import is heavy (it stands in for trainer.py: it imports torch) starts a pool: the worker
    does not run the script again (its marker is written once) and has not imported torch, vLLM or the trainer."""
    script = tmp_path / "main_script.py"
    marker = tmp_path / "imports.txt"
    script.write_text(f"""
import json, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
open({str(marker)!r}, "a").write("imported\\n")
import torch
from rewards.pool import RewardPool
from slow_import_jobs import job
if __name__ == "__main__":
    pool = RewardPool(workers=1, timeout_s=30, fn=job)
    print(json.dumps(pool.score([("modules",)])[0]))
    pool.close()
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    score, info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["modules"] == [], f"the worker imported {info['modules']}"
    assert marker.read_text() == "imported\n", "the worker imported the main script again"


@pytest.mark.parametrize("visible, want", [(None, "1"), ("3,5", "5"), ("GPU-a,GPU-b", "GPU-b")])
def test_workers_see_their_ranks_gpu(monkeypatch, visible, want):
    """Rank LOCAL_RANK 1's workers see its GPU alone, as cuda:0 (LOCAL_RANK 0 there, so a sandbox they start picks
    the same device), whatever CUDA_VISIBLE_DEVICES the user set."""
    from slow_import_jobs import job
    monkeypatch.setenv("LOCAL_RANK", "1")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    pool = RewardPool(workers=1, timeout_s=30, fn=job)
    try:
        assert pool.score([("env",)])[0][1]["env"] == [want, "0"]
    finally:
        pool.close()

"""Issue 52: one verdict on every device, and a reward that could not look is never a silent 0.

On a GPU node the checked run (Triton's interpreter with a GPU's semantics: rewards/triton/gpu.py) decides, and a
kernel it accepts also runs natively (kernel.execute). Here the GPU branch is forced (`gpu_branch`: kernel._device
says "cuda") with the native run played by the plain interpreter (kernel._NATIVE without the checks, which is what a
native launch has): every attack of the corpora must still score 0 with its CPU reason, every honest kernel 1.0.
Also: a sandbox whose CUDA does not start is harness_error (tasks.NOT_SCORED), the reference runs before a pool job's
clock once per pool, the preflight, and the GPU sandbox's environment (MIG, loader variables, MPS and
EXCLUSIVE_PROCESS).
"""
import os
import stat

import pytest

from data.triton_tasks import load_tasks
from rewards import sandbox
from rewards.pool import RewardPool
from rewards.sandbox import bwrap_problem, running_sandboxes
from rewards.triton import kernel
from rewards.triton.kernel import execute, triton_reward
from tasks import NOT_SCORED
from triton_corpus import attacks, gpu_rules, honest, round6, schedules

TASKS = {t["name"]: t for t in load_tasks()}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")
STAND_IN = {"device": "cpu", "checked": False, "time": False}     # the native run, played by the plain interpreter


@pytest.fixture
def gpu_branch(monkeypatch):
    monkeypatch.setattr(kernel, "_device", lambda: "cuda")
    monkeypatch.setattr(kernel, "_NATIVE", STAND_IN)


def _corpora() -> list:
    """(id, task, code, expected reason, run): every attack of the corpora with the reason it scores on CPU, and
    every honest kernel (reason ok); run: triton_reward, or execute for attacks that bypass the linter."""
    from test_triton_reward import ADVERSARIAL
    out = [(c[0], c[1], c[2], c[3], "reward") for c in ADVERSARIAL]
    out += [(a.id, a.task, a.code, a.reason, a.mode) for a in attacks.ATTACKS + gpu_rules.ATTACKS]
    for cid, task, attack, reason, twin in schedules.CASES + round6.CASES:
        out += [(cid, task, attack, reason, "reward"), (cid + "/honest", task, twin, "ok", "reward")]
    out += [(h[0], h[1], h[2], "ok", "reward") for h in honest.HONEST + gpu_rules.HONEST + schedules.HONEST]
    return out


CORPORA = _corpora()
QUICK = ("kernel_defined_never_launched", "max_over_garbage", "max_over_garbage/honest", "load_then_store",
         "atomic_add_from_every_program", "tutorial_grid_lambda_launcher")


@needs_bwrap
@pytest.mark.parametrize("cid, task, code, reason, mode", [c if c[0] in QUICK else pytest.param(
    *c, marks=pytest.mark.slow) for c in CORPORA], ids=[c[0] for c in CORPORA])
def test_the_gpu_branch_keeps_every_verdict(gpu_branch, cid, task, code, reason, mode):
    score, info = (triton_reward if mode == "reward" else execute)(code, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (float(reason == "ok"), reason), info
    assert running_sandboxes(wait_s=10) == []


def test_execute_on_a_gpu_node_says_which_run_failed(monkeypatch):
    """Pure logic (fake runs): the native run only after the checked run accepted; its failure is native_<reason>,
    a reason that says the reward did not look stays as it is; the native speedup is reported."""
    calls = []

    def fake_run(verdicts):
        def run(code, task, job, timeout_s):
            calls.append(job["checked"])
            return verdicts[job["checked"]]
        return run
    ok = (1.0, {"reason": "ok", "not_enforced": ["a"]})
    monkeypatch.setattr(kernel, "_device", lambda: "cuda")
    for native, expected in [((0.0, {"reason": "wrong_output", "not_enforced": []}), (0.0, "native_wrong_output")),
                             ((0.0, {"reason": "timeout", "not_enforced": []}), (0.0, "native_timeout")),
                             ((0.0, {"reason": "harness_error", "not_enforced": []}), (0.0, "harness_error")),
                             ((1.0, {"reason": "ok", "speedup": 2.5, "not_enforced": ["b"]}), (1.0, "ok"))]:
        monkeypatch.setattr(kernel, "_run", fake_run({True: ok, False: native}))
        score, info = execute("code", {"reference_code": ""})
        assert (score, info["reason"]) == expected, info
    assert info["speedup"] == 2.5 and info["not_enforced"] == ["a", "b"]
    calls.clear()
    monkeypatch.setattr(kernel, "_run", fake_run({True: (0.0, {"reason": "race"}), False: ok}))
    assert execute("code", {"reference_code": ""})[1]["reason"] == "race" and calls == [True]
    monkeypatch.setattr(kernel, "_device", lambda: "cpu")
    monkeypatch.setattr(kernel, "_run", fake_run({True: ok, False: (0.0, {"reason": "wrong_output"})}))
    calls.clear()
    assert execute("code", {"reference_code": ""})[0] == 1.0 and calls == [True]


@needs_bwrap
def test_a_sandbox_without_cuda_is_a_harness_error(monkeypatch):
    """The native job on this CPU-only machine: the harness cannot start CUDA, before the candidate's text is read,
    and says so with its own exit code: harness_error, a reason the trainer counts as a failure, not a score."""
    entry, problem = kernel._reference(TASKS["relu"]["reference_code"], "cpu")
    assert problem is None
    monkeypatch.setattr(kernel, "_reference", lambda code, device: (entry, None))
    score, info = kernel._run(TASKS["relu"]["solution"], TASKS["relu"], {"device": "cuda", "checked": False,
                                                                        "time": False}, 60)
    assert (score, info["reason"]) == (0.0, "harness_error") and "CUDA did not start" in info["detail"], info
    assert "harness_error" in NOT_SCORED and "reference_error" in NOT_SCORED


@needs_bwrap
def test_the_reference_runs_before_the_jobs_clock_once_per_pool(tmp_path):
    """A reference that takes 4 s (trusted task code) and a pool limit of 8 s: with the reference inside the job,
    4 s + the candidate's run would not fit the 5 s the candidate's sandbox gets; prepared before the clock it does.
    Two workers, four samples: one reference file in the pool's shared directory."""
    task = {**TASKS["relu"], "task": "triton"}
    task["reference_code"] = "import time\ntime.sleep(4)\n" + task["reference_code"]
    pool = RewardPool(workers=2, timeout_s=8)
    try:
        results = pool.score([(task, f"```python\n{task['solution']}```")] * 4)
        shared = os.listdir(os.path.join(pool.root, "shared"))
    finally:
        pool.close()
    assert [r[1]["reason"] for r in results] == ["ok"] * 4, results
    refs = [n for n in shared if n.endswith(".pt")]
    assert len(refs) == 1 and refs[0].startswith("ref-cpu-"), shared


@needs_bwrap
def test_the_preflight_scores_a_shipped_solution_and_names_what_failed(monkeypatch):
    pool = RewardPool(workers=1, timeout_s=30)
    try:
        assert kernel.preflight(pool.score) is None
    finally:
        pool.close()
    fail = lambda jobs: [(0.0, {"reason": "reference_error", "detail": "timeout: the reference took too long"})]
    problem = kernel.preflight(fail)
    assert "relu" in problem and "reference_error" in problem and "took too long" in problem
    monkeypatch.setattr(kernel, "_device", lambda: "cuda")
    monkeypatch.setattr(sandbox, "gpu_problem", lambda: "an NVIDIA MPS server runs")
    assert kernel.preflight(fail) == "an NVIDIA MPS server runs"


def test_gpu_sandboxes_get_the_loader_variables_and_their_directories(tmp_path, monkeypatch):
    lib, outside = tmp_path / "conda" / "lib", tmp_path / "repo"
    lib.mkdir(parents=True)
    (outside / "sub").mkdir(parents=True)
    (lib / "libcuda.so.1").write_bytes(b"")
    monkeypatch.chdir(outside)
    env = {"LD_LIBRARY_PATH": f"{lib}:{outside / 'sub'}:/nonexistent:{tmp_path}", "TRITON_LIBCUDA_PATH":
           str(lib / "libcuda.so.1"), "CUDA_HOME": "/usr/local/cuda", "LOCAL_RANK": "1", "PATH": "/usr/bin"}
    # the repository (cwd), what is inside it and its ancestors are never bound; a file names its directory
    assert sandbox._gpu_dirs(env) == [str(lib)] + ([os.path.realpath("/usr/local/cuda")] if os.path.isdir(
        "/usr/local/cuda") else [])
    passed = sandbox._passed_gpu_env(env)
    assert passed["LD_LIBRARY_PATH"] == env["LD_LIBRARY_PATH"] and passed["CUDA_VISIBLE_DEVICES"] == "1"
    assert "PATH" not in passed and passed["TRITON_LIBCUDA_PATH"] == env["TRITON_LIBCUDA_PATH"]
    assert "/dev/nvidia-caps" in sandbox._GPU_PATHS
    monkeypatch.setattr(sandbox, "_gpu_dirs", lambda: [str(lib)])
    argv = sandbox._bwrap_argv(str(tmp_path), (), (), True, 64, 64)
    assert any(argv[i:i + 3] == ["--ro-bind", str(lib), str(lib)] for i in range(len(argv)))


def test_gpu_modes_the_sandboxes_cannot_share_are_refused(tmp_path):
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").write_bytes(b"")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "PATH": str(smi.parent)}
    assert "MPS" in sandbox.gpu_problem(env)
    (pipe / "control").unlink()
    for mode, refused in (("Exclusive_Process", True), ("Default", False)):
        smi.write_text(f"#!/bin/sh\necho {mode}\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        problem = sandbox.gpu_problem(env)
        assert (problem is not None and "EXCLUSIVE_PROCESS" in problem) == refused, problem
    assert sandbox.gpu_problem({"PATH": str(tmp_path / "none")}) is None     # no nvidia-smi: nothing to read


def test_the_checked_run_is_the_same_on_every_device():
    """The verdict's job never depends on the device: on a GPU node it is the CPU interpreter with the checks."""
    assert kernel._CHECKED == {"device": "cpu", "checked": True, "time": False}
    assert kernel._NATIVE == {"device": "cuda", "checked": False, "time": True}
    assert kernel.NATIVE_TIMEOUT_S < 60


def test_two_pools_never_share_references():
    a, b = RewardPool(workers=1), RewardPool(workers=1)
    try:
        assert os.path.isdir(os.path.join(a.root, "shared")) and a.root != b.root
    finally:
        a.close()
        b.close()

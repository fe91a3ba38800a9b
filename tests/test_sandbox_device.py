"""The Triton reward's GPU sandbox sees exactly its rank's device: on 8 GPUs every rank's candidates used to run on
GPU 0 (torchrun sets LOCAL_RANK, not CUDA_VISIBLE_DEVICES, and the sandbox's "cuda" is its first visible device).
On CPU: a faked device map (LOCAL_RANK, the user's CUDA_VISIBLE_DEVICES), the real sandbox (gpu=True) and the
Triton reward's call into it."""
import json

import pytest

from rewards import sandbox
from rewards.triton import kernel as triton_kernel
from rewards.sandbox import bwrap_problem, rank_gpu_env, run_python

BOTH = [pytest.param(True, marks=pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")), False]
# the user's CUDA_VISIBLE_DEVICES (None: unset) -> what ranks 0..3 of a node must see in their sandbox
MAPS = {None: ["0", "1", "2", "3"], "4,5,6,7": ["4", "5", "6", "7"], "3, 1,0,2": ["3", "1", "0", "2"],
        "GPU-aa,GPU-bb,GPU-cc,GPU-dd": ["GPU-aa", "GPU-bb", "GPU-cc", "GPU-dd"]}
SEEN = "import os, json; print(json.dumps({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')}))"


@pytest.mark.parametrize("visible", MAPS, ids=str)
def test_rank_gpu_env_is_the_ranks_physical_device(visible):
    for rank, want in enumerate(MAPS[visible]):
        env = {"LOCAL_RANK": str(rank), **({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})}
        assert rank_gpu_env(env) == {"CUDA_VISIBLE_DEVICES": want}, (visible, rank)
    assert rank_gpu_env({"LOCAL_RANK": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == {
        "CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize("use_bwrap", BOTH)
def test_each_ranks_gpu_sandbox_sees_its_own_device(monkeypatch, use_bwrap):
    """The real sandbox with gpu=True, as ranks 0..3 under torchrun (no CUDA_VISIBLE_DEVICES) and under a user's
    CUDA_VISIBLE_DEVICES=4,5,6,7 with PCI bus order; a CPU sandbox gets no device variables."""
    for visible in (None, "4,5,6,7"):
        for rank, want in enumerate(MAPS[visible]):
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            if visible is None:
                monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
                monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
            else:
                monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
                monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            res = run_python(SEEN, gpu=True, use_bwrap=use_bwrap)
            assert res.status == "ok", res
            assert json.loads(res.stdout) == {"CUDA_VISIBLE_DEVICES": want,
                                              "CUDA_DEVICE_ORDER": None if visible is None else "PCI_BUS_ID"}
    res = run_python(SEEN, use_bwrap=use_bwrap)
    assert json.loads(res.stdout) == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}


def test_triton_reward_runs_cuda_jobs_in_a_gpu_sandbox_without_overriding_the_device(monkeypatch):
    """The Triton reward's CUDA job asks run_python for a GPU sandbox and passes no CUDA_VISIBLE_DEVICES of its own
    (which would replace the rank's device with the user's whole list)."""
    seen = {}

    def fake_run_python(script, files, **kw):
        seen.update(kw)
        return sandbox.SandboxResult(status="ok", returncode=0, signal=None, stdout="", stderr="", wall_s=0.0)
    monkeypatch.setattr(triton_kernel, "run_python", fake_run_python)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    triton_kernel._sandbox({}, {"role": "reference", "device": "cuda"}, 10, "ref.pt")
    assert seen["gpu"] and "CUDA_VISIBLE_DEVICES" not in seen["env"], seen

"""CUDA behaviour that decides correctness, emulated on CPU (tests/gpu_semantics.py): a level-2 sleep discards the
engine's weights, so every rollout after one needs a push, whatever the policy version says: after evaluation,
after a skipped (non-finite) update, after a resume, with partial trajectories carried in the CoPRIS buffer."""
import json
import math
import subprocess
import sys

import pytest

from helpers import ENV, ROOT, metrics, rl_args


def emulated(tiny, run_dir, sleep: bool, *extra) -> subprocess.CompletedProcess:
    """The tiny RL job with evaluation before every step, update 2 non-finite, the engine's sleep emulated or not."""
    env = {**ENV, "NONFINITE_STEPS": "2", **({"GPU_SLEEP": "1"} if sleep else {})}
    cmd = [sys.executable, "tests/gpu_semantics.py", *rl_args(
        tiny, run_dir, f"--eval_data={tiny / 'data' / 'eval.jsonl'}", "--eval_every=1", "--eval_samples=1", *extra)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_rollouts_after_a_level2_sleep_sample_pushed_weights(tiny, tmp_path):
    """eval -> step (every step), skipped update 2 -> step 3, stop after step 2 and resume: with weights discarded
    at every sleep, the metrics equal those of a run whose engine keeps its weights."""
    want = emulated(tiny, tmp_path / "ref", False)
    assert want.returncode == 0, want.stderr[-3000:]
    ref = metrics(tmp_path / "ref")
    assert math.isnan(ref[2]["grad_norm"]) and not math.isnan(ref[3]["grad_norm"]), "no planted skipped update"
    first = emulated(tiny, tmp_path / "gpu", True, "--steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    second = emulated(tiny, tmp_path / "gpu", True, "--resume=auto")
    assert second.returncode == 0, second.stderr[-3000:]
    got = metrics(tmp_path / "gpu")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    for w, g in zip(ref, got):  # as json: nan == nan there
        assert json.dumps(g, sort_keys=True) == json.dumps(w, sort_keys=True), f"step {w['step']}: " + str(
            {k: (w[k], g.get(k)) for k in w if json.dumps(g.get(k)) != json.dumps(w[k])})


def test_a_level2_sleep_makes_the_next_wake_push():
    """Unit level: RolloutEngine.sleep at level 2 marks the weights gone (on every device), and the trainer then
    pushes although the engine's version equals the policy's; a level-1 sleep (LoRA) keeps them."""
    import torch
    import trainer
    from rollout.vllm_engine import RolloutEngine

    class Engine:  # the state RolloutEngine.sleep / wake read, on a machine without CUDA
        on_cuda, sleeping, holds_weights = False, False, True

        def __init__(self, level):
            self.sleep_level = level

        def wake(self):
            pass
    pushed = []
    run = trainer.Run(trainer.Config(), 0, 1, torch.device("cpu"), None, None,
                      push=lambda policy, engine, dtype: pushed.append(engine) or 1)
    for level, want in ((2, 1), (1, 0)):
        run.engine, pushed[:] = Engine(level), []
        RolloutEngine.sleep(run.engine)
        assert run.engine.holds_weights == (level == 1)
        assert trainer.push_weights_if_stale(run) == want and len(pushed) == want, f"level {level}"


def test_memory_is_reported_per_phase(monkeypatch):
    """gpu_mem/*: the rollout's peak, what stays allocated while the engine sleeps, the training phase's own peak;
    each peak counts only its phase (a run-long maximum would report the engine's pool as the update's)."""
    import torch
    import report
    state = {"alloc": 0, "peak": 0, "resets": 0}

    def alloc(n):  # the allocator: n bytes now, the peak follows
        state["alloc"] = n
        state["peak"] = max(state["peak"], n)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: state.update(peak=state["alloc"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: state["peak"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: state["alloc"])
    alloc(100 * 2**30), alloc(2 * 2**30)  # an earlier step's high water mark
    mem = report.MemoryPeaks(torch.device("cuda", 0))
    alloc(60 * 2**30), alloc(50 * 2**30)  # rollout: weights + KV cache
    mem.peak("rollout_peak")
    alloc(3 * 2**30)  # the engine sleeps
    mem.now("asleep")
    alloc(20 * 2**30), alloc(4 * 2**30)  # the update
    mem.peak("train_peak")
    assert mem.metrics == {"gpu_mem/rollout_peak_gb": 60.0, "gpu_mem/asleep_gb": 3.0, "gpu_mem/train_peak_gb": 20.0}
    assert report.MemoryPeaks(torch.device("cpu")).metrics == {}

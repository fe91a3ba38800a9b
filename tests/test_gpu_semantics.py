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
        on_cuda, asleep, holds_weights = False, set(), True

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
    # the device (141 GiB): what is mapped now; while asleep vLLM's 40 GiB pool is unmapped but torch still counts it
    device = {"used": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: ((141 - device["used"]) * 2**30, 141 * 2**30))
    alloc(100 * 2**30), alloc(2 * 2**30)  # an earlier step's high water mark
    mem = report.MemoryPeaks(torch.device("cuda", 0))
    alloc(60 * 2**30), alloc(50 * 2**30)  # rollout: weights + KV cache (40 GiB of it vLLM's pool)
    device["used"] = 50
    mem.peak("rollout_peak")
    alloc(43 * 2**30)  # the engine sleeps: its pool unmapped, its tensors still counted by torch
    device["used"] = 3
    mem.now("asleep")
    alloc(60 * 2**30), alloc(44 * 2**30)  # the update: 17 GiB of its own at the peak, 1 GiB after
    device["used"] = 4
    mem.peak("train_peak")
    assert mem.metrics == {"gpu_mem/rollout_peak_gb": 60.0, "gpu_mem/rollout_peak_device_gb": 50.0,
                           "gpu_mem/asleep_gb": 43.0, "gpu_mem/asleep_device_gb": 3.0,
                           "gpu_mem/train_peak_gb": 60.0, "gpu_mem/train_peak_device_gb": 4.0}
    assert report.MemoryPeaks(torch.device("cpu")).metrics == {}


def test_push_maps_the_weights_then_pushes_then_the_kv_cache():
    """After a CUDA sleep, push_weights wakes the weights alone, loads the pushed tensors (consumed inside the reload),
    rebuilds a tied head, and only then maps the KV cache and drops the prefix cache (vLLM's wake_up(tags=...)): the
    push's temporaries use the room the KV cache takes once awake. A plain wake (LoRA, evaluation) maps the rest."""
    from rollout.vllm_engine import RolloutEngine, refresh_tied_head, reload_listing_unloaded
    calls = []

    class LLM:  # the vllm.LLM calls the engine makes, recorded
        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags=None):
            calls.append(("wake_up", tuple(tags)))

        def collective_rpc(self, method, args=(), kwargs=None):
            if method is reload_listing_unloaded:  # the first push: the reload, listing what it left without a value
                calls.append(("reload", [n for n, _ in args[0]]))
                return [[]]
            if kwargs:
                calls.append(("reload", [n for n, _ in kwargs["weights_iterator"]]))
            else:
                calls.append(("rpc", method))

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))
    engine = object.__new__(RolloutEngine)
    engine.llm, engine.on_cuda, engine.sleep_level, engine.asleep, engine.holds_weights = LLM(), True, 2, set(), True
    engine.push_checked = False
    for names in (["a", "b"], ["a", "b", "c"]):  # the first push (checked), then a later one
        calls.clear()
        engine.sleep()
        engine.push_weights(iter([(n, 1) for n in names]))
        assert calls == [("sleep", 2), ("wake_up", ("weights",)), ("reload", names), ("rpc", refresh_tied_head),
                         ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)], calls
        assert engine.holds_weights and not engine.asleep and engine.push_checked
    calls.clear()
    engine.sleep()
    engine.wake()
    assert calls == [("sleep", 2), ("wake_up", ("weights", "kv_cache"))], calls


def test_push_gathers_each_weight_in_the_push_dtype(world_of_one, tiny, monkeypatch):
    """full_named_tensors(model, bf16) casts each FSDP2 shard before the gather: every full tensor is built in bf16
    (gathering in fp32 and casting after would hold both copies of a 152k x 5120 embedding: 3.1 + 1.6 GB)."""
    import torch
    from torch.distributed.tensor import DTensor
    import model
    policy = model.build_model(str(tiny / "model"), torch.device("cpu"), trainable=True, shard=True)
    gathered, real = [], DTensor.full_tensor
    monkeypatch.setattr(DTensor, "full_tensor", lambda self, **kw: gathered.append(self.dtype) or real(self, **kw))
    out = dict(model.full_named_tensors(policy, torch.bfloat16))
    assert gathered and set(gathered) == {torch.bfloat16}, set(gathered)
    assert {t.dtype for t in out.values()} == {torch.bfloat16} and len(out) == len(gathered)


def test_no_grad_forwards_leave_the_root_sharded(world_of_one, tiny):
    """FSDP2 keeps the root module's parameters (embedding, head) unsharded after a forward, for the backward; a
    no-grad forward (old log-probs, the frozen reference, the PRM's rewards) has none, so the packed forward reshards
    them: 2-3 GB per rank on a 7B+ model otherwise. A gradient forward keeps them for its backward."""
    import torch
    from torch.distributed.tensor import DTensor
    import model
    ref = model.build_model(str(tiny / "model"), torch.device("cpu"), trainable=False, shard=True)
    rows = [model.Row([5, 6, 7], [8, 9])]
    with torch.no_grad():
        model.response_logprobs(ref, rows, torch.device("cpu"), 1.0)
    assert isinstance(ref.model.embed_tokens.weight, DTensor), "the root stayed unsharded after a no-grad forward"
    policy = model.build_model(str(tiny / "model"), torch.device("cpu"), trainable=True, shard=True)
    logp = model.response_logprobs(policy, rows, torch.device("cpu"), 1.0)[0]
    assert not isinstance(policy.model.embed_tokens.weight, DTensor), "a gradient forward's root was resharded"
    logp.sum().backward()


def test_engine_group_collectives_wait_dist_timeout_s(monkeypatch):
    """The engine groups' subgroups get the run's dist_timeout_s (NCCL's default would stop them after 10 min)."""
    import datetime
    import torch.distributed as dist
    import model
    seen = []
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "new_subgroups", lambda **kw: seen.append(kw) or ("pg", None))
    eg = model.engine_group(2, timeout_s=7200.0)
    assert (eg.index, eg.count, eg.member, eg.pg) == (0, 2, 1, "pg")
    assert seen == [{"group_size": 2, "timeout": datetime.timedelta(seconds=7200)}], seen

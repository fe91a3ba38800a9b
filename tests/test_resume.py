"""Crash safety: a run killed with SIGKILL at a fixed step (partial trajectories in the CoPRIS buffer) and resumed
with --resume=auto writes exactly the uninterrupted run's per-step metrics: GRPO on 2 ranks, PRIME (its PRM and
PRM optimizer are part of the checkpoint), PPO with a critic (its value model, head and optimizers too), LoRA, a
tensor-parallel engine, and SFT. Half-written checkpoints are ignored."""
import json
import shutil
import signal

import pytest
import torch

from helpers import kill_tree, metrics, rl_args, run, start, trainer_cmd, wait_for
from launch import complete_checkpoints

KILL_AT = 2  # a checkpoint every step; newer ones are deleted after the kill, so the resume starts here


def kill_and_resume(cmd_for, run_dir, steps_key="step"):
    """Start cmd_for(run_dir), SIGKILL its whole tree once checkpoint KILL_AT is complete, drop newer checkpoints,
    resume; -> the resumed run's stdout. Every checkpoint is kept (keep_checkpoints), so a run that outpaces the
    polling cannot delete the one waited for; the kill must land before the run ends."""
    keep = ["--keep_checkpoints=100"]
    proc = start(cmd_for(keep))
    wait_for(run_dir / "checkpoints" / f"step_{KILL_AT:06d}" / "manifest.json", proc)
    kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL, f"the run ended (rc {proc.returncode}) before the kill: nothing tested"
    for ckpt in complete_checkpoints(run_dir / "checkpoints"):
        if int(ckpt.name[5:]) > KILL_AT:
            shutil.rmtree(ckpt)
    p = run(cmd_for([*keep, "--resume=auto"]))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"(step {KILL_AT})" in p.stdout, p.stdout[-2000:]
    return p.stdout


@pytest.mark.slow  # ~100 s; make test's quick loop checks every piece of resumed state in-process (test_wiring.py)
@pytest.mark.parametrize("name, nproc, extra", [
    ("grpo-2ranks", 2, []),
    pytest.param("prime-1rank", 1, ["--prime.enabled=true", "--prime.filter_low=0", "--prime.filter_high=1",
                                    "--prime.lr=1e-3"], marks=pytest.mark.slow),
    # advantage: gae on 2 ranks, one critic-only warm-up step: the critic's FSDP2 body, head, AdamW states and step
    pytest.param("gae-2ranks", 2, ["--advantage=gae", "--critic.warmup_steps=1", "--critic.lr=1e-3"],
                 marks=pytest.mark.slow),
    # LoRA with adapter dropout (the RNG state matters) and k3 KL to the base (the adapter disabled)
    pytest.param("lora-1rank", 1, ["--lora.rank=8", "--lora.dropout=0.1", "--kl_coef=0.01"], marks=pytest.mark.slow),
    # one engine over both ranks: the group's prompt cursor and CoPRIS buffer are saved once, by its first rank
    pytest.param("grpo-2ranks-tp2", 2, ["--engine.tensor_parallel_size=2"], marks=pytest.mark.slow),
])
def test_sigkill_then_resume_matches_uninterrupted_run(tiny, tmp_path, name, nproc, extra):
    def cmd(run_dir):
        return lambda more: trainer_cmd(nproc, *rl_args(tiny, run_dir, *extra, *more))
    p = run(cmd(tmp_path / "ref")([]))
    assert p.returncode == 0, p.stderr[-3000:]
    want = metrics(tmp_path / "ref")
    assert [r["step"] for r in want] == [0, 1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 for r in want[2 if "gae" in name else 1:])  # gae: step 1 trains the critic alone
    state = torch.load(tmp_path / "ref" / "checkpoints" / "step_000004" / "rank0.pt", weights_only=False)
    assert any(not t["finish_reason"] for g in state["scheduler"]["buffer"] for t in g["samples"]), \
        "no partial trajectory in the buffer: the test would not cover resuming them"
    kill_and_resume(cmd(tmp_path / "killed"), tmp_path / "killed")
    got = metrics(tmp_path / "killed")
    for w, g in zip(want, got):  # exact: same tokens, rewards, losses, grad norms (PRIME: PRM loss too)
        assert g == w, f"{name} step {w['step']}: " + str({k: (w[k], g.get(k)) for k in w if g.get(k) != w[k]})
    assert len(got) == len(want)
    if "gae" in name:  # the critic trained: its loss moved, and the resumed steps equal the reference's (above)
        losses = [r["critic/value_loss"] for r in want[1:]]
        assert len(set(losses)) == len(losses) and "grad_norm" not in want[1], want[:2]
    if "tp2" in name:
        ckpt = complete_checkpoints(tmp_path / "ref" / "checkpoints")[-1]
        second = torch.load(ckpt / "rank1.pt", weights_only=False)
        assert "scheduler" not in second and "prompts" not in second, "rank 1 must not save the group's state again"
        assert json.loads((ckpt / "manifest.json").read_text())["tensor_parallel_size"] == 2
    if "lora" in name:  # the checkpoints hold the adapter and its optimizer state only
        from torch.distributed.checkpoint import FileSystemReader
        last = complete_checkpoints(tmp_path / "killed" / "checkpoints")[-1]
        keys = FileSystemReader(str(last / "dcp")).read_metadata().state_dict_metadata
        policy = [k for k in keys if k.startswith("policy.")]
        assert policy and all(".lora_A." in k or ".lora_B." in k for k in policy), f"non-adapter tensors: {policy[:5]}"
        assert any(k.startswith("optim.state.") for k in keys), f"no optimizer state: {list(keys)[:5]}"


@pytest.mark.slow
def test_sft_resume_matches_uninterrupted_run(tiny, tmp_path):
    def cmd(run_dir):
        return lambda more: trainer_cmd(None, "--mode=sft", f"--model_path={tiny / 'model'}",
                                        f"--train_data={tiny / 'data' / 'sft.jsonl'}", f"--run_dir={run_dir}",
                                        "--sft_epochs=0", "--steps=12", "--save_every=1", "--sft_batch_rows=16",
                                        "--lr=1e-3", "--max_prompt_len=64", "--max_response_len=96",
                                        "--token_budget=2048", *more)
    p = run(cmd(tmp_path / "ref")([]))
    assert p.returncode == 0, p.stderr[-3000:]
    kill_and_resume(cmd(tmp_path / "killed"), tmp_path / "killed")
    want, got = metrics(tmp_path / "ref"), metrics(tmp_path / "killed")
    assert [r["step"] for r in want] == list(range(13)) and got == want


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
        load_config(rl_args(tiny, tmp_path) + [f"--resume={tmp_path}"])


def test_every_run_field_is_checkpointed_or_declared_stateless():
    """A new stateful field of Run must go into state_dict() or Run.STATELESS: nothing is left out by accident."""
    import dataclasses
    from trainer import Run
    saved = {"policy", "optim", "sched", "advantages", "prompts", "scheduler", "policy_version", "counters",
             "sft_order", "sft_gen"}  # what Run.state_dict() writes (the test of each is the resume tests above)
    fields = {f.name for f in dataclasses.fields(Run)}
    assert fields == saved | set(Run.STATELESS), fields ^ (saved | set(Run.STATELESS))


def test_non_finite_updates_are_skipped_counted_then_stop():
    from trainer import Config, Run, TrainingError, make_optimizer, optimizer_step
    model = torch.nn.Linear(3, 2)
    cfg = Config(max_skipped_updates=3)
    optim, sched = make_optimizer(cfg, model, 10)
    run_ = Run(cfg, 0, 1, torch.device("cpu"), None, None, model, optim, sched)
    before = model.weight.detach().clone()
    for i in range(2):
        model(torch.ones(1, 3)).sum().mul(float("nan")).backward()
        norm, applied = optimizer_step(run_)
        assert not applied and run_.counters["skipped_updates"] == i + 1
    assert torch.equal(model.weight, before) and run_.policy_version == 0  # nothing applied
    model(torch.ones(1, 3)).sum().backward()
    assert optimizer_step(run_)[1] and run_.counters["consecutive_skips"] == 0  # a good step resets the run
    for _ in range(2):
        model(torch.ones(1, 3)).sum().mul(float("inf")).backward()
        optimizer_step(run_)
    model(torch.ones(1, 3)).sum().mul(float("nan")).backward()
    with pytest.raises(TrainingError, match="3 consecutive updates had a non-finite gradient norm"):
        optimizer_step(run_)


def test_rng_state_includes_the_gpu_generator(monkeypatch):
    """A checkpoint holds every generator a rank draws from; on CUDA that includes the device's (LoRA dropout runs
    there). CPU stand-in: torch.cuda's get/set are recorded."""
    import random
    import trainer
    saved, restored = torch.tensor([7, 7], dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((state, device)))
    cuda = torch.device("cuda", 0)
    state = trainer.rng_state(cuda)
    assert state["cuda_rng"] is saved and "cuda_rng" not in trainer.rng_state(torch.device("cpu"))
    state = trainer.rng_state(cuda)
    a, b = torch.rand(3), random.random()  # the draws that follow the saved state
    torch.rand(5), random.random()
    trainer.set_rng_state(state, cuda)
    assert torch.equal(torch.rand(3), a) and random.random() == b
    assert restored == [(saved, cuda)]

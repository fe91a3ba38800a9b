"""Trainer phases on a real FSDP2 process group (1 or 2 ranks); rank 0 writes raw values as JSON for
tests/test_trainer_phases.py. Run: torchrun --nproc_per_node W tests/trainer_worker.py MODEL_DIR OUT.json

Every check computes its expectation independently (a plain HF forward, a second call on a subset, the same
batch on another world size) and records both sides; the test compares them and names the row/token that differs.
"""
import json
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import launch
import model
import trainer
from config import CriticConfig
from rewards.advantages import prime_advantages
from rewards.critic import Critic
from rollout.copris import Trajectory


def rows_of(seed: int, n: int, vocab: int) -> list:
    """n rows with prompts of 3..8 tokens and responses of 1..12 tokens, advantages in [-1, 1] per row."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p, t = int(torch.randint(3, 9, (1,), generator=g)), int(torch.randint(1, 13, (1,), generator=g))
        r = model.Row(torch.randint(1, vocab, (p,), generator=g).tolist(), torch.randint(1, vocab, (t,), generator=g).tolist())
        r.adv = (torch.rand(1, generator=g) * 2 - 1).expand(t).clone()
        r.old_logp = torch.full((t,), float("nan"))
        rows.append(r)
    return rows


def make_run(model_dir, rank, world, device, **cfg_kw):
    cfg = trainer.Config(model_path=model_dir, token_budget=64, **cfg_kw)  # small budget: several micro-batches
    policy = model.build_model(model_dir, device, trainable=True)
    optim, sched = trainer.make_optimizer(cfg, policy, 10)
    return trainer.Run(cfg, rank, world, device, None, None, policy, optim, sched)


def main(model_dir: str, out_path: str) -> None:
    rank, world, device = model.init_distributed()
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    out = {"world": world}
    rows = rows_of(0, 8, vocab)
    mine = rows[rank::world]

    # 1. the same global batch on 1 or 2 ranks: same loss, same gradient norm (per loss_agg)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        run = make_run(model_dir, rank, world, device, loss_agg=agg, lr=0.0)
        batch = [model.Row(r.prompt_ids, r.response, r.old_logp.clone(), r.adv) for r in mine]
        s = trainer.policy_update(run, batch)
        out[f"update/{agg}"] = {"loss": s["loss"], "grad_norm": s["grad_norm"], "entropy": s["entropy"]}

    # 2. PRIME advantages of the same batch whitened over all ranks: the same per-token values at any world size
    g = torch.Generator().manual_seed(1)
    outcome = torch.randint(0, 2, (8,), generator=g).float()  # 4 groups of 2
    token_r = [torch.randn(len(r.response), generator=g) for r in rows]
    groups = [i for gi in range(rank, 4, world) for i in (2 * gi, 2 * gi + 1)]  # whole groups per rank
    R = torch.nn.utils.rnn.pad_sequence([token_r[i] for i in groups], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(token_r[i])) for i in groups], batch_first=True)
    adv = prime_advantages(outcome[groups], R, mask, 2, reduce=lambda t: model.sum_over_ranks(t, device))
    out["prime_adv"] = {str(i): adv[j, :len(token_r[i])].tolist() for j, i in enumerate(groups)}
    every = [None] * world
    dist.all_gather_object(every, out["prime_adv"])
    out["prime_adv"] = {k: v for part in every for k, v in part.items()}

    # 3. the critic (advantage: gae) on the same global batch: its advantages (whitened over every rank), value loss,
    # clip fraction, explained variance, grad norm, and its head after two optimizer steps, at any world size
    cfg = trainer.Config(model_path=model_dir, token_budget=64, advantage="gae",
                         critic=CriticConfig(lr=1e-2, ppo_epochs=2, cliprange_value=0.05, gamma=0.9, lam=0.8))
    critic, crows = Critic(cfg, device), [model.Row(r.prompt_ids, r.response) for r in mine]
    out["critic_stats"] = critic(crows, torch.tensor([0.5 * (i % 3) for i in range(rank, 8, world)]))
    every = [None] * world
    dist.all_gather_object(every, {str(i): r.adv.tolist() for i, r in zip(range(rank, 8, world), crows)})
    out["critic_adv"] = {k: v for part in every for k, v in part.items()}
    out["critic_head"] = critic.head.weight.detach()[0].tolist()

    if world == 1:
        single_rank_checks(model_dir, device, vocab, out)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def single_rank_checks(model_dir, device, vocab, out) -> None:
    rows = rows_of(2, 6, vocab)
    for i, j in ((1, 0), (2, 0), (4, 3)):  # two groups share a prompt: packed with one copy of it
        rows[i].prompt_ids = rows[j].prompt_ids
    # 3. packed log-probs and gradients == a plain HF forward of each row alone (sdpa, no padding, no FSDP)
    run = make_run(model_dir, 0, 1, device)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    logps = model.response_logprobs(run.policy, rows, device, 0.7)
    torch.stack([lp.sum() for lp in logps]).sum().backward()
    want = []
    for r in rows:
        logits = plain(input_ids=torch.tensor([r.prompt_ids + r.response])).logits[0, len(r.prompt_ids) - 1:-1]
        lp = torch.log_softmax(logits.double() / 0.7, -1).gather(1, torch.tensor(r.response)[:, None])[:, 0]
        want.append(lp)
    torch.stack([lp.sum() for lp in want]).sum().backward()
    out["packed_logp"] = [[a.tolist() for a in logps], [b.tolist() for b in want]]
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
             for n, p in run.policy.named_parameters()}
    out["packed_grad_max_diff"] = {n: float((grads[n] - p.grad).abs().max()) for n, p in plain.named_parameters()}
    out["grad_max"] = max(float(p.grad.abs().max()) for p in plain.parameters())
    run.optim.zero_grad(set_to_none=True)
    ckpt = model.build_model(model_dir, device, trainable=True, checkpoint=True)  # activation checkpointing (CUDA default)
    torch.stack([lp.sum() for lp in model.response_logprobs(ckpt, rows, device, 0.7)]).sum().backward()
    out["checkpointed_grad_max_diff"] = max(float(((p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                                                   - grads[n]).abs().max()) for n, p in ckpt.named_parameters())

    # 4. cross-stage old log-probs: stage 1 under version 0, stage 2 under version 1 (perturbed weights)
    trajs = [Trajectory(i, 0, r.prompt_ids, list(r.response), [-1.0 - 0.01 * t for t in range(len(r.response))])
             for i, r in enumerate(rows)]
    k = [max(1, len(t.tokens) // 2) for t in trajs]
    stage1 = [t.tokens[:n] for t, n in zip(trajs, k)]
    full = [t.tokens for t in trajs]
    for t, s in zip(trajs, stage1):
        t.tokens = list(s)
    trainer.fill_old_logprobs(run, trajs, [])  # stage 1 under version 0
    v0 = [list(t.old_logprobs) for t in trajs]
    with torch.no_grad():
        for p in run.policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    for t, f in zip(trajs, full):
        t.tokens = list(f)
    trainer.fill_old_logprobs(run, trajs, [])  # stage 2's tokens under version 1
    v1 = [lp.tolist() for lp in model.response_logprobs(run.policy, [model.Row(t.prompt_ids, t.tokens) for t in trajs],
                                                         device, run.cfg.temperature)]
    out["cross_stage"] = {"k": k, "stage1_v0": v0, "filled": [t.old_logprobs for t in trajs], "v1": v1}
    rollout_trajs = [Trajectory(i, 0, r.prompt_ids, list(r.response), [-0.5] * len(r.response)) for i, r in enumerate(rows)]
    trainer.old_from_rollout(run, rollout_trajs[:3], rollout_trajs[3:])
    out["rollout_source"] = [t.old_logprobs for t in rollout_trajs]

    # 5. old log-probs the update supplies (nan slots) == the policy's log-probs before that update
    run = make_run(model_dir, 0, 1, device, lr=1e-2)
    with torch.no_grad():
        before = [lp.tolist() for lp in model.response_logprobs(run.policy, rows, device, run.cfg.temperature)]
    batch = [model.Row(r.prompt_ids, r.response, torch.tensor([-9.0] * (len(r.response) // 2) +
                                                               [float("nan")] * (len(r.response) - len(r.response) // 2)),
                       r.adv) for r in rows]
    trainer.policy_update(run, batch)
    out["self_old"] = {"before": before, "after_update": [r.old_logp.tolist() for r in batch]}

    # 6. mini_batches=2 reports the mean over its two mini-batches (lr 0: the policy is the same for both)
    for agg in ("token-mean", "seq-mean-token-sum"):
        stats = {}
        for name, mb, part in (("both", 2, rows), ("first", 1, rows[:3]), ("second", 1, rows[3:])):
            run = make_run(model_dir, 0, 1, device, lr=0.0, mini_batches=mb, loss_agg=agg)
            batch = [model.Row(r.prompt_ids, r.response, r.old_logp.clone(), r.adv) for r in part]
            stats[name] = trainer.policy_update(run, batch)
        out[f"mini_batches/{agg}"] = stats


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

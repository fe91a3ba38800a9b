"""A LoRA policy next to the real CPU engine, through two CoPRIS stages with a real update and an adapter push
between them; prints raw values as one JSON line for tests/test_lora.py.
Run: python tests/lora_worker.py MODEL_DIR

Each check records both sides: the engine's log-probs and the trainer's, the base model built on its own and
the policy with its adapter disabled, parameters before and after the update."""
import json
import math
import random
import sys

import torch

import launch
import model
import trainer
from rollout.copris import CoprisScheduler, request_seed
from rollout.vllm_engine import EngineConfig, RolloutEngine

N, B, P, MAX_LEN = 2, 2, 6, 32


def forced_len(prompt_id, sample):  # long-tailed lengths, 4..MAX_LEN: some requests are aborted mid-way
    r = random.Random(request_seed(0, prompt_id, sample, -1))
    return max(4, min(MAX_LEN, int(6 * math.exp(r.gauss(0, 1.0)))))


def max_diff(a, b) -> float:
    return (torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().max().item()


def snapshot(policy) -> dict:
    return {n: t.clone() for n, t in model.full_named_tensors(policy)}


def update(run, groups) -> dict:
    """One PPO update with advantages +1 / -1 on alternate samples (old log-probs from the update's forward)."""
    rows = [model.Row(t.prompt_ids, t.tokens, torch.full((len(t.tokens),), float("nan")),
                      torch.full((len(t.tokens),), 1.0 if t.sample % 2 else -1.0)) for g in groups for t in g.samples]
    return trainer.policy_update(run, rows)


def main(model_dir):
    rank, world, device = model.init_distributed()
    cfg = trainer.Config(model_path=model_dir, lr=1e-2, token_budget=512, kl_coef=0.0,
                         lora=trainer.LoraConfig(rank=8, alpha=16.0))
    policy = model.build_model(model_dir, device, trainable=True, lora=cfg.lora)
    base = model.build_model(model_dir, device, trainable=False)
    optim, sched = trainer.make_optimizer(cfg, policy, 10)
    engine = RolloutEngine(EngineConfig(model_dir, max_model_len=128, seed=0, lora_rank=8), distributed=True)
    run = trainer.Run(cfg, rank, world, device, None, None, policy, optim, sched, ref=policy, engine=engine,
                      push=model.push_adapter)
    out = {"trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
           "params": sum(p.numel() for p in policy.parameters()),
           "optim_params": sum(p.numel() for g in optim.param_groups for p in g["params"])}
    drawn = []

    def draw():
        drawn.append(len(drawn))
        return drawn[-1], [5 + drawn[-1] % 50, 6, 7, 8], {"id": drawn[-1]}

    copris = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, forced_len=forced_len)
    g1, _ = copris.collect(engine, draw, version=0)

    before = snapshot(policy)
    out["update1"] = update(run, g1)

    rows = [model.Row(t.prompt_ids, t.tokens) for g in g1 for t in g.samples]
    with torch.no_grad():
        ref = trainer.frozen_reference(run, rows)  # the policy, adapter disabled
        plain = model.response_logprobs(base, rows, device, 1.0)
        pol = model.response_logprobs(policy, rows, device, 1.0)
    out["ref_vs_base"] = max(max_diff(a, b) for a, b in zip(ref, plain))
    out["policy_vs_base"] = max(max_diff(a, b) for a, b in zip(pol, plain))
    out["adapter_enabled_after_ref"] = all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)

    out["push1_bytes"] = trainer.push_weights_if_stale(run)
    out["lora_ids1"] = sorted(engine.engine.list_loras())
    ids = [3 + (7 * i) % 300 for i in range(40)]
    with torch.no_grad():
        (logp,) = model.response_logprobs(policy, [model.Row(ids[:5], ids[5:])], device, 1.0)
    out["prompt_parity"] = max_diff(logp, engine.prompt_logprobs(ids)[4:])

    g2, _ = copris.collect(engine, draw, version=1)  # resumed trajectories continue under the version-1 adapter
    resumed = [t for g in g2 + copris.buffer for t in g.samples if 0 in t.versions and 1 in t.versions]
    with torch.no_grad():
        v1 = model.response_logprobs(policy, [model.Row(t.prompt_ids, t.tokens) for t in resumed], device, 1.0)
        with model.adapter_disabled(policy):  # version 0 = the base (B = 0 at init)
            v0 = model.response_logprobs(policy, [model.Row(t.prompt_ids, t.tokens) for t in resumed], device, 1.0)
    out["resumed"] = [{"prompt_id": t.prompt_id, "sample": t.sample, "versions": t.versions, "logprobs": t.logprobs,
                       "v0": a.tolist(), "v1": b.tolist()} for t, a, b in zip(resumed, v0, v1)]

    out["update2"] = update(run, g2)
    after = snapshot(policy)  # update 1 moves only B (B = 0 makes A's gradient 0); update 2 moves A too
    frozen = [n for n, p in policy.named_parameters() if not p.requires_grad]
    out["frozen_changed"] = [n for n in frozen if not torch.equal(before[n], after[n])]
    out["adapter_unchanged"] = [n for n in before if n not in frozen and torch.equal(before[n], after[n])]
    out["n_frozen"], out["n_adapter"] = len(frozen), len(before) - len(frozen)
    out["push2_bytes"] = trainer.push_weights_if_stale(run)
    out["lora_ids2"] = sorted(engine.engine.list_loras())
    with torch.no_grad():
        (logp,) = model.response_logprobs(policy, [model.Row(ids[:5], ids[5:])], device, 1.0)
    out["prompt_parity2"] = max_diff(logp, engine.prompt_logprobs(ids)[4:])
    engine.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

"""Mismatch metrics on the real engine: sample with the engine holding the policy's weights (clean), then with
perturbed engine weights (an injected mismatch); print both steps' metrics (token_mask correction on) as JSON.
Run: python tests/mismatch_worker.py MODEL_DIR [PRECISION]: the trainer's, the engine's and the push's dtype (fp32, as
the tiny model's `precision: auto` on CPU, or bf16)."""
import json
import sys

import torch

import launch
import model
import trainer
from rollout import mismatch
from rollout.copris import Trajectory
from rollout.vllm_engine import EngineConfig, RolloutEngine


def main(model_dir, precision="fp32"):
    rank, world, device = model.init_distributed()
    cfg = trainer.Config(model_path=model_dir, token_budget=1024, precision=precision)
    policy = model.build_model(model_dir, device, trainable=False, precision=precision)
    dtype = model.compute_dtype(precision, device, policy.config.hidden_size)
    engine = RolloutEngine(EngineConfig(model_dir, max_model_len=128, seed=0,
                                        dtype=str(dtype).removeprefix("torch.")), distributed=True)
    run = trainer.Run(cfg, rank, world, device, None, None, policy, correct=mismatch.correction("token_mask", 0.8, 1.25))
    out = {}
    for name, noise in (("clean", 0.0), ("injected", 0.05)):
        g = torch.Generator().manual_seed(0)
        engine.push_weights((n, (t + noise * torch.randn(t.shape, generator=g)).to(dtype))
                            for n, t in model.full_named_tensors(policy))
        prompts = [[5 + i, 6, 7, 8] for i in range(16)]
        gens = engine.generate(prompts, [engine.sampling(24, 1.0, 1.0, 100 + i, [], ignore_eos=True) for i in range(16)])
        trajs = [Trajectory(i, 0, p, list(toks), list(lps)) for i, (p, (toks, lps)) in enumerate(zip(prompts, gens))]
        trainer.fill_old_logprobs(run, trajs, [])
        rows = [model.Row(t.prompt_ids, t.tokens, trainer.old_logprobs_of(t)) for t in trajs]
        for r, t in zip(rows, trajs):
            r.weight = run.correct(r.old_logp, torch.tensor(t.logprobs))
        out[name] = trainer.mismatch_metrics(run, rows, trajs)
    engine.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

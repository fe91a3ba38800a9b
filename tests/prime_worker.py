"""PRIME's PRM on a real 1-rank FSDP2 setup (rewards/prime.py); prints raw values for tests/test_prime.py as JSON.
Run: python tests/prime_worker.py MODEL_DIR"""
import json
import sys

import torch

import launch
import model
import trainer
from rewards.prime import Prime


def main(model_dir):
    rank, world, device = model.init_distributed()
    cfg = trainer.Config(model_path=model_dir, token_budget=512, n_samples=2)
    cfg.prime.enabled, cfg.prime.lr, cfg.prime.beta = True, 1e-2, 0.5
    ref = model.build_model(model_dir, device, trainable=False)
    prime = Prime(cfg, device, lambda batch: model.response_logprobs(ref, batch, device, 1.0))
    g = torch.Generator().manual_seed(0)
    rows = [model.Row(torch.randint(5, 300, (6,), generator=g).tolist(), torch.randint(5, 300, (n,), generator=g).tolist())
            for n in (3, 7, 5, 4)]
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0])
    out = {"after": [], "before": {}}
    for _ in range(5):  # update=after: the rewards used are those of the PRM before its step
        before_step = prime.forward(rows, outcome, train=False)[0]
        used, stats = prime.step(rows, outcome)
        out["after"].append({"loss": stats["prm_loss"], "acc": stats["prm_acc"],
                             "used": [r.tolist() for r in used], "pre_update": [r.tolist() for r in before_step]})
    prime.recompute = True  # update=before: the rewards used are those of the PRM after its step
    used, _ = prime.step(rows, outcome)
    fresh = prime.forward(rows, outcome, train=False)[0]
    out["before"] = {"used": [r.tolist() for r in used], "fresh": [r.tolist() for r in fresh]}
    stats = prime(rows, outcome)  # advantages on every row, one per response token
    out["adv"] = [r.adv.tolist() for r in rows]
    out["lengths"] = [len(r.response) for r in rows]
    out["stats_keys"] = sorted(stats)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

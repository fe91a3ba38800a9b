"""PRIME's PRM step on a real 1-rank FSDP2 setup; prints what tests/test_prime.py checks as JSON.
Run: python tests/prime_worker.py MODEL_DIR"""
import json
import sys

import torch

import trainer


def main(model_dir):
    rank, world, device = trainer.init_distributed()
    cfg = trainer.Config(model_path=model_dir, token_budget=512, n_samples=2)
    cfg.prime.enabled, cfg.prime.lr, cfg.prime.beta = True, 1e-2, 0.5
    run = trainer.Run(cfg, rank, world, device, None, None, None, None, None)
    run.ref = trainer.build_model(model_dir, device, trainable=False)
    run.prm = trainer.build_model(model_dir, device, trainable=True)
    run.prm_optim = torch.optim.AdamW(run.prm.parameters(), lr=cfg.prime.lr)
    g = torch.Generator().manual_seed(0)
    rows = [trainer.Row(torch.randint(5, 300, (6,), generator=g).tolist(), torch.randint(5, 300, (n,), generator=g).tolist())
            for n in (3, 7, 5, 4)]
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0])
    out = {"losses": [], "first_rewards_zero": None}
    r0, s0 = trainer.prime_step(run, rows, outcome)  # PRM == ref: rewards exactly 0 before any update (after mode)
    out["first_rewards_zero"] = bool(torch.all(r0 == 0))
    out["losses"].append(s0["prm_loss"])
    for _ in range(4):
        r, s = trainer.prime_step(run, rows, outcome)
        out["losses"].append(s["prm_loss"])
    out["acc"] = s["prm_acc"]
    cfg.prime.update = "before"  # update first, then recompute: rewards reflect the updated PRM
    before_loss = s["prm_loss"]
    rb, sb = trainer.prime_step(run, rows, outcome)
    seq = rb.sum(1)
    out["before_mode_loss_lower"] = float(torch.nn.functional.binary_cross_entropy_with_logits(seq, outcome)) < before_loss
    out["reward_layout_ok"] = all(float(rb[i, : rb.shape[1] - len(r.response)].abs().sum()) == 0 for i, r in enumerate(rows))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

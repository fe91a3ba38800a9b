"""PRIME (Cui et al. 2025, Eurus-2-7B-PRIME) as an advantage strategy of the RL step: an online implicit process
reward model and the advantages of the paper's Eq. 5.

    prime = Prime(cfg, device, ref_logp)      # ref_logp(rows) -> one (T_i,) reference log-prob tensor per row
    stats = prime(rows, outcome)              # sets row.adv (T_i,) for every row; -> prm_loss, prm_acc, ...
    token_r, stats = prime.step(rows, outcome)   # the PRM step alone (advantage: gae puts token_r into GAE)

The PRM starts from the same checkpoint as the policy (an FSDP2 model with its own AdamW). Token rewards
r_t = beta * (log pi_prm(y_t) - log pi_ref(y_t)) at the model's tokens, 0 at a tool's observations
(kernels.implicit_prm_rewards); PRM loss
BCE(sigmoid(sum_t r_t), outcome), one step per RL step. update=after (the paper's default): the rewards come from
the same pre-update forward as the loss; update=before: they are recomputed after the step.
Advantages: rewards.advantages.prime_advantages, whitened over the valid tokens of every rank.
"""
import functools
import math

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
import torch.nn.functional as F

from kernels import implicit_prm_rewards
from model import all_sum, build_model, clip_grad_norm, micro_batches, response_logprobs, sum_over_ranks
from rewards.advantages import prime_advantages


def model_mask(row) -> torch.Tensor:
    """(T,) 1.0 at the row's model tokens, 0.0 at observations: process rewards fall on model tokens only."""
    return torch.ones(len(row.response)) if row.mask is None else row.mask.float()


class Prime:
    """The PRM, its optimizer and the update order (module docstring); state_dict() is part of a checkpoint."""

    def __init__(self, cfg, device, ref_logp):
        self.cfg, self.p, self.device, self.ref_logp = cfg, cfg.prime, device, ref_logp
        self.recompute = self.p.update == "before"
        self.model = build_model(cfg.model_path, device, trainable=True, precision=cfg.precision)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=self.p.lr, weight_decay=0.0)

    def __call__(self, rows: list, outcome: torch.Tensor) -> dict:
        """Step the PRM, then set each row's advantages (T_i,); -> PRM and process-reward stats."""
        token_r, stats = self.step(rows, outcome)
        R = torch.nn.utils.rnn.pad_sequence(token_r, batch_first=True)  # (B, T) left-aligned
        mask = torch.nn.utils.rnn.pad_sequence([model_mask(r) for r in rows], batch_first=True)  # (B, T)
        adv = prime_advantages(outcome, R, mask, self.cfg.n_samples, self.p.gamma, self.p.outcome_coef,
                               self.p.process_coef, reduce=functools.partial(sum_over_ranks, device=self.device))
        for i, r in enumerate(rows):
            r.adv = adv[i, :len(r.response)]
        return {**stats, **self.process_stats(token_r, rows)}

    def process_stats(self, token_r: list, rows: list) -> dict:
        """Mean and (population) std of the token rewards at the model tokens of every rank's rows."""
        valid = torch.cat([r[model_mask(row) > 0] for r, row in zip(token_r, rows)])  # the model's tokens
        s1, s2, n = all_sum([float(valid.sum()), float((valid ** 2).sum()), valid.numel()], self.device)
        return {"process_reward_mean": s1 / n, "process_reward_std": math.sqrt(max(0.0, s2 / n - (s1 / n) ** 2))}

    def step(self, rows: list, outcome: torch.Tensor) -> tuple[list, dict]:
        """One PRM update; -> the token rewards the advantages use (of the PRM before the update, or after it
        with update=before), stats."""
        token_r, stats = self.forward(rows, outcome, train=True)
        stats["prm_grad_norm"] = clip_grad_norm(self.model, self.cfg.grad_clip)
        if math.isfinite(stats["prm_grad_norm"]):
            self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        if self.recompute:
            token_r, _ = self.forward(rows, outcome, train=False)
        return token_r, stats

    def forward(self, rows: list, outcome: torch.Tensor, train: bool) -> tuple[list, dict]:
        """Token rewards (one (T_i,) tensor per row) and, if train, the BCE gradient in the PRM (global mean)."""
        n_rows = all_sum([len(rows)], self.device)[0]
        token_r, loss_sum, correct = [None] * len(rows), 0.0, 0.0
        for mb in micro_batches(rows, self.cfg.token_budget, self.device):
            batch = [rows[i] for i in mb]
            with torch.no_grad():
                ref = self.ref_logp(batch)
            with torch.set_grad_enabled(train):
                prm = response_logprobs(self.model, batch, self.device, self.cfg.temperature)
                masks = [model_mask(row).to(self.device) for row in batch] or [torch.ones(1, device=self.device)]
                r = [implicit_prm_rewards(a, b, m, self.p.beta) for a, b, m in zip(prm, ref, masks)]
                if not batch:
                    (r[0].sum() * 0.0).backward() if train else None
                    continue
                seq = torch.stack([x.sum() for x in r])  # (b,) implicit sequence rewards
                y = outcome[mb].to(self.device)  # (b,)
                loss = F.binary_cross_entropy_with_logits(seq, y, reduction="sum")
                if train:
                    (loss * dist.get_world_size() / n_rows).backward()  # FSDP averages over ranks: the global mean
            loss_sum += loss.item()
            correct += ((seq > 0) == (y > 0.5)).sum().item()
            for i, x in zip(mb, r):
                token_r[i] = x.detach().cpu()
        loss_sum, correct = all_sum([loss_sum, correct], self.device)
        return token_r, {"prm_loss": loss_sum / n_rows, "prm_acc": correct / n_rows}

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])

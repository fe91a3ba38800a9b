"""Rollout-training mismatch: how far the engine's sampling log-probs are from the trainer's, and corrections.

Per response token t of sequence i: old_t = the trainer's log-prob under the policy of the stage that sampled t,
roll_t = the engine's log-prob of the same token when it sampled it, d_t = old_t - roll_t, ratio_t = exp(d_t).

    w = correction(mode, low, C)(old (T,), roll (T,))   # (T,) detached loss weights of one sequence; 0 = masked
      token_truncate    (TIS, Yao et al. 2025)            w_t = min(ratio_t, C)
      token_mask        (MIS token, IcePop)               w_t = ratio_t if low <= ratio_t <= C, else masked
      sequence_truncate (Seq-TIS)                         w_t = min(rho_i, C),  rho_i = exp(clamp(sum_t d_t, -20, 20))
      sequence_mask     (Seq-MIS, Liu et al. 2025)        w_t = rho_i if low <= rho_i <= C, else the sequence is masked
      sequence_geo_mask (geometric rejection, as verl's)  w_t = 1 if low <= g_i <= C, else masked; g_i = exp(mean_t d_t)
    rho_i is the product of the token ratios (the sequence's likelihood ratio), computed in log space: with per-token
    d ~ N(0.002, 0.05) over 2,000 tokens it is about 6, so Seq-TIS clips and Seq-MIS masks such a sequence. g_i (the
    per-token geometric mean) stays near 1 at any length: a length-neutral rejection filter, useful only with
    thresholds close to 1 (e.g. low=0.999, threshold=1.001).
    A masked token leaves the numerator and the denominator of the loss aggregation (the trainer counts only w > 0).

Metrics (tokens are sampled by the engine, so k3 estimates KL(roll || old)):
    mismatch/kl_k3 = mean_t (ratio_t - d_t - 1)      mismatch/log_ratio_abs_mean = mean_t |d_t|
    mismatch/prob_diff_max = max_t |exp(roll_t) - exp(old_t)|    mismatch/seq_ratio_p99 = 99th percentile of rho_i
    mismatch/seq_geo_ratio_p99 = 99th percentile of g_i
    correction/masked_token_frac, correction/weight_mean (over all trained tokens, masked ones counting 0)
Everything is computed in float64; d_t (and sum_t d_t) is clamped to [-20, 20] before exp, like the PPO ratio.
"""
import torch

MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence_geo_mask")


def _d(old: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    return (old.double() - roll.double()).clamp(-20, 20)  # (T,)


def seq_log_ratio(old: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    """log rho_i = clamp(sum_t d_t, -20, 20): the log of the product of one sequence's token ratios (float64)."""
    return _d(old, roll).sum().clamp(-20, 20)


def geo_ratio(old: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    """g_i = exp(mean_t d_t): the geometric mean of one sequence's token ratios (float64)."""
    return _d(old, roll).mean().exp()


def correction(mode: str, low: float, C: float):
    """-> f(old (T,), roll (T,)) -> (T,) float32 weights for one sequence, or None for mode "none"."""
    def token_truncate(old, roll):
        return _d(old, roll).exp().clamp(max=C).float()

    def token_mask(old, roll):
        r = _d(old, roll).exp()
        return torch.where((r >= low) & (r <= C), r, 0.0).float()

    def sequence_truncate(old, roll):
        rho = seq_log_ratio(old, roll).exp()
        return rho.clamp(max=C).float().expand(len(old)).clone()

    def sequence_mask(old, roll):
        rho = seq_log_ratio(old, roll).exp()
        return (rho if low <= rho <= C else rho * 0.0).float().expand(len(old)).clone()

    def sequence_geo_mask(old, roll):
        g = geo_ratio(old, roll)
        return torch.full((len(old),), 1.0 if low <= g <= C else 0.0)
    if mode not in MODES:
        raise ValueError(f"correction mode must be one of {MODES}, got {mode!r}")
    return {"none": None, "token_truncate": token_truncate, "token_mask": token_mask,
            "sequence_truncate": sequence_truncate, "sequence_mask": sequence_mask,
            "sequence_geo_mask": sequence_geo_mask}[mode]


def token_sums(old: list[torch.Tensor], roll: list[torch.Tensor], weights: list) -> dict:
    """Sums over this rank's tokens (to be summed over ranks; prob_diff_max: a max over ranks)."""
    d = torch.cat([_d(o, r) for o, r in zip(old, roll)]) if old else torch.zeros(0, dtype=torch.float64)
    p_diff = torch.cat([(r.double().exp() - o.double().exp()).abs() for o, r in zip(old, roll)]) if old else d
    w = torch.cat([torch.ones(len(o)) if x is None else x for o, x in zip(old, weights)]).double() if old else d
    return {"tokens": float(d.numel()), "k3": float((d.exp() - d - 1).sum()), "abs_d": float(d.abs().sum()),
            "prob_diff_max": float(p_diff.max()) if p_diff.numel() else 0.0, "masked": float((w == 0).sum()),
            "weight": float(w.sum())}


def sequence_ratios(old: list[torch.Tensor], roll: list[torch.Tensor]) -> list[tuple[float, float]]:
    """(rho_i, g_i) per sequence (empty sequences left out)."""
    return [(float(seq_log_ratio(o, r).exp()), float(geo_ratio(o, r))) for o, r in zip(old, roll) if len(o)]


def metrics(total: dict, seq_ratios: list[tuple[float, float]], with_correction: bool) -> dict:
    """The metric keys (module docstring) from token_sums summed over ranks and every rank's sequence ratios."""
    n = max(total["tokens"], 1.0)
    p99 = torch.tensor(seq_ratios, dtype=torch.float64).quantile(0.99, dim=0).tolist() if seq_ratios else [1.0, 1.0]
    out = {"mismatch/kl_k3": total["k3"] / n, "mismatch/log_ratio_abs_mean": total["abs_d"] / n,
           "mismatch/prob_diff_max": total["prob_diff_max"], "mismatch/seq_ratio_p99": p99[0],
           "mismatch/seq_geo_ratio_p99": p99[1]}
    if with_correction:
        out.update({"correction/masked_token_frac": total["masked"] / n, "correction/weight_mean": total["weight"] / n})
    return out

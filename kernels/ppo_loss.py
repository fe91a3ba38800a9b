"""PPO clipped policy loss over (B, T) tokens, with asymmetric clip, dual clip and optional k3 KL.

    loss, stats = ppo_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None,
                           ref_logp=None, kl_coef=0.0, agg="token-mean", impl="auto")

logp, old_logp, mask (B, T); adv (B,) or (B, T); ref_logp (B, T) or None. Per token (CoPRIS / verl):
    ratio = exp(clamp(logp - old, -20, 20))          old = log-prob under the policy that sampled the token
    l     = max(-adv * ratio, -adv * clamp(ratio, 1 - clip_low, 1 + clip_high))
    l     = min(l, -adv * dual_clip)  where adv < 0   (dual clip, dual_clip > 1, e.g. 10)
    l    += kl_coef * (exp(u) - u - 1),  u = clamp(ref - logp, -20, 20)          (k3 KL to the reference)
loss = sum(w * l) with the aggregation weights w of agg_weights(); masked tokens contribute 0 (even if nan).
Gradient w.r.t. logp only; old_logp, adv, ref_logp are constants.
stats (python floats, over valid tokens): clip_frac (tokens whose gradient a clip cut: upper/lower/dual),
approx_kl (mean of old - logp), ratio_mean, ratio_max.
"""
import torch

from kernels._common import use_triton

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
STAT_KEYS = ("clip_frac", "approx_kl", "ratio_mean", "ratio_max")


def agg_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """(B, T) fp32 weights w with loss = sum(w * l):
    token-mean          m / sum(m)
    seq-mean-token-mean m / (|rows with a valid token| * sum_t m)
    seq-mean-token-sum  m / |rows with a valid token|
    """
    m = mask.float()  # (B, T)
    if agg == "token-mean":
        return m / m.sum().clamp(min=1)
    n_tok = m.sum(-1, keepdim=True)  # (B, 1)
    n_seq = (n_tok > 0).sum().clamp(min=1)
    if agg == "seq-mean-token-mean":
        return m / (n_tok.clamp(min=1) * n_seq)
    if agg == "seq-mean-token-sum":
        return m / n_seq
    raise ValueError(f"agg must be one of {AGGS}, got {agg!r}")


def ppo_stats(ratio, clipped, logp, old_logp, mask) -> dict:
    """Python floats over valid tokens: clip_frac, approx_kl, ratio_mean, ratio_max (0 with no valid token)."""
    m = (mask > 0).float()  # (B, T)
    n = m.sum().clamp(min=1)
    ratio = ratio.detach()
    vals = torch.stack([
        (clipped.float() * m).sum() / n,
        ((old_logp - logp.detach()) * m).sum() / n,
        (ratio * m).sum() / n,
        torch.where(m > 0, ratio, 0.0).max(),
    ])
    return dict(zip(STAT_KEYS, vals.tolist()))


def _token_loss_torch(logp, old, adv, ref, clip_low, clip_high, dual_clip, kl_coef):
    """Per-token loss l (B, T), ratio (B, T), clipped (B, T) bool; autograd through logp."""
    ratio = torch.exp((logp - old).clamp(-20, 20))  # (B, T)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(pg1, pg2)  # (B, T)
    clipped = pg2 > pg1
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        dual = (adv < 0) & (pg3 < loss)
        loss = torch.where(dual, pg3, loss)
        clipped = clipped | dual
    if ref is not None and kl_coef != 0.0:
        u = (ref - logp).clamp(-20, 20)  # (B, T)
        loss = loss + kl_coef * (u.exp() - u - 1)
    return loss, ratio, clipped


def _expand_adv(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, T) -> (B, T) fp32."""
    return (adv[:, None] if adv.dim() == 1 else adv).float().expand_as(like)


def ppo_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None, ref_logp=None,
             kl_coef=0.0, agg="token-mean", impl="auto"):
    """(B, T) inputs -> (scalar loss, stats dict); see the module docstring."""
    w = agg_weights(mask, agg)  # (B, T)
    if use_triton(impl, logp):
        raise NotImplementedError("Triton path lands in the next commit")
    adv = _expand_adv(adv.detach(), logp)  # (B, T)
    ref = None if ref_logp is None else ref_logp.detach()
    tok, ratio, clipped = _token_loss_torch(logp.float(), old_logp.detach().float(), adv, ref, clip_low, clip_high,
                                            dual_clip, kl_coef)
    loss = torch.where(w > 0, w * tok, 0.0).sum()
    return loss, ppo_stats(ratio, clipped, logp, old_logp, mask)

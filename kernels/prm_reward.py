"""PRIME implicit process rewards and per-row discounted returns.

    r = implicit_prm_rewards(prm_logp, ref_logp, mask, beta, impl="auto")   # (B, T)
        r_t = beta * (prm_logp_t - ref_logp_t) * mask_t   (PRIME, beta = 0.05); differentiable w.r.t. both log-probs
    G = discounted_returns(r, mask, gamma=1.0, impl="auto")                  # (B, T)
        G_t = mask_t * sum_{s >= t} gamma^(s - t) * mask_s * r_s     (reverse discounted cumsum per row)
        masked tokens add nothing and get 0; with right padding this is the return over the valid tokens.

Both paths scan, neither loops over T in Python: the torch path is a log2(T)-step Hillis-Steele scan.
"""
import torch

from kernels._common import use_triton


def implicit_prm_rewards(prm_logp, ref_logp, mask, beta, impl="auto"):
    """(B, T) -> (B, T) fp32 beta * (prm_logp - ref_logp) * mask."""
    if use_triton(impl, prm_logp):
        raise NotImplementedError("Triton path lands in the next commit")
    return beta * (prm_logp.float() - ref_logp.float()) * mask.float()


def _discounted_returns_torch(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) -> (B, T) G_t = sum_{s >= t} gamma^(s - t) x_s by doubling strides: log2(T) steps."""
    G = x
    g, d, T = gamma, 1, x.shape[-1]
    while d < T:
        G = torch.cat([G[:, :-d] + g * G[:, d:], G[:, -d:]], dim=1)  # G_t now sums s in [t, t + 2d)
        g, d = g * g, 2 * d
    return G


def discounted_returns(r, mask, gamma=1.0, impl="auto"):
    """r, mask (B, T) -> (B, T) fp32 masked reverse discounted cumsum (module docstring)."""
    if use_triton(impl, r):
        raise NotImplementedError("Triton path lands in the next commit")
    m = mask.float()  # (B, T)
    return _discounted_returns_torch(r.float() * m, gamma) * m

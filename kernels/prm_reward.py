"""PRIME implicit process rewards and per-row discounted returns.

    r = implicit_prm_rewards(prm_logp, ref_logp, mask, beta, impl="auto")   # (B, T)
        r_t = beta * (prm_logp_t - ref_logp_t) * mask_t   (PRIME, beta = 0.05); differentiable w.r.t. both log-probs
    G = discounted_returns(r, mask, gamma=1.0, impl="auto")                  # (B, T)
        G_t = mask_t * sum_{s >= t} gamma^(s - t) * mask_s * r_s     (reverse discounted cumsum per row)
        masked tokens add nothing and get 0; with right padding this is the return over the valid tokens.

Neither path loops over T in Python: the torch path is a log2(T)-step Hillis-Steele scan; the Triton kernel
runs one program per row over BLOCK_T chunks, each a tl.associative_scan of (value, discount) pairs carrying
the last value into the next chunk. The backward of the reverse scan is the same kernel scanning forward.
"""
import torch
import triton
import triton.language as tl

from kernels._common import jit, row_sum, use_triton


@jit
def _masked_diff_kernel(a_ptr, b_ptr, m_ptr, out_ptr, n, beta, BLOCK: tl.constexpr, HAS_B: tl.constexpr):
    """out = beta * (a - b) * m over BLOCK elements (b = 0 unless HAS_B)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    d = tl.load(a_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if HAS_B:
        d -= tl.load(b_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=inb, other=0).to(tl.float32)
    tl.store(out_ptr + offs, beta * d * m, mask=inb)


def _masked_diff(a, b, m, beta) -> torch.Tensor:
    """(B, T) contiguous -> (B, T) fp32 beta * (a - b) * m; b None means 0."""
    out = torch.empty(a.shape, device=a.device, dtype=torch.float32)
    BLOCK = 1024
    _masked_diff_kernel[(triton.cdiv(a.numel(), BLOCK),)](a, a if b is None else b, m, out, a.numel(), beta,
                                                          BLOCK=BLOCK, HAS_B=b is not None)
    return out


class _TritonPRMRewards(torch.autograd.Function):
    """d r / d prm_logp = beta * mask = -d r / d ref_logp."""

    @staticmethod
    def forward(ctx, prm_logp, ref_logp, mask, beta):
        m = mask.contiguous()  # (B, T)
        ctx.save_for_backward(m)
        ctx.beta = beta
        return _masked_diff(prm_logp.contiguous(), ref_logp.contiguous(), m, beta)

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        d = _masked_diff(g.contiguous(), None, m, ctx.beta)  # (B, T)
        return d, -d, None, None


def implicit_prm_rewards(prm_logp, ref_logp, mask, beta, impl="auto"):
    """(B, T) -> (B, T) fp32 beta * (prm_logp - ref_logp) * mask."""
    if use_triton(impl, prm_logp, ref_logp, mask):
        return _TritonPRMRewards.apply(prm_logp, ref_logp, mask, float(beta))
    return beta * (prm_logp.float() - ref_logp.float()) * mask.float()


@jit
def _discount_combine(v1, g1, v2, g2):
    """(v, g) of a span followed by the next span: y = v2 + g2 * v1, discount g1 * g2."""
    return v2 + g2 * v1, g1 * g2


@jit
def _discounted_scan_kernel(x_ptr, m_ptr, out_ptr, T, gamma, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr):
    """Row program: y_k = m_k x_k + gamma y_(k-1), out_k = m_k y_k, k in scan order (t = T-1 .. 0 if REVERSE
    else 0 .. T-1)."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_T)
    carry = 0.0  # unmasked y of the last token of the previous chunk, in scan order
    for start in range(0, T, BLOCK_T):
        t = T - 1 - (start + k) if REVERSE else start + k  # (BLOCK_T,) positions in scan order
        inb = (t >= 0) & (t < T)
        m = tl.load(m_ptr + row * T + t, mask=inb, other=0).to(tl.float32)
        x = tl.load(x_ptr + row * T + t, mask=inb, other=0.0).to(tl.float32) * m
        v, g = tl.associative_scan((x, tl.where(inb, gamma, 1.0)), 0, _discount_combine)
        y = v + g * carry  # (BLOCK_T,)
        tl.store(out_ptr + row * T + t, y * m, mask=inb)
        carry = row_sum(tl.where(k == BLOCK_T - 1, y, 0.0))


def _discounted_returns_torch(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) -> (B, T) G_t = sum_{s >= t} gamma^(s - t) x_s by doubling strides: log2(T) steps."""
    G = x
    g, d, T = gamma, 1, x.shape[-1]
    while d < T:
        G = torch.cat([G[:, :-d] + g * G[:, d:], G[:, -d:]], dim=1)  # G_t now sums s in [t, t + 2d)
        g, d = g * g, 2 * d
    return G


MAX_BLOCK_T = 1024  # tokens per scan chunk (tests lower it to cover the carry between chunks)


def _discounted_scan(x, m, gamma, reverse) -> torch.Tensor:
    """(B, T) contiguous -> (B, T) fp32 masked discounted scan of x, backwards in t if reverse."""
    B, T = x.shape
    out = torch.empty(x.shape, device=x.device, dtype=torch.float32)
    _discounted_scan_kernel[(B,)](x, m, out, T, gamma, BLOCK_T=min(triton.next_power_of_2(T), MAX_BLOCK_T),
                                 REVERSE=reverse)
    return out


class _TritonDiscountedReturns(torch.autograd.Function):
    """G = M S M r with S the reverse discounted cumsum, so dr = M S^T M g: the same scan run forwards."""

    @staticmethod
    def forward(ctx, r, mask, gamma):
        m = mask.contiguous()  # (B, T)
        ctx.save_for_backward(m)
        ctx.gamma = gamma
        return _discounted_scan(r.contiguous(), m, gamma, reverse=True)

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        return _discounted_scan(g.contiguous(), m, ctx.gamma, reverse=False), None, None


def discounted_returns(r, mask, gamma=1.0, impl="auto"):
    """r, mask (B, T) -> (B, T) fp32 masked reverse discounted cumsum (module docstring)."""
    if use_triton(impl, r, mask):
        return _TritonDiscountedReturns.apply(r, mask, float(gamma))
    m = mask.float()  # (B, T)
    return _discounted_returns_torch(r.float() * m, gamma) * m

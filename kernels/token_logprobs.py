"""Per-token log-probabilities (and entropies) of the sampled tokens, from the logits.

    logp, ent = token_logprobs(logits, targets, temperature=1.0, with_entropy=False, impl="auto")

logits (N, V) or (B, T, V), fp32 / bf16 / fp16, last dim contiguous, any row strides (a slice such as
logits[:, :-1] is read in place); targets logits.shape[:-1] int64 in [0, V).
With z = logits / temperature:  logp_i = z_i[t_i] - lse(z_i),  ent_i = lse(z_i) - sum_j p_ij z_ij  (fp32).
Gradients w.r.t. logits (dz = dlogits * temperature):
    dz_ij = g_logp_i * (1[j = t_i] - p_ij)  -  g_ent_i * p_ij * (log p_ij + ent_i)
Each row needs at least one finite logit; -inf logits (masked vocabulary) are fine.

Triton path: one program per row. Forward reads the row once: online softmax in base 2 (a = x * log2(e) /
temperature: the temperature is folded into the scale, logits / temperature is never written), running max m,
s = sum 2^(a - m) and w = sum 2^(a - m) (a - m), so ent = ln2 (log2 s - w / s) needs no per-element log. It saves
only lse2 = m + log2 s (and ent) per row: 4 (8) bytes a token. Backward reads the row once and writes dlogits
once, in fp32 arithmetic.
Torch path: row chunks of about _CHUNK_ELEMS logits, so its extra memory is O(chunk * V) instead of an (N, V)
fp32 copy (log_softmax_rows, logits_grad_rows_, shared with the fused lm_head op); backward recomputes p per
chunk from the saved per-row lse.
"""
import torch
import triton
import triton.language as tl

from kernels._common import jit, row_max, row_sum, use_triton

LOG2E = 1.4426950408889634  # host side: scale2 = LOG2E / temperature
LN2 = tl.constexpr(0.6931471805599453)  # kernels may read only constexpr globals

# logits per chunk of the torch path (16 MiB of fp32 per temporary). CPU, N=4096 V=32000 fp32, 1 thread: time vs
# naive log_softmax + gather 0.33x forward, 0.8x fwd+bwd at 2^18..2^22 alike; 2 threads on a loaded 2-core
# machine favour the fewest, largest chunks (each op is a parallel region)
_CHUNK_ELEMS = 1 << 22


def as_btv(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) -> (1, N, V) view; (B, T, V) unchanged."""
    if logits.dim() not in (2, 3) or logits.stride(-1) != 1:
        raise ValueError("logits must be (N, V) or (B, T, V) with a contiguous last dim")
    return logits if logits.dim() == 3 else logits.unsqueeze(0)


def _row_chunks(B: int, T: int, V: int):
    """(b, slice over T) pieces covering (B, T) with at most max(_CHUNK_ELEMS, V) logits each."""
    rows = max(1, _CHUNK_ELEMS // V)
    for b in range(B):
        for t0 in range(0, T, rows):
            yield b, slice(t0, min(t0 + rows, T))


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 / bf16 / fp16 logits (fp64 stays fp64, for gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


def scaled(x: torch.Tensor, temperature: float, inplace: bool = False) -> torch.Tensor:
    """x / temperature in the accumulation dtype: x itself when there is nothing to do (fp32 at temperature 1),
    else a new tensor; inplace: divide x's own buffer when x already has that dtype (a buffer the caller owns)."""
    z = x.to(_acc_dtype(x))
    if temperature == 1.0:
        return z
    return z.div_(temperature) if inplace or z is not x else z / temperature


def log_softmax_rows(z: torch.Tensor, tgt: torch.Tensor, with_entropy: bool, out=None, scratch=None):
    """z (C, V) scaled logits, tgt (C,) -> log p (C, V) (written into out if given), logp (C,), lse (C,),
    ent (C,) or None. The entropy's p log p goes to scratch if given (z itself when the caller no longer needs
    it), else to a new tensor."""
    lsm = torch.log_softmax(z, -1, out=out)  # (C, V); CPU 1 thread, 131 x 32000 fp32: 7.3 ms into out, 18 new
    t = tgt[:, None]  # (C, 1)
    logp = lsm.gather(1, t).squeeze(1)
    lse = (z.gather(1, t) - lsm.gather(1, t)).squeeze(1)  # z_t - log p_t = lse for any finite z_t
    bad = ~torch.isfinite(lse)  # (C,) rows whose target logit is -inf
    if bad.any():
        lse[bad] = torch.logsumexp(z[bad], -1)
    ent = -torch.exp(lsm, out=scratch).mul_(lsm).nan_to_num_(nan=0.0).sum(-1) if with_entropy else None  # 0 log 0
    return lsm, logp, lse, ent


def logits_grad_rows_(lsm: torch.Tensor, tgt: torch.Tensor, ent, g_logp: torch.Tensor, g_ent,
                      scratch=None) -> torch.Tensor:
    """lsm (C, V) log p, overwritten; ent, g_logp, g_ent (C,) (ent / g_ent None: no entropy term) -> dz (C, V),
    the gradient w.r.t. the scaled logits: g_logp (1[j = t] - p_j) - g_ent p_j (log p_j + ent); dz is written
    into scratch if given, else into a new tensor."""
    p = torch.exp(lsm, out=scratch)  # (C, V)
    if g_ent is None:
        dz = p.mul_(-g_logp[:, None])
    else:  # p (g_logp + g_ent (log p + ent)), with 0 where p == 0 (-inf logits)
        dz = p.mul_(lsm.add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_logp[:, None])).nan_to_num_(nan=0.0).neg_()
    return dz.scatter_add_(1, tgt[:, None], g_logp[:, None])


class _TorchTokenLogprobs(torch.autograd.Function):
    """Chunked reference path; saves logits, targets and per-row lse / ent for backward."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        ctx.set_materialize_grads(False)
        x = as_btv(logits)  # (B, T, V)
        tgt = targets.reshape(x.shape[:2])  # (B, T)
        B, T, V = x.shape
        lse = torch.empty(B, T, device=x.device, dtype=_acc_dtype(x))
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for b, ts in _row_chunks(B, T, V):
            _, logp[b, ts], lse[b, ts], ent_c = log_softmax_rows(scaled(x[b, ts], temperature), tgt[b, ts],
                                                                 with_entropy)
            if with_entropy:
                ent[b, ts] = ent_c
        ctx.save_for_backward(logits, tgt, lse, ent)
        ctx.temperature = temperature
        shape = logits.shape[:-1]
        return logp.view(shape), (ent.view(shape) if with_entropy else ent)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, tgt, lse, ent = ctx.saved_tensors
        x = as_btv(logits)  # (B, T, V)
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)  # (B, T, V)
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.reshape(lse.shape)  # (B, T)
        with_entropy = g_ent is not None and ent.numel() > 0
        for b, ts in _row_chunks(*x.shape):
            lsm = scaled(x[b, ts], ctx.temperature) - lse[b, ts, None]  # (C, V) log p
            dz = logits_grad_rows_(lsm, tgt[b, ts], ent[b, ts] if with_entropy else None, g_logp[b, ts],
                                   g_ent.reshape(lse.shape)[b, ts] if with_entropy else None)
            dx[b, ts] = dz if ctx.temperature == 1.0 else dz.div_(ctx.temperature)
        return dx.view(logits.shape), None, None, None


@jit
def row_lse_ent(row_ptr, V, scale2, BLOCK_V: tl.constexpr, WITH_ENT: tl.constexpr):
    """One read of a logits row as a = x * scale2 -> (lse2 = log2 sum 2^a, ent in nats; 0 unless WITH_ENT)."""
    m = -1e30  # running max (finite, so an all -inf block gives 2^(-inf) = 0, not nan)
    s = 0.0  # sum 2^(a - m)
    w = 0.0  # sum 2^(a - m) * (a - m)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        a = tl.load(row_ptr + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * scale2  # (BLOCK_V,)
        m_new = tl.maximum(m, row_max(a))
        alpha = tl.exp2(m - m_new)
        e = tl.exp2(a - m_new)  # (BLOCK_V,)
        if WITH_ENT:
            w = alpha * (w + s * (m - m_new)) + row_sum(e * tl.where(e > 0, a - m_new, 0.0))
        s = s * alpha + row_sum(e)
        m = m_new
    log2s = tl.log2(s)
    return m + log2s, (log2s - w / s) * LN2


@jit
def row_grad(row_ptr, drow_ptr, V, tgt, scale2, lse2, ent, g_logp, g_ent, BLOCK_V: tl.constexpr,
             WITH_ENT: tl.constexpr):
    """One read, one write: drow_j = (g_logp (1[j = tgt] - p_j) - g_ent p_j (log p_j + ent)) / temperature."""
    inv_temp = scale2 * LN2
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        a = tl.load(row_ptr + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * scale2  # (BLOCK_V,)
        logp2 = a - lse2  # log2 p
        p = tl.exp2(logp2)
        dz = tl.where(cols == tgt, g_logp, 0.0) - g_logp * p  # fp32 1 - p at the target
        if WITH_ENT:
            dz -= g_ent * p * tl.where(p > 0, logp2 * LN2 + ent, 0.0)
        tl.store(drow_ptr + cols, (dz * inv_temp).to(drow_ptr.dtype.element_ty), mask=cols < V)


@jit
def row_target_logp(row_ptr, tgt, scale2, lse2):
    """logp of the target: ln2 (a_tgt - lse2)."""
    return (tl.load(row_ptr + tgt).to(tl.float32) * scale2 - lse2) * LN2


@jit
def row_ptr(x_ptr, T, stride_b, stride_t):
    """Start of logits row program_id(0) of a (B, T, V) tensor with any row strides (int64 offsets)."""
    row = tl.program_id(0).to(tl.int64)
    return x_ptr + (row // T) * stride_b + (row % T) * stride_t


@jit
def _token_logprobs_fwd(x_ptr, tgt_ptr, logp_ptr, lse2_ptr, ent_ptr, T, V, stride_b, stride_t, scale2,
                        BLOCK_V: tl.constexpr, WITH_ENT: tl.constexpr):
    """Row program: logp = ln2 (a_tgt - lse2); saves lse2 (and ent)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = row_ptr(x_ptr, T, stride_b, stride_t)
    lse2, ent = row_lse_ent(x_row, V, scale2, BLOCK_V, WITH_ENT)
    tl.store(logp_ptr + row, row_target_logp(x_row, tl.load(tgt_ptr + row), scale2, lse2))
    tl.store(lse2_ptr + row, lse2)
    if WITH_ENT:
        tl.store(ent_ptr + row, ent)


@jit
def _token_logprobs_bwd(x_ptr, dx_ptr, tgt_ptr, lse2_ptr, ent_ptr, g_logp_ptr, g_ent_ptr, T, V, stride_b, stride_t,
                        scale2, BLOCK_V: tl.constexpr, WITH_ENT: tl.constexpr):
    """Row program: dlogits of the row (dx contiguous (B * T, V))."""
    row = tl.program_id(0).to(tl.int64)
    ent, g_ent = 0.0, 0.0
    if WITH_ENT:
        ent = tl.load(ent_ptr + row)
        g_ent = tl.load(g_ent_ptr + row)
    row_grad(row_ptr(x_ptr, T, stride_b, stride_t), dx_ptr + row * V, V, tl.load(tgt_ptr + row), scale2,
             tl.load(lse2_ptr + row), ent, tl.load(g_logp_ptr + row), g_ent, BLOCK_V, WITH_ENT)


MAX_BLOCK_V = 4096  # vocabulary block of the row loops (tests lower it to cover several blocks and a ragged tail)


def row_launch_args(x: torch.Tensor, temperature: float) -> dict:
    """Shape, stride, scale and block arguments shared by the row kernels; x (B, T, V)."""
    B, T, V = x.shape
    return dict(T=T, V=V, stride_b=x.stride(0), stride_t=x.stride(1), scale2=LOG2E / temperature,
                BLOCK_V=min(triton.next_power_of_2(V), MAX_BLOCK_V), num_warps=8)


class _TritonTokenLogprobs(torch.autograd.Function):
    """Row kernels; saves logits, targets and per-row lse2 (+ ent): no (N, V) temporary."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        ctx.set_materialize_grads(False)
        x = as_btv(logits)  # (B, T, V)
        tgt = targets.reshape(x.shape[:2]).contiguous()  # (B, T)
        lse2 = torch.empty(x.shape[:2], device=x.device, dtype=torch.float32)  # (B, T)
        logp = torch.empty_like(lse2)
        ent = torch.empty_like(lse2) if with_entropy else lse2.new_empty(0)
        _token_logprobs_fwd[(lse2.numel(),)](x, tgt, logp, lse2, ent, WITH_ENT=with_entropy,
                                             **row_launch_args(x, temperature))
        ctx.save_for_backward(logits, tgt, lse2, ent)
        ctx.temperature = temperature
        shape = logits.shape[:-1]
        return logp.view(shape), (ent.view(shape) if with_entropy else ent)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, tgt, lse2, ent = ctx.saved_tensors
        x = as_btv(logits)  # (B, T, V)
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)  # (B, T, V)
        g_logp = torch.zeros_like(lse2) if g_logp is None else g_logp.float().contiguous()
        with_entropy = g_ent is not None and ent.numel() > 0
        g_ent = g_ent.float().contiguous() if with_entropy else g_logp
        _token_logprobs_bwd[(lse2.numel(),)](x, dx, tgt, lse2, ent, g_logp, g_ent, WITH_ENT=with_entropy,
                                             **row_launch_args(x, ctx.temperature))
        return dx.view(logits.shape), None, None, None


def token_logprobs(logits, targets, temperature=1.0, with_entropy=False, impl="auto"):
    """logits (N, V) or (B, T, V); targets logits.shape[:-1] -> (logp fp32, ent fp32 or None), same shape as targets."""
    fn = _TritonTokenLogprobs if use_triton(impl, logits, targets) else _TorchTokenLogprobs
    logp, ent = fn.apply(logits, targets, float(temperature), with_entropy)
    return logp, (ent if with_entropy else None)

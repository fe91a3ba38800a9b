"""Per-token log-probabilities (and entropies) of the sampled tokens, from the logits.

    logp, ent = token_logprobs(logits, targets, temperature=1.0, with_entropy=False, impl="auto")

logits (N, V) or (B, T, V), fp32 / bf16 / fp16, last dim contiguous, any row strides (a slice such as
logits[:, :-1] is read in place); targets logits.shape[:-1] int64 in [0, V).
With z = logits / temperature:  logp_i = z_i[t_i] - lse(z_i),  ent_i = lse(z_i) - sum_j p_ij z_ij  (fp32).
Gradients w.r.t. logits (dz = dlogits * temperature):
    dz_ij = g_logp_i * (1[j = t_i] - p_ij)  -  g_ent_i * p_ij * (log p_ij + ent_i)
Each row needs at least one finite logit; -inf logits (masked vocabulary) are fine.

Torch path: row chunks of about _CHUNK_ELEMS logits, so its extra memory is O(chunk * V) instead of an (N, V)
fp32 copy; backward recomputes p per chunk from the saved per-row lse.
"""
import torch

from kernels._common import use_triton

_CHUNK_ELEMS = 1 << 20  # logits per chunk of the torch path (4 MiB of fp32 per temporary)


def _as_btv(logits: torch.Tensor) -> torch.Tensor:
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


def _scaled(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """x / temperature in the accumulation dtype (x itself for fp32 at temperature 1: never written to)."""
    z = x.to(_acc_dtype(x))
    return z if temperature == 1.0 else z / temperature


def _masked_plogp(p: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """p * log p with 0 where p == 0 (-inf logits)."""
    return torch.where(p > 0, p * logp, 0.0)


class _TorchTokenLogprobs(torch.autograd.Function):
    """Chunked reference path; saves logits, targets and per-row lse / ent for backward."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        x = _as_btv(logits)  # (B, T, V)
        tgt = targets.reshape(x.shape[:2])  # (B, T)
        B, T, V = x.shape
        lse = torch.empty(B, T, device=x.device, dtype=_acc_dtype(x))
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for b, ts in _row_chunks(B, T, V):
            z = _scaled(x[b, ts], temperature)  # (C, V) fp32
            lse[b, ts] = torch.logsumexp(z, -1)
            logp[b, ts] = z.gather(1, tgt[b, ts, None]).squeeze(1) - lse[b, ts]
            if with_entropy:
                lsm = z - lse[b, ts, None]  # (C, V) log p
                ent[b, ts] = -_masked_plogp(lsm.exp(), lsm).sum(-1)
        ctx.save_for_backward(logits, tgt, lse, ent)
        ctx.temperature = temperature
        shape = logits.shape[:-1]
        return logp.view(shape), (ent.view(shape) if with_entropy else ent)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, tgt, lse, ent = ctx.saved_tensors
        x = _as_btv(logits)  # (B, T, V)
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)  # (B, T, V)
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.reshape(lse.shape)  # (B, T)
        with_entropy = g_ent is not None and ent.numel() > 0
        for b, ts in _row_chunks(*x.shape):
            lsm = _scaled(x[b, ts], ctx.temperature) - lse[b, ts, None]  # (C, V) log p
            p = lsm.exp()  # (C, V)
            dz = p * -g_logp[b, ts, None]  # (C, V)
            if with_entropy:
                g_e = g_ent.reshape(lse.shape)[b, ts, None]  # (C, 1)
                dz -= g_e * _masked_plogp(p, lsm + ent[b, ts, None])
            dz.scatter_add_(1, tgt[b, ts, None], g_logp[b, ts, None])
            dx[b, ts] = dz / ctx.temperature
        return dx.view(logits.shape), None, None, None


def token_logprobs(logits, targets, temperature=1.0, with_entropy=False, impl="auto"):
    """logits (N, V) or (B, T, V); targets logits.shape[:-1] -> (logp fp32, ent fp32 or None), same shape as targets."""
    fn = _TorchTokenLogprobs
    if use_triton(impl, logits):
        raise NotImplementedError("Triton path lands in the next commit")
    logp, ent = fn.apply(logits, targets, float(temperature), with_entropy)
    return logp, (ent if with_entropy else None)

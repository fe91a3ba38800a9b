"""Logits -> PPO loss in one kernel: log-prob, entropy, clipped loss and dlogits of each token in the same program.

    loss, stats = fused_logits_ppo_loss(logits, targets, old_logp, adv, mask, clip_low=0.2, clip_high=0.28,
                                        dual_clip=None, ref_logp=None, kl_coef=0.0, agg="token-mean",
                                        temperature=1.0, entropy_coef=0.0, grad_scale=1.0, impl="auto")

logits (B, T, V) fp32 / bf16 / fp16, last dim contiguous, any row strides (logits[:, :-1] is read in place);
targets (B, T) int64; old_logp, mask, ref_logp (B, T); adv (B,) or (B, T).
loss = ppo_loss(logp, ...) - entropy_coef * sum(w * ent), with logp, ent = token_logprobs(logits, targets,
temperature, with_entropy=True) and w the aggregation weights (kernels.ppo_loss); differentiable w.r.t. logits.
stats: python floats clip_frac, approx_kl, ratio_mean, ratio_max, entropy (means over valid tokens).

Triton path (impl="triton", or "auto" on CUDA): the loss is linear in the per-token terms and w is known before
the kernel runs, so each row program reads its logits once for lse / ent, evaluates the PPO token loss and its
derivative, then reads the row again and writes dlogits for upstream gradient grad_scale: two reads and one
write of the logits, like the two-kernel path's forward + backward, in one launch with no per-token tensors
between them. Masked tokens (w == 0) skip both reads and write zero dlogits. dlogits (logits' dtype, B*T*V) is
held from forward to backward; backward hands it over, rescaled in place (one more pass) only if the upstream
gradient differs from grad_scale. So pass as grad_scale the factor the caller multiplies the loss by before
backward (e.g. the micro-batch's share of a global token mean); it changes speed, never results.
Backward can run once per forward.
Torch path (the fallback): token_logprobs + ppo_loss, two autograd ops.
"""
import torch
import triton.language as tl

from kernels._common import jit, use_triton
from kernels.ppo_loss import agg_weights, expand_adv, ppo_launch_args, ppo_loss_terms, ppo_stats, ppo_token
from kernels.token_logprobs import (as_btv, row_grad, row_launch_args, row_lse_ent, row_ptr, row_target_logp,
                                     token_logprobs)


@jit
def _fused_logits_ppo_kernel(x_ptr, dx_ptr, tgt_ptr, old_ptr, adv_ptr, ref_ptr, w_ptr, onp_ptr, logp_ptr, ent_ptr,
                             loss_ptr, ratio_ptr, clipped_ptr, T, V, stride_b, stride_t, scale2, clip_low, clip_high,
                             dual_clip, kl_coef, entropy_coef, grad_scale, BLOCK_V: tl.constexpr,
                             HAS_DUAL: tl.constexpr, HAS_KL: tl.constexpr, CISPO: tl.constexpr,
                             HAS_ENT_COEF: tl.constexpr, WRITE_GRAD: tl.constexpr, ON_POLICY: tl.constexpr):
    """Row program: logp, ent, w * (l - entropy_coef * ent), ratio, clipped; if WRITE_GRAD the dlogits row of
    grad_scale * that loss. ON_POLICY: where onp_ptr is nonzero, old = logp + old_ptr's value (a constant: ratio
    exp(-that offset), 1 for offset 0). dx_ptr may be x_ptr (dlogits written over the logits: each block is read
    before it is written)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = row_ptr(x_ptr, T, stride_b, stride_t)
    w = tl.load(w_ptr + row)
    if w != 0:
        lse2, ent = row_lse_ent(x_row, V, scale2, BLOCK_V, True)
        tgt = tl.load(tgt_ptr + row)
        logp = row_target_logp(x_row, tgt, scale2, lse2)
        old = tl.load(old_ptr + row)
        if ON_POLICY:
            old = tl.where(tl.load(onp_ptr + row) != 0, logp + old, old)
        loss, dloss, ratio, clipped = ppo_token(logp, old, tl.load(adv_ptr + row),
                                                tl.load(ref_ptr + row), clip_low, clip_high, dual_clip, kl_coef,
                                                HAS_DUAL, HAS_KL, CISPO)
        if WRITE_GRAD:
            g = grad_scale * w
            row_grad(x_row, dx_ptr + row * V, V, tgt, scale2, lse2, ent, g * dloss, -g * entropy_coef, BLOCK_V,
                     HAS_ENT_COEF)
        tl.store(logp_ptr + row, logp)
        tl.store(ent_ptr + row, ent)
        tl.store(loss_ptr + row, w * (loss - entropy_coef * ent))
        tl.store(ratio_ptr + row, ratio)
        tl.store(clipped_ptr + row, clipped.to(tl.int8))
    else:
        if WRITE_GRAD:
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                tl.store(dx_ptr + row * V + cols, tl.full([BLOCK_V], 0, dx_ptr.dtype.element_ty), mask=cols < V)
        tl.store(logp_ptr + row, 0.0)
        tl.store(ent_ptr + row, 0.0)
        tl.store(loss_ptr + row, 0.0)
        tl.store(ratio_ptr + row, 1.0)
        tl.store(clipped_ptr + row, tl.full([], 0, tl.int8))


def hand_over_grads(ctx, g_loss, op: str) -> tuple:
    """Backward of a loss whose forward computed its input gradients ctx.grads (a tuple, None entries allowed)
    for the upstream gradient ctx.grad_scale: hands them over once (a second backward raises), rescaled in place
    by g_loss / grad_scale only if g_loss differs."""
    grads, ctx.grads = ctx.grads, None
    if grads is None:
        raise RuntimeError(f"{op}: backward can run once per forward")
    if g_loss.ne(ctx.grad_scale).item():
        s = g_loss / ctx.grad_scale
        grads = tuple(None if g is None else g.mul_(s.to(g.dtype)) for g in grads)
    return grads


class _FusedLogitsPPOLoss(torch.autograd.Function):
    """Forward computes the loss and dlogits together; backward returns dlogits (times the upstream gradient)."""

    @staticmethod
    def forward(ctx, logits, targets, old, adv, ref, w, clip_low, clip_high, dual_clip, kl_coef, temperature,
                entropy_coef, grad_scale):
        x = as_btv(logits)  # (B, T, V)
        tgt = targets.reshape(x.shape[:2]).contiguous()  # (B, T)
        write_grad = ctx.needs_input_grad[0]
        dx = torch.empty(x.shape if write_grad else 0, device=x.device, dtype=x.dtype)  # (B, T, V)
        ptrs, scalars = ppo_launch_args(old.float().contiguous(), adv.contiguous(),
                                        None if ref is None else ref.float().contiguous(),
                                        clip_low, clip_high, dual_clip, kl_coef)
        logp, ent, tok, ratio = (torch.empty(tgt.shape, device=x.device, dtype=torch.float32) for _ in range(4))
        clipped = torch.empty(tgt.shape, device=x.device, dtype=torch.int8)  # (B, T)
        w = w.contiguous()
        _fused_logits_ppo_kernel[(tgt.numel(),)](x, dx, tgt, *ptrs, w, w, logp, ent, tok, ratio, clipped,
                                                 grad_scale=grad_scale, entropy_coef=entropy_coef,
                                                 HAS_ENT_COEF=entropy_coef != 0.0, WRITE_GRAD=write_grad,
                                                 ON_POLICY=False, **scalars, **row_launch_args(x, temperature))
        ctx.grads = (dx.view(logits.shape),) if write_grad else None
        ctx.grad_scale = grad_scale
        ctx.mark_non_differentiable(logp, ent, ratio, clipped)
        return tok.sum(), logp, ent, ratio, clipped

    @staticmethod
    def backward(ctx, g_loss, *_):
        return hand_over_grads(ctx, g_loss, "fused_logits_ppo_loss") + (None,) * 12


def fused_logits_ppo_loss(logits, targets, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None,
                          ref_logp=None, kl_coef=0.0, agg="token-mean", temperature=1.0, entropy_coef=0.0,
                          grad_scale=1.0, impl="auto"):
    """(B, T, V) logits -> (scalar loss, stats); see the module docstring."""
    triton_path = use_triton(impl, logits, targets, old_logp, adv, mask, ref_logp)
    w = agg_weights(mask, agg)  # (B, T)
    old = old_logp.detach()
    if not triton_path:
        logp, ent = token_logprobs(logits, targets, temperature, with_entropy=True, impl="torch")  # (B, T) x2
        loss, ratio, clipped = ppo_loss_terms(logp, old, adv, mask, clip_low, clip_high, dual_clip, ref_logp,
                                              kl_coef, agg, "torch")
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * (w * ent).sum()
        return loss, ppo_stats(ratio, clipped, logp, old, mask, ent)
    ref = None if ref_logp is None else ref_logp.detach()
    loss, logp, ent, ratio, clipped = _FusedLogitsPPOLoss.apply(
        logits, targets, old, expand_adv(adv.detach(), old), ref, w, clip_low, clip_high, dual_clip, kl_coef,
        float(temperature), float(entropy_coef), float(grad_scale))
    return loss, ppo_stats(ratio, clipped, logp, old, mask, ent)

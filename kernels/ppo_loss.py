"""PPO clipped policy loss over (B, T) tokens, with asymmetric clip, dual clip and optional k3 KL.

    loss, stats = ppo_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None,
                           ref_logp=None, kl_coef=0.0, agg="token-mean", impl="auto")

logp, old_logp, mask (B, T); adv (B,) or (B, T); ref_logp (B, T) or None. Per token (CoPRIS / verl):
    ratio = exp(clamp(logp - old, -20, 20))          old = log-prob under the policy that sampled the token
    l     = max(-adv * ratio, -adv * clamp(ratio, 1 - clip_low, 1 + clip_high))
    l     = min(l, -adv * dual_clip)  where adv < 0   (dual clip, dual_clip > 1, e.g. 10)
    l    += kl_coef * (exp(u) - u - 1),  u = clamp(ref - logp, -20, 20)          (k3 KL to the reference)
loss = sum(w * l) with the aggregation weights w of agg_weights(); masked tokens contribute 0, to the loss, its
gradient and the stats, whatever they hold (nan included).
Gradient w.r.t. logp only; old_logp, adv, ref_logp are constants.
stats (python floats, over valid tokens): clip_frac (tokens whose gradient a clip cut: upper/lower/dual),
approx_kl (mean of old - logp), ratio_mean, ratio_max.
The token functions also hold CISPO's token term (MiniMax-M1, 2025), used by the fused lm_head op's objective
"cispo" (kernels/fused_linear.py): l = -sg(clamp(ratio, 1 - clip_low, 1 + clip_high)) * adv * logp (+ the KL),
dl / dlogp = -clamp(ratio, ...) * adv: no token's gradient is dropped, only its weight clipped (clipped: the
weight was).
Triton path: one elementwise kernel writes the weighted per-token loss and d loss / d logp in the forward;
backward scales the saved gradient. ppo_token is shared with the fused logits -> loss kernel (fused_ppo.py).
"""
import torch
import triton
import triton.language as tl

from kernels._common import jit, use_triton

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
STAT_KEYS = ("clip_frac", "approx_kl", "ratio_mean", "ratio_max")


def token_weights(seq_lens: torch.Tensor, agg: str, mask=None, n_tokens=None, n_seqs=None,
                  max_len=None, n_rows=None) -> torch.Tensor:
    """Aggregation weights of packed tokens: seq_lens (S,) int64 lengths of the concatenated sequences (sum N),
    mask (N,) or None (all valid) -> (N,) fp32 w (fp64 for an fp64 mask) with loss = sum(w * l); with m = mask and
    n_s = valid tokens of token i's sequence s:
    token-mean              m / n_tokens              n_tokens default: sum(m)
    seq-mean-token-mean     m / (n_s * n_seqs)        n_seqs default: sequences with a valid token
    seq-mean-token-sum      m / n_seqs
    seq-mean-token-sum-norm m / (n_rows * max_len)    Dr. GRPO (Liu et al. 2025): a constant normaliser, the
                                                      same for every token whatever its sequence's length;
                                                      n_rows default: S, every sequence, masked ones too (TRL)
    Pass the global (all-rank, all-micro-batch) n_tokens / n_seqs to get the global aggregate's weights."""
    if agg not in AGGS:
        raise ValueError(f"agg must be one of {AGGS}, got {agg!r}")
    if agg == "seq-mean-token-sum-norm" and not max_len:
        raise ValueError("agg seq-mean-token-sum-norm needs max_len (the constant normaliser's length)")
    N = int(seq_lens.sum()) if mask is None else mask.numel()
    m = torch.ones(N, device=seq_lens.device) if mask is None else \
        mask.reshape(-1).to(torch.promote_types(mask.dtype, torch.float32))  # (N,)
    if agg == "token-mean":
        return m / (m.sum().clamp(min=1) if n_tokens is None else n_tokens)
    seq = torch.repeat_interleave(torch.arange(len(seq_lens), device=m.device), seq_lens, output_size=N)  # (N,)
    n_tok = torch.zeros(len(seq_lens), device=m.device, dtype=m.dtype).index_add_(0, seq, m)  # (S,) valid tokens
    n_seq = (n_tok > 0).sum().clamp(min=1) if n_seqs is None else n_seqs
    if agg == "seq-mean-token-mean":
        return m / (n_tok.clamp(min=1)[seq] * n_seq)
    if agg == "seq-mean-token-sum-norm":
        return m / ((len(seq_lens) if n_rows is None else n_rows) * max_len)
    return m / n_seq


def agg_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """(B, T) fp32 weights w with loss = sum(w * l): token_weights of B rows of T tokens each, so
    token-mean              m / sum(m)
    seq-mean-token-mean     m / (|rows with a valid token| * sum_t m)
    seq-mean-token-sum      m / |rows with a valid token|
    seq-mean-token-sum-norm m / (B * T)     (T: the constant; verl's agg_loss has no 1/B: B times this)
    """
    B, T = mask.shape
    lens = torch.full((B,), T, device=mask.device, dtype=torch.long)
    return token_weights(lens, agg, mask, max_len=T).view(B, T)


def ppo_stats(ratio, clipped, logp, old_logp, mask, ent=None) -> dict:
    """Python floats over valid tokens: clip_frac, approx_kl, ratio_mean, ratio_max (+ entropy if ent is given);
    0 where no token is valid. One device sync."""
    valid = mask > 0  # (B, T)
    n = valid.sum().clamp(min=1)

    def masked(x):  # (B, T) with 0 at masked tokens, whatever they hold
        return torch.where(valid, x.detach().float(), 0.0)

    vals = [masked(clipped).sum() / n, masked(old_logp - logp).sum() / n, masked(ratio).sum() / n,
            masked(ratio).max() if ratio.numel() else n.new_zeros((), dtype=torch.float32)]  # no token at all
    keys = STAT_KEYS if ent is None else STAT_KEYS + ("entropy",)
    if ent is not None:
        vals.append(masked(ent).sum() / n)
    return dict(zip(keys, torch.stack(vals).tolist()))


def _token_loss_torch(logp, old, adv, ref, clip_low, clip_high, dual_clip, kl_coef, cispo=False):
    """Per-token loss l (B, T), ratio (B, T), clipped (B, T) bool; autograd through logp. cispo: CISPO's token term
    instead of the clip (module docstring)."""
    ratio = torch.exp((logp - old).clamp(-20, 20))  # (B, T)
    if cispo:
        w_is = ratio.clamp(1 - clip_low, 1 + clip_high)  # (B, T) the clipped IS weight, a constant (sg)
        loss, clipped = -adv * w_is.detach() * logp, w_is != ratio
    else:
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


@jit
def ppo_token(logp, old, adv, ref, clip_low, clip_high, dual_clip, kl_coef, HAS_DUAL: tl.constexpr,
               HAS_KL: tl.constexpr, CISPO: tl.constexpr):
    """Per token (module docstring): loss l, dl / dlogp, ratio, clipped (a clip zeroed the policy gradient; CISPO:
    a clip bounded the IS weight)."""
    d = logp - old
    ratio = tl.exp(tl.minimum(tl.maximum(d, -20.0), 20.0))
    if CISPO:
        w_is = tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
        clipped = w_is != ratio
        loss = -adv * w_is * logp
        dloss = -adv * w_is
    else:
        d_ratio = tl.where((d >= -20.0) & (d <= 20.0), ratio, 0.0)  # d ratio / d logp
        pg1 = -adv * ratio
        pg2 = -adv * tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
        clipped = pg2 > pg1  # only when ratio is outside the clip range: pg2 is then flat
        loss = tl.maximum(pg1, pg2)
        if HAS_DUAL:
            pg3 = -adv * dual_clip
            dual = (adv < 0) & (pg3 < loss)
            loss = tl.where(dual, pg3, loss)
            clipped = clipped | dual
        dloss = tl.where(clipped, 0.0, -adv * d_ratio)
    if HAS_KL:
        u = ref - logp
        uc = tl.minimum(tl.maximum(u, -20.0), 20.0)
        loss += kl_coef * (tl.exp(uc) - uc - 1.0)
        dloss += tl.where((u >= -20.0) & (u <= 20.0), kl_coef * (1.0 - tl.exp(uc)), 0.0)
    return loss, dloss, ratio, clipped


def ppo_launch_args(old, adv, ref, clip_low, clip_high, dual_clip, kl_coef, cispo=False) -> tuple:
    """Pointer and scalar arguments of ppo_token shared by the two kernels that call it (ref None -> old)."""
    has_kl = ref is not None and kl_coef != 0.0
    return ((old, adv, ref if has_kl else old),
            dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip or 0.0, kl_coef=kl_coef,
                 HAS_DUAL=dual_clip is not None, HAS_KL=has_kl, CISPO=cispo))


@jit
def _ppo_loss_kernel(logp_ptr, old_ptr, adv_ptr, ref_ptr, w_ptr, loss_ptr, dlogp_ptr, ratio_ptr, clipped_ptr, n,
                     clip_low, clip_high, dual_clip, kl_coef, BLOCK: tl.constexpr, HAS_DUAL: tl.constexpr,
                     HAS_KL: tl.constexpr, CISPO: tl.constexpr):
    """BLOCK tokens: loss_ptr = w * l, dlogp_ptr = w * dl / dlogp (0 where w == 0), ratio, clipped."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    logp = tl.load(logp_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    old = tl.load(old_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    adv = tl.load(adv_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    ref = tl.load(ref_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=inb, other=0.0)
    loss, dloss, ratio, clipped = ppo_token(logp, old, adv, ref, clip_low, clip_high, dual_clip, kl_coef,
                                             HAS_DUAL, HAS_KL, CISPO)
    tl.store(loss_ptr + offs, tl.where(w != 0, w * loss, 0.0), mask=inb)
    tl.store(dlogp_ptr + offs, tl.where(w != 0, w * dloss, 0.0), mask=inb)
    tl.store(ratio_ptr + offs, ratio, mask=inb)
    tl.store(clipped_ptr + offs, clipped.to(tl.int8), mask=inb)


class _TritonPPOLoss(torch.autograd.Function):
    """Forward writes d loss / d logp; backward multiplies it by the upstream gradient."""

    @staticmethod
    def forward(ctx, logp, old, adv, ref, w, clip_low, clip_high, dual_clip, kl_coef):
        lp = logp.float().contiguous()  # (B, T)
        ptrs, scalars = ppo_launch_args(old.float().contiguous(), adv.contiguous(),
                                        None if ref is None else ref.float().contiguous(),
                                        clip_low, clip_high, dual_clip, kl_coef)
        tok, dlogp, ratio = torch.empty_like(lp), torch.empty_like(lp), torch.empty_like(lp)  # (B, T)
        clipped = torch.empty(lp.shape, device=lp.device, dtype=torch.int8)  # (B, T)
        BLOCK = 1024
        _ppo_loss_kernel[(triton.cdiv(lp.numel(), BLOCK),)](lp, *ptrs, w, tok, dlogp, ratio, clipped, lp.numel(),
                                                            BLOCK=BLOCK, **scalars)
        ctx.save_for_backward(dlogp)
        ctx.mark_non_differentiable(ratio, clipped)
        return tok.sum(), ratio, clipped

    @staticmethod
    def backward(ctx, g_loss, g_ratio, g_clipped):
        (dlogp,) = ctx.saved_tensors
        return dlogp * g_loss, None, None, None, None, None, None, None, None


def expand_adv(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, T) -> (B, T) fp32."""
    return (adv[:, None] if adv.dim() == 1 else adv).float().expand_as(like)


def ppo_loss_terms(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None, ref_logp=None,
                   kl_coef=0.0, agg="token-mean", impl="auto"):
    """ppo_loss without the stats sync -> (loss, ratio (B, T), clipped (B, T))."""
    triton_path = use_triton(impl, logp, old_logp, adv, mask, ref_logp)
    w = agg_weights(mask, agg)  # (B, T)
    adv = expand_adv(adv.detach(), logp)  # (B, T)
    old = old_logp.detach()
    ref = None if ref_logp is None else ref_logp.detach()
    if triton_path:
        return _TritonPPOLoss.apply(logp, old, adv, ref, w, clip_low, clip_high, dual_clip, kl_coef)
    tok, ratio, clipped = _token_loss_torch(logp.float(), old.float(), adv, ref, clip_low, clip_high, dual_clip,
                                            kl_coef)  # the clamps stop nan gradients from masked tokens
    return torch.where(w > 0, w * tok, 0.0).sum(), ratio, clipped


def ppo_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None, ref_logp=None,
             kl_coef=0.0, agg="token-mean", impl="auto"):
    """(B, T) inputs -> (scalar loss, stats dict); see the module docstring."""
    loss, ratio, clipped = ppo_loss_terms(logp, old_logp, adv, mask, clip_low, clip_high, dual_clip, ref_logp,
                                          kl_coef, agg, impl)
    return loss, ppo_stats(ratio, clipped, logp, old_logp.detach(), mask)

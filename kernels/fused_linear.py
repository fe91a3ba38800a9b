"""Fused lm_head -> log-prob / entropy / PPO loss: the (N, V) logits are never materialised.

    loss, logp, ent, stats = fused_linear_ppo_loss(h, weight, targets, old_logp, adv, w, clip_low=0.2,
                                                   clip_high=0.28, dual_clip=None, ref_logp=None, kl_coef=0.0,
                                                   temperature=1.0, entropy_coef=0.0, grad_scale=1.0, bias=None,
                                                   on_policy=None, impl="auto", chunk=None, objective="ppo",
                                                   seq_lens=None)
    logp, ent = linear_token_logprobs(h, weight, targets, temperature=1.0, with_entropy=False, bias=None,
                                      impl="auto", chunk=None)

h (N, H) hidden states of the predicting positions (flat: packed sequences, real tokens only), weight (V, H)
the lm_head weight (a plain tensor: FSDP's unsharded parameter, or the tied embedding), bias (V,) or None, all
fp32 / bf16 / fp16 of one dtype; targets (N,) int64; old_logp, adv, w, ref_logp (N,); on_policy (N,) bool or None.
With z = (h @ weight.T + bias) / temperature, logp and ent are token_logprobs(z) (fp32, (N,)), and
    loss = sum_i w_i * (l_i - entropy_coef * ent_i)
with l_i the PPO token loss of kernels.ppo_loss (asymmetric clip, dual clip, k3 KL to ref_logp) and
old_i = logp_i (a constant: ratio 1) where on_policy: tokens the current policy sampled need no separate
old-log-prob forward. w carries the aggregation (kernels.ppo_loss.token_weights builds it from packed sequence
lengths and global denominators); tokens with w == 0 contribute nothing to the loss, its gradient and the
stats, whatever old_logp / adv / ref_logp hold there (nan included), and get logp = ent = 0.
stats: python floats clip_frac, approx_kl, ratio_mean, ratio_max, entropy over tokens with w > 0 (one sync).
The loss is differentiable w.r.t. h, weight and bias; logp and ent are not (use linear_token_logprobs).

objective picks l_i (docs/algorithms.md has the papers and settings; dual_clip is the ppo clip's only):
    ppo         the clipped token term above (asymmetric, dual clip)
    cispo       MiniMax-M1: -sg(clamp(r_i, 1 - clip_low, 1 + clip_high)) * adv_i * logp_i (kernels.ppo_loss)
    gspo_token  GSPO-token (Zheng et al. 2025): the clipped term with r_i := s_j(i) * pi_i / sg[pi_i], s_j the
                ratio of token i's sequence j: s_j = exp(clamp(mean over j's tokens with w > 0 of
                (logp - old), -20, 20)); per-token advantages allowed
    gspo        GSPO: sequence j's term -min(s_j A_j, clamp(s_j, 1 - clip_low, 1 + clip_high) A_j) weighted by
                W_j = sum of its tokens' w (A constant over the sequence): with loss_agg seq-mean-token-mean the
                paper's mean over sequences; equal to gspo_token when w and adv are constant over each sequence
seq_lens (S,) int64: the packed sequences' lengths (sum N), needed by the gspo objectives. Sequence ratios need
every token's logp before any token's gradient: _gspo_inputs runs a no-grad linear_token_logprobs pass over the
kept tokens that are not on_policy (on-policy ones contribute logp - old = 0 without it), then the token pass
above runs with old_i = logp_i - log s_j: one extra GEMM over the off-policy tokens, none when all are on-policy.
linear_token_logprobs: logp (and ent) for forwards that need only log-probs (old log-probs, reference, PRM,
SFT's -sum(w * logp)); differentiable w.r.t. h, weight and bias.

How (Liger-Kernel's fused linear cross entropy, applied to the PPO loss): tokens go in chunks of C (chunk, or
as many as fit in _CHUNK_LOGITS logits). Per chunk: z_c = h_c @ weight.T (C, V) in h's dtype, then per row
lse, ent, logp, the token loss and its derivatives g_logp = grad_scale w dl/dlogp, g_ent = -grad_scale w
entropy_coef, then (kernels.token_logprobs' formula, temperature T)
    dz_c = (g_logp (1[j = t] - p) - g_ent p (log p + ent)) / T      (C, V), w.r.t. the raw logits
    dh_c = dz_c @ weight      dweight += dz_c^T h_c      dbias += sum_c dz_c
The loss is linear in the per-token terms and w is known before the op runs, so the gradients are complete
when the forward returns: three GEMMs, as many as the unfused forward + backward, and O(C V) transient memory
beyond the gradients themselves (dweight accumulates in fp32: on CUDA a bf16 / fp16 GEMM with fp32 accumulation
and result, on tensor cores; on CPU, whose backend has no such addmm, each chunk's product is a GEMM in h's dtype
(AVX512_BF16 / AMX) added into the fp32 accumulator: one bf16 rounding per chunk, none across chunks). Backward hands them over, rescaled in place only if the upstream gradient differs from grad_scale:
pass as grad_scale the factor the caller multiplies the loss by before backward; it changes speed, never
results. Backward can run once per forward. linear_token_logprobs cannot know its upstream gradient in the
forward: it saves per-row lse (and ent) and its backward recomputes each chunk's logits (four GEMMs in all).
Row step: impl="torch" (CPU default) in torch (log_softmax_rows / logits_grad_rows_ of token_logprobs, the
token loss's derivative by autograd through ppo_loss's torch token loss); impl="triton" (CUDA default) the
row kernels of fused_ppo.py / token_logprobs.py on the chunk's logits, dlogits written over them in place. The
GEMMs are torch's (cuBLAS / CPU BLAS) in both.
"""
import functools

import torch

from kernels._common import use_triton
from kernels.fused_ppo import _fused_logits_ppo_kernel, hand_over_grads
from kernels.ppo_loss import _token_loss_torch, ppo_launch_args, ppo_stats
from kernels.token_logprobs import (_acc_dtype, _token_logprobs_bwd, _token_logprobs_fwd, log_softmax_rows,
                                    logits_grad_rows_, row_launch_args, scaled)

OBJECTIVES = ("ppo", "gspo", "gspo_token", "cispo")  # the policy term (module docstring)

# Logits per token chunk on CPU (256 MiB of fp32): at V=151936 that is C=441 tokens. Each chunk is one more pass
# over the (V, H) weight and its fp32 gradient: at Qwen2.5-0.5B's shape, 336 tokens, the update (bench_update.py)
# took 16.3 s against 19.1 s at the earlier 1 << 23 (C=55, 7 chunks) in fp32 and 11.7 s against 12.8 s in bf16
# (docs/speed.md, "The update at the 0.5B shape"). The transients are two (C, V) fp32 buffers (536 MB at C=441),
# over the 1/8-of-unfused memory goal of bench_kernels.py at T=4096 (C=55 met it: 616 MB vs 5392 MB unfused);
# host memory is not what limits a CPU run, the time is.
_CHUNK_LOGITS = 1 << 26
_CHUNK_LOGITS_CUDA = 1 << 26  # CUDA: C=441 tokens at V=151936 (one program per row: 3 waves on 132 SMs, not 0.4),
# about 400 MB of transients in bf16; not yet measured on a GPU (no GPU has been lent to this project)


def default_chunk(V: int, cuda: bool) -> int:
    """Tokens per chunk when the caller gives none: _CHUNK_LOGITS_CUDA // V on CUDA (441 at V=151936),
    _CHUNK_LOGITS // V on CPU (also 441), at least 1."""
    return max(1, (_CHUNK_LOGITS_CUDA if cuda else _CHUNK_LOGITS) // V)


def _chunk_logits(h, weight, bias, chunk, with_scratch):
    """Yields (sl, z, scratch) per chunk of at most chunk tokens (default: default_chunk) covering h's N rows:
    z = h[sl] @ weight.T (+ bias) (C, V) in h's dtype and, if with_scratch, a (C, V) scratch in the accumulation
    dtype. Both live in buffers allocated once and overwritten by every chunk (no allocator churn: with fresh
    tensors per chunk glibc kept about three more (C, V) buffers resident, measured at V=151936 on CPU)."""
    N, V = h.shape[0], weight.shape[0]
    C = max(1, min(N, chunk or default_chunk(V, h.is_cuda)))
    z_buf = torch.empty(C, V, device=h.device, dtype=h.dtype)
    s_buf = torch.empty(C, V, device=h.device, dtype=_acc_dtype(h)) if with_scratch else None
    for s in range(0, N, C):
        sl = slice(s, min(s + C, N))
        z = z_buf[: sl.stop - s]  # (C, V)
        if bias is None:
            torch.mm(h[sl], weight.T, out=z)
        else:
            torch.addmm(bias, h[sl], weight.T, out=z)
        yield sl, z, None if s_buf is None else s_buf[: sl.stop - s]


@functools.cache
def addmm_fp32_out(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether addmm's dtype overload takes `dtype` operands with an fp32 self and output on `device` (tensor cores
    accumulating into fp32): torch 2.8 and 2.9 have the overload but their CUDA addmm refuses an fp32 self; CPU has no
    kernel for it. Probed once per device and dtype on 2 x 2 tensors; where it fails, the weight gradient is
    accumulated by an fp32 addmm_ (the same sum, without tensor cores)."""
    if not hasattr(torch.ops.aten.addmm, "dtype_out"):
        return False
    acc, a = torch.zeros(2, 2, device=device), torch.ones(2, 2, device=device, dtype=dtype)
    try:
        torch.ops.aten.addmm.dtype_out(acc, a, a, torch.float32, out=acc)
    except (RuntimeError, TypeError):  # NotImplementedError (no kernel) is a RuntimeError; a refused dtype mix too
        return False
    return bool((acc == 2).all())


class _Grads:
    """dh (N, H) in h's dtype, dweight / dbias accumulated in fp32 (fp64 for fp64) over the chunks; each of the
    three only if needed."""

    def __init__(self, h, weight, bias, needs):
        self.dh = torch.empty_like(h) if needs[0] else None
        acc = _acc_dtype(weight)
        self.dw = torch.zeros(weight.shape, device=weight.device, dtype=acc) if needs[1] else None
        self.db = torch.zeros(weight.shape[0], device=weight.device, dtype=acc) if needs[2] else None

    def add(self, sl, dz, h_c, weight) -> None:
        """Chunk sl's logits gradient dz (C, V) -> its rows of dh, its share of dweight / dbias."""
        if self.dh is not None:
            self.dh[sl] = torch.mm(dz.to(weight.dtype), weight)  # (C, H)
        if self.dw is None:
            pass
        elif h_c.dtype == self.dw.dtype:
            self.dw.addmm_(dz.T, h_c)  # (V, H) += (V, C) @ (C, H)
        elif self.dw.is_cuda and h_c.dtype in (torch.bfloat16, torch.float16) and addmm_fp32_out(self.dw.device,
                                                                                                  h_c.dtype):
            torch.ops.aten.addmm.dtype_out(self.dw, dz.T.to(h_c.dtype), h_c, torch.float32, out=self.dw)  # tensor
            # cores, fp32 accumulation
        elif not self.dw.is_cuda:  # CPU (no addmm dtype_out): the chunk's product in h's dtype (AVX512_BF16 / AMX
            self.dw.add_(torch.mm(dz.T.to(h_c.dtype), h_c))  # GEMM), added into fp32: one rounding per chunk
        else:
            self.dw.addmm_(dz.T.to(self.dw.dtype), h_c.to(self.dw.dtype))
        if self.db is not None:
            self.db += dz.sum(0, dtype=self.db.dtype)

    def result(self, weight, bias) -> tuple:
        """(dh, dweight, dbias) in the inputs' dtypes, None where not needed."""
        return (self.dh, None if self.dw is None else self.dw.to(weight.dtype),
                None if self.db is None else self.db.to(bias.dtype))


def _needs_grad(h, weight, bias) -> tuple:
    """Which of h, weight, bias get a gradient (none under torch.no_grad)."""
    on = torch.is_grad_enabled()
    return tuple(on and x is not None and x.requires_grad for x in (h, weight, bias))


def _ppo_rows_torch(z, scratch, sl, tgt, ins, outs, cfg, write_grad):
    """Torch row step of chunk sl: z (C, V) logits (consumed) -> outs[...][sl] filled, dz (C, V) (in scratch)
    or None."""
    T = cfg["temperature"]
    zs = scaled(z, T, inplace=True)  # (C, V), in z's buffer unless h is bf16 / fp16
    lsm, logp, _, ent = log_softmax_rows(zs, tgt, True, out=scratch, scratch=zs)  # (C, V) log p in scratch
    old, adv, ref, w, onp = (None if x is None else x[sl] for x in ins)
    logp.requires_grad_(write_grad)
    with torch.enable_grad():
        old_c = old if onp is None else torch.where(onp, logp.detach() + old, old)  # on-policy: old holds an offset
        l, ratio, clipped = _token_loss_torch(logp, old_c, adv, ref, cfg["clip_low"], cfg["clip_high"],
                                              cfg["dual_clip"], cfg["kl_coef"], cfg["cispo"])
        tok = torch.where(w != 0, w * (l - cfg["entropy_coef"] * ent), 0.0)  # (C,)
        g_logp = torch.autograd.grad(tok.sum(), logp)[0] * cfg["grad_scale"] if write_grad else None
    outs["logp"][sl] = torch.where(w != 0, logp.detach(), 0.0)
    outs["ent"][sl] = torch.where(w != 0, ent, 0.0)
    outs["tok"][sl], outs["ratio"][sl], outs["clipped"][sl] = tok.detach(), ratio.detach(), clipped
    if not write_grad:
        return None
    g_ent = -cfg["grad_scale"] * cfg["entropy_coef"] * w if cfg["entropy_coef"] != 0.0 else None
    dz = logits_grad_rows_(lsm, tgt, ent, g_logp, g_ent, scratch=zs)  # (C, V)
    return dz if T == 1.0 else dz.div_(T)


def _ppo_rows_triton(z, scratch, sl, tgt, ins, outs, cfg, write_grad):
    """Triton row step of chunk sl: _fused_logits_ppo_kernel on z (C, V), dlogits written over z."""
    old, adv, ref, w, onp = ins
    ptrs, scalars = ppo_launch_args(old[sl], adv[sl], None if ref is None else ref[sl], cfg["clip_low"],
                                    cfg["clip_high"], cfg["dual_clip"], cfg["kl_coef"], cfg["cispo"])
    x = z.unsqueeze(0)  # (1, C, V)
    _fused_logits_ppo_kernel[(z.shape[0],)](
        x, x, tgt, *ptrs, w[sl], w[sl] if onp is None else onp[sl],
        *(outs[k][sl] for k in ("logp", "ent", "tok", "ratio", "clipped")),
        grad_scale=cfg["grad_scale"], entropy_coef=cfg["entropy_coef"], HAS_ENT_COEF=cfg["entropy_coef"] != 0.0,
        WRITE_GRAD=write_grad, ON_POLICY=onp is not None, **scalars, **row_launch_args(x, cfg["temperature"]))
    return z if write_grad else None


class _FusedLinearPPOLoss(torch.autograd.Function):
    """Forward computes the loss and the gradients of h, weight, bias; backward hands them over."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, ins, cfg, needs, triton_rows, chunk):
        N = h.shape[0]
        outs = {k: torch.empty(N, device=h.device, dtype=_acc_dtype(h)) for k in ("logp", "ent", "tok", "ratio")}
        outs["clipped"] = torch.empty(N, device=h.device, dtype=torch.int8)
        grads = _Grads(h, weight, bias, needs)
        row_step = _ppo_rows_triton if triton_rows else _ppo_rows_torch
        for sl, z, scratch in _chunk_logits(h, weight, bias, chunk, not triton_rows):
            dz = row_step(z, scratch, sl, targets[sl], ins, outs, cfg, any(needs))  # (C, V)
            if dz is not None:
                grads.add(sl, dz, h[sl], weight)
        ctx.grads = grads.result(weight, bias) if any(needs) else None
        ctx.grad_scale = cfg["grad_scale"]
        ctx.mark_non_differentiable(outs["logp"], outs["ent"], outs["ratio"], outs["clipped"])
        return outs["tok"].sum(), outs["logp"], outs["ent"], outs["ratio"], outs["clipped"]

    @staticmethod
    def backward(ctx, g_loss, *_):
        return hand_over_grads(ctx, g_loss, "fused_linear_ppo_loss") + (None,) * 6


def fused_linear_ppo_loss(h, weight, targets, old_logp, adv, w, clip_low=0.2, clip_high=0.28, dual_clip=None,
                          ref_logp=None, kl_coef=0.0, temperature=1.0, entropy_coef=0.0, grad_scale=1.0, bias=None,
                          on_policy=None, impl="auto", chunk=None, objective="ppo", seq_lens=None):
    """h (N, H), weight (V, H) -> (scalar loss, logp (N,), ent (N,), stats); see the module docstring."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if dual_clip is not None and objective != "ppo":
        raise ValueError(f"dual_clip bounds the ppo token clip; objective {objective} has none")
    if objective.startswith("gspo") and seq_lens is None:
        raise ValueError(f"objective {objective} needs seq_lens (its sequence ratios)")
    triton_path = use_triton(impl, h, weight, bias, targets, old_logp, adv, w, ref_logp, on_policy)
    valid = w != 0  # (N,)
    acc = _acc_dtype(h)

    def clean(x):  # (N,) constant in the accumulation dtype, 0 at tokens with w == 0 (whatever they hold)
        return None if x is None else torch.where(valid, x.detach().to(acc), 0.0).contiguous()

    ref = ref_logp if kl_coef != 0.0 else None
    old, a, wt = clean(old_logp), clean(adv), w.detach().to(acc).contiguous()
    onp = None if on_policy is None else on_policy.bool().contiguous()
    if onp is not None:  # on-policy tokens: old = logp + 0
        old = torch.where(onp, 0.0, old)
    if objective.startswith("gspo"):
        old, a, onp = _gspo_inputs(h, weight, bias, targets, old, a, wt, onp, seq_lens, temperature, impl, chunk,
                                   objective == "gspo")
    ins = (old, a, clean(ref), wt, onp)
    cfg = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, kl_coef=kl_coef,
               temperature=float(temperature), entropy_coef=float(entropy_coef), grad_scale=float(grad_scale),
               cispo=objective == "cispo")
    loss, logp, ent, ratio, clipped = _FusedLinearPPOLoss.apply(
        h, weight, bias, targets.contiguous(), ins, cfg, _needs_grad(h, weight, bias), triton_path, chunk)
    old = old if onp is None else torch.where(onp, logp + old, old)  # (N,) the old_i of the loss
    return loss, logp, ent, ppo_stats(ratio, clipped, logp, old, w, ent)


def _gspo_inputs(h, weight, bias, targets, old, adv, w, onp, seq_lens, temperature, impl, chunk, per_sequence):
    """GSPO's first pass (module docstring): old, adv, w (N,) cleaned, onp (N,) bool or None, seq_lens (S,) ->
    (old (N,) = -log s_j, adv (N,), on-policy (N,) all True): the token pass then takes old_i = logp_i - log s_j,
    ratio s_j, d ratio / d logp_i = s_j. per_sequence (gspo): adv_i * wbar_j / w_i with wbar_j the mean of w over
    j's kept tokens, so the clipped term, positively homogeneous in adv, is weighted by wbar_j (sum over j's tokens:
    W_j) while the KL and entropy terms keep w_i."""
    valid = w != 0  # (N,)
    seq = torch.repeat_interleave(torch.arange(len(seq_lens), device=w.device), seq_lens.to(w.device),
                                  output_size=len(w))  # (N,) each token's sequence
    need = valid if onp is None else valid & ~onp  # (N,) kept tokens whose logp - old is not 0 by definition
    d = torch.zeros_like(old)  # (N,) logp - old
    if need.any():
        idx = need.nonzero()[:, 0]
        with torch.no_grad():
            lp, _ = linear_token_logprobs(h[idx], weight, targets[idx], temperature, bias=bias, impl=impl, chunk=chunk)
        d[idx] = lp.to(d.dtype) - old[idx]
    n = torch.zeros(len(seq_lens), device=w.device, dtype=w.dtype).index_add_(0, seq, valid.to(w.dtype))  # (S,)
    log_s = (torch.zeros_like(n).index_add_(0, seq, d) / n.clamp(min=1)).clamp(-20, 20)  # (S,) mean log-ratio
    if per_sequence:
        wbar = torch.zeros_like(n).index_add_(0, seq, w) / n.clamp(min=1)  # (S,)
        adv = torch.where(valid, adv * wbar[seq] / torch.where(valid, w, 1.0), 0.0)  # (N,)
    return -log_s[seq], adv, torch.ones_like(valid)


class _LinearTokenLogprobs(torch.autograd.Function):
    """Forward saves h, weight, bias and per-row lse (lse2 on the Triton path) and ent; backward recomputes each
    chunk's logits."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, with_entropy, needs, triton_rows, chunk):
        ctx.set_materialize_grads(False)
        N = h.shape[0]
        logp, lse = (torch.empty(N, device=h.device, dtype=_acc_dtype(h)) for _ in range(2))
        ent = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for sl, z, scratch in _chunk_logits(h, weight, bias, chunk, not triton_rows):
            if triton_rows:
                x = z.unsqueeze(0)  # (1, C, V)
                _token_logprobs_fwd[(z.shape[0],)](x, targets[sl], logp[sl], lse[sl], ent[sl] if with_entropy
                                                   else ent, WITH_ENT=with_entropy,
                                                   **row_launch_args(x, temperature))
            else:
                zs = scaled(z, temperature, inplace=True)  # (C, V)
                _, logp[sl], lse[sl], ent_c = log_softmax_rows(zs, targets[sl], with_entropy, out=scratch, scratch=zs)
                if with_entropy:
                    ent[sl] = ent_c
        if any(needs):
            ctx.save_for_backward(h, weight, bias, targets, lse, ent)
        ctx.cfg = (temperature, needs, triton_rows, chunk)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        h, weight, bias, targets, lse, ent = ctx.saved_tensors
        temperature, needs, triton_rows, chunk = ctx.cfg
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(lse.dtype).contiguous()  # (N,)
        with_entropy = g_ent is not None and ent.numel() > 0
        g_ent = g_ent.to(lse.dtype).contiguous() if with_entropy else None  # (N,)
        grads = _Grads(h, weight, bias, needs)
        for sl, z, scratch in _chunk_logits(h, weight, bias, chunk, not triton_rows):
            if triton_rows:
                x = z.unsqueeze(0)  # (1, C, V), dlogits written over it
                _token_logprobs_bwd[(z.shape[0],)](x, x, targets[sl], lse[sl], ent[sl] if with_entropy else ent,
                                                   g_logp[sl], g_ent[sl] if with_entropy else g_logp[sl],
                                                   WITH_ENT=with_entropy, **row_launch_args(x, temperature))
                dz = z
            else:
                lsm = scaled(z, temperature, inplace=True).sub_(lse[sl, None])  # (C, V) log p
                dz = logits_grad_rows_(lsm, targets[sl], ent[sl] if with_entropy else None, g_logp[sl],
                                       g_ent[sl] if with_entropy else None, scratch)
                dz = dz if temperature == 1.0 else dz.div_(temperature)
            grads.add(sl, dz, h[sl], weight)
        return grads.result(weight, bias) + (None,) * 6


def linear_token_logprobs(h, weight, targets, temperature=1.0, with_entropy=False, bias=None, impl="auto",
                          chunk=None):
    """h (N, H), weight (V, H), targets (N,) -> (logp (N,) fp32, ent (N,) fp32 or None); module docstring."""
    logp, ent = _LinearTokenLogprobs.apply(h, weight, bias, targets.contiguous(), float(temperature), with_entropy,
                                           _needs_grad(h, weight, bias), use_triton(impl, h, weight, bias, targets),
                                           chunk)
    return logp, (ent if with_entropy else None)

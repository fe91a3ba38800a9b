"""kernels/fused_linear.py against the unfused fp64 composition: logits = h @ W.T + b, log_softmax, gather, the
paper-form PPO token loss (test_kernels' references), forward and gradients for h, W and b.

Odd shapes (N not a multiple of the chunk, V = 1001, H odd), torch and Triton row steps (the Triton kernels run
in the interpreter on CPU tensors, at smaller shapes with the vocabulary block lowered so rows span several
blocks). Inputs are rounded to the tested dtype first; the reference sees the rounded values.
"""
import importlib

import pytest
import torch
from test_kernels import DEV, close, make_ppo_inputs, ref_aggregate, ref_ppo_tokens, ref_stats, ref_token_logprobs

from kernels import fused_linear_ppo_loss, linear_token_logprobs, token_weights
from kernels.ppo_loss import agg_weights

# (atol, rtol) vs fp64; grad atol relative to the largest |gradient|. The reference rounds its logits to the
# tested dtype as the lm_head GEMM does (ref_logits), so bf16 forward errors are fp32 arithmetic, 1.5e-6 measured
# on CPU; the bf16 atol leaves room for a logit that a GEMM with another summation order rounds one ulp the
# other way. bf16 gradients: dh and dW are returned in bf16 (relative rounding up to 2^-8), dlogits are rounded
# to bf16 before the dh GEMM; measured up to 7.8e-3 of the largest gradient
TOL = {
    torch.float32: {"fwd": (1e-5, 1e-5), "grad": (1e-5, 1e-5)},
    torch.bfloat16: {"fwd": (1e-3, 1e-5), "grad": (2e-2, 1e-2)},
}
FUSED_LINEAR = importlib.import_module("kernels.fused_linear")
SHAPES = {"torch": (37, 19, 1001), "triton": (13, 11, 301)}  # (N, H, V); interpreter time grows with N * V


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 2 tokens at V = 1001 (N = 37), 6 at V = 301 (N = 13): ragged last chunks; several vocabulary
    blocks per row."""
    chunk_logits(monkeypatch, 2100)
    if DEV == "cpu":
        monkeypatch.setattr(importlib.import_module("kernels.token_logprobs"), "MAX_BLOCK_V", 128)


def chunk_logits(monkeypatch, n: int) -> None:
    """Chunks of n // V tokens on every device: CUDA tensors take _CHUNK_LOGITS_CUDA, CPU ones _CHUNK_LOGITS."""
    monkeypatch.setattr(FUSED_LINEAR, "_CHUNK_LOGITS", n)
    monkeypatch.setattr(FUSED_LINEAR, "_CHUNK_LOGITS_CUDA", n)


def make_linear(N, H, V, dtype, bias, seed=0):
    """h (N, H), W (V, H), b (V,) or None rounded to dtype (logits of scale ~2), targets; -> (inputs in dtype as
    leaves, the same as fp64 leaves, targets)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g)
    W = 2 * torch.randn(V, H, generator=g) / H ** 0.5
    b = 0.5 * torch.randn(V, generator=g) if bias else None
    tgt = torch.randint(0, V, (N,), generator=g).to(DEV)
    xs = [None if x is None else x.to(dtype).to(DEV) for x in (h, W, b)]
    return ([None if x is None else x.clone().requires_grad_(True) for x in xs],
            [None if x is None else x.double().requires_grad_(True) for x in xs], tgt)


def ref_logits(h, W, b, dtype):
    """fp64 (N, V) logits of the unfused path, their values rounded to dtype as an lm_head in dtype outputs them
    (the gradient is that of the unrounded logits)."""
    z = h @ W.T if b is None else h @ W.T + b  # (N, V)
    return z + (z.to(dtype).double() - z).detach()


def ref_linear_ppo(h, W, b, dtype, tgt, old, adv, ref, w, onp, T, ec, dual_clip, kl_coef):
    """fp64 loss sum(w * (l - ec * ent)), logp, ent, ratio, clipped, effective old (N,); on-policy old = logp."""
    logp, ent = ref_token_logprobs(ref_logits(h, W, b, dtype), tgt, T)
    old = old.double() if onp is None else torch.where(onp, logp.detach(), old.double())
    tok, r, clipped = ref_ppo_tokens(logp, old, adv.double(), None if ref is None else ref.double(), 0.2, 0.28,
                                     dual_clip, kl_coef)
    loss = torch.where(w > 0, w.double() * (tok - ec * ent), 0.0).sum()
    return loss, logp, ent, r, clipped, old


def ppo_inputs(logp, seed=3):
    """Flat (N,) old, adv, ref around the policy's log-probs logp (N,), |logp - old| <= 1.5 (ratios 0.22..4.5:
    some clip, some dual-clip), token-mean w (some 0), on-policy flags (every third token)."""
    logp0, old, adv, ref, mask = (x[0] for x in make_ppo_inputs(1, len(logp), True, seed=seed))
    old_p = logp.detach().float() - (logp0 - old).clamp(-1.5, 1.5)  # (N,)
    onp = (torch.arange(len(logp)) % 3 == 0).to(DEV)
    return old_p, adv, old_p + (ref - old), mask / mask.sum(), onp


PPO_CASES = {  # name: (temperature, entropy_coef, dual_clip, kl_coef, bias, on_policy, grad_scale, upstream)
    "plain": (1.0, 0.0, None, 0.0, False, False, 1.0, 1.0),
    "all-terms": (0.7, 0.01, 1.5, 0.1, True, True, 0.25, 0.25),
    "rescaled": (1.3, 0.02, 10.0, 0.0, True, False, 1.0, 0.3),
}


def check_fused_linear(impl, dtype, case, N, H, V):
    """Loss, logp, ent, stats and the h / W / b gradients against the fp64 unfused composition."""
    T, ec, dual_clip, kl_coef, bias, on_policy, grad_scale, upstream = PPO_CASES[case]
    (h, W, b), (h64, W64, b64), tgt = make_linear(N, H, V, dtype, bias)
    old, adv, ref, w, onp = ppo_inputs(ref_token_logprobs(ref_logits(h64, W64, b64, dtype), tgt, T)[0])
    onp = onp if on_policy else None
    ref = ref if kl_coef else None
    loss, logp, ent, stats = fused_linear_ppo_loss(h, W, tgt, old, adv, w, 0.2, 0.28, dual_clip, ref, kl_coef, T, ec,
                                                   grad_scale, b, onp, impl)
    want, lp64, ent64, r, clipped, old64 = ref_linear_ppo(h64, W64, b64, dtype, tgt, old, adv, ref, w, onp, T, ec,
                                                          dual_clip, kl_coef)
    tol = TOL[dtype]
    close(loss, want, tol["fwd"], "loss")
    valid = w > 0
    close(logp, torch.where(valid, lp64, 0.0), tol["fwd"], "logp")
    close(ent, torch.where(valid, ent64, 0.0), tol["fwd"], "ent")
    want_stats = ref_stats(lp64.detach(), old64, r.detach(), clipped, valid.double())
    want_stats["entropy"] = ent64[valid].mean().item()
    assert stats == pytest.approx(want_stats, rel=10 * tol["fwd"][1], abs=10 * tol["fwd"][0])
    assert 0 < stats["clip_frac"] < 0.5  # clips are exercised
    leaves, leaves64 = [x for x in (h, W, b) if x is not None], [x for x in (h64, W64, b64) if x is not None]
    got = torch.autograd.grad(loss * upstream, leaves)
    wanted = torch.autograd.grad(want * upstream, leaves64)
    for name, g, g64, x in zip("hWb", got, wanted, leaves):
        assert g.dtype == x.dtype
        close(g, g64, tol["grad"], f"d{name}", scaled=True)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", TOL, ids=str)
@pytest.mark.parametrize("case", PPO_CASES)
def test_fused_linear_ppo_loss(impl, dtype, case):
    check_fused_linear(impl, dtype, case, *SHAPES[impl])


@pytest.mark.skipif(DEV == "cpu", reason="large shapes need CUDA")
@pytest.mark.parametrize("dtype", TOL, ids=str)
def test_fused_linear_ppo_loss_large(dtype, monkeypatch):
    """Qwen2.5-0.5B's head (H = 896, V = 151936), N = 300: chunks of 55 tokens (where the defaults, 441 tokens on
    CPU and CUDA, would take all 300 in one), the last ragged."""
    chunk_logits(monkeypatch, 1 << 23)
    check_fused_linear("triton", dtype, "all-terms", 300, 896, 151936)


@pytest.mark.parametrize("dtype", TOL, ids=str)
def test_weight_gradient_accumulates_over_ragged_chunks(dtype, monkeypatch):
    """A realistic hidden size (H = 896), several chunks with a ragged last one, and a weight gradient that is not
    zero when backward runs (an earlier micro-batch's): W.grad ends as that gradient plus this loss's, the chunks'
    dW summed in fp32 (CUDA: the full head, V = 151936, 300 tokens in 7 chunks; CPU: V = 4099, 37 tokens in 6)."""
    N, V = (300, 151936) if DEV == "cuda" else (37, 4099)
    chunk_logits(monkeypatch, V * (N // 6))  # C = N // 6: 6 full chunks and a ragged 7th on CUDA; 5 + 1 on CPU
    (h, W, _), (h64, W64, _), tgt = make_linear(N, 896, V, dtype, False, seed=4)
    old, adv, ref, w, onp = ppo_inputs(ref_token_logprobs(ref_logits(h64, W64, None, dtype), tgt, 1.0)[0])
    earlier = (torch.randn(W.shape, generator=torch.Generator().manual_seed(5)) * 1e-3).to(dtype).to(DEV)
    W.grad = earlier.clone()
    loss = fused_linear_ppo_loss(h, W, tgt, old, adv, w, 0.2, 0.28, None, None, 0.0, 1.0, 0.0, impl="auto")[0]
    loss.backward()
    want = ref_linear_ppo(h64, W64, None, dtype, tgt, old, adv, None, w, None, 1.0, 0.0, None, 0.0)[0]
    (dW64,) = torch.autograd.grad(want, [W64])
    close(W.grad, earlier.double() + dW64, TOL[dtype]["grad"], "W.grad", scaled=True)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", TOL, ids=str)
@pytest.mark.parametrize("with_entropy", [True, False])
def test_linear_token_logprobs(impl, dtype, with_entropy):
    """logp (+ ent) and the gradients of random upstream gradients of both, with bias and temperature 0.8."""
    N, H, V = SHAPES[impl]
    (h, W, b), (h64, W64, b64), tgt = make_linear(N, H, V, dtype, True, seed=1)
    logp, ent = linear_token_logprobs(h, W, tgt, 0.8, with_entropy, b, impl)
    lp64, ent64 = ref_token_logprobs(ref_logits(h64, W64, b64, dtype), tgt, 0.8)
    tol = TOL[dtype]
    assert logp.dtype == torch.float32 and logp.shape == (N,)
    close(logp, lp64, tol["fwd"], "logp")
    g = torch.Generator().manual_seed(2)
    g_logp = torch.randn(N, generator=g).to(DEV)
    out, want = (logp * g_logp).sum(), (lp64 * g_logp).sum()
    if with_entropy:
        close(ent, ent64, tol["fwd"], "ent")
        g_ent = torch.randn(N, generator=g).to(DEV)
        out, want = out + (ent * g_ent).sum(), want + (ent64 * g_ent).sum()
    else:
        assert ent is None
    for name, d, d64 in zip("hWb", torch.autograd.grad(out, (h, W, b)), torch.autograd.grad(want, (h64, W64, b64))):
        close(d, d64, tol["grad"], f"d{name}", scaled=True)


def test_fp64_gradcheck():
    """Torch path in fp64: linear_token_logprobs passes torch.autograd.gradcheck; the PPO loss's gradients match
    fp64 autograd through the unfused reference to 1e-10."""
    (h, W, b), _, tgt = make_linear(7, 5, 23, torch.float64, True)
    assert torch.autograd.gradcheck(
        lambda h, W, b: torch.stack(linear_token_logprobs(h, W, tgt, 0.9, True, b, "torch", chunk=3)), (h, W, b))
    (h, W, b), (h64, W64, b64), tgt = make_linear(37, 19, 1001, torch.float64, True)
    old, adv, ref, w, onp = ppo_inputs(ref_token_logprobs(ref_logits(h64, W64, b64, torch.float64), tgt, 0.7)[0])
    loss, *_ = fused_linear_ppo_loss(h, W, tgt, old, adv, w, 0.2, 0.28, 3.0, ref, 0.1, 0.7, 0.01, bias=b,
                                     on_policy=onp, impl="torch")
    want = ref_linear_ppo(h64, W64, b64, torch.float64, tgt, old, adv, ref, w, onp, 0.7, 0.01, 3.0, 0.1)[0]
    close(loss, want, (1e-12, 1e-12), "loss")
    for name, d, d64 in zip("hWb", torch.autograd.grad(loss, (h, W, b)), torch.autograd.grad(want, (h64, W64, b64))):
        close(d, d64, (1e-10, 1e-10), f"d{name}", scaled=True)


def small_ppo_case(impl, dtype=torch.float32, seed=0):
    """Inputs of the Triton-sized shape: (h, W, b) leaves, targets, old, adv, ref, w, on-policy flags."""
    (h, W, b), _, tgt = make_linear(*SHAPES["triton"], dtype, True, seed=seed)
    with torch.no_grad():
        lp = linear_token_logprobs(h, W, tgt, bias=b, impl=impl)[0]
    return (h, W, b), tgt, *ppo_inputs(lp)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_masked_tokens_hold_garbage(impl):
    """nan / inf in old_logp, adv, ref_logp at w == 0 tokens change nothing: same loss, gradients, stats, logp."""
    (h, W, b), tgt, old, adv, ref, w, onp = small_ppo_case(impl)
    masked = w == 0
    assert masked.any()
    out = []
    for garbage in (False, True):
        o, a, r = (torch.where(masked, torch.tensor(v).to(DEV), x) if garbage else x
                   for x, v in ((old, float("nan")), (adv, float("inf")), (ref, float("-inf"))))
        loss, logp, ent, stats = fused_linear_ppo_loss(h, W, tgt, o, a, w, dual_clip=3.0, ref_logp=r, kl_coef=0.1,
                                                       entropy_coef=0.01, bias=b, on_policy=onp, impl=impl)
        out.append((loss, logp, ent, *torch.autograd.grad(loss, (h, W, b)), stats))
    for clean, dirty in zip(out[0][:-1], out[1][:-1]):
        assert torch.equal(clean, dirty)
    assert out[0][-1] == out[1][-1]
    assert torch.all(out[0][1][masked] == 0) and torch.all(out[0][2][masked] == 0)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_all_masked(impl):
    """No valid token, or no token at all: loss 0, zero gradients, stats 0."""
    (h, W, b), tgt, old, adv, _, w, _ = small_ppo_case(impl)
    loss, _, _, stats = fused_linear_ppo_loss(h, W, tgt, old, adv, torch.zeros_like(w), bias=b, impl=impl)
    assert loss.item() == 0.0 and set(stats.values()) == {0.0}
    assert all(torch.all(g == 0) for g in torch.autograd.grad(loss, (h, W, b)))
    loss, logp, _, stats = fused_linear_ppo_loss(h[:0], W, tgt[:0], old[:0], adv[:0], w[:0], bias=b, impl=impl)
    assert loss.item() == 0.0 and logp.shape == (0,) and set(stats.values()) == {0.0}
    assert all(torch.all(g == 0) for g in torch.autograd.grad(loss, (W, b)))


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_tied_embedding_and_frozen_weight(impl):
    """A weight that is also the input embedding (h = W[src]) gets both gradients summed; a frozen weight gets
    none and h's gradient is unchanged; a no-grad forward computes no gradients."""
    N, H, V = SHAPES[impl]
    (_, W, _), (_, W64, _), tgt = make_linear(N, H, V, torch.float32, False)
    src = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(5)).to(DEV)
    old, adv, _, w, _ = ppo_inputs(ref_token_logprobs(ref_logits(W64[src], W64, None, torch.float32), tgt, 1.0)[0])
    loss, *_ = fused_linear_ppo_loss(W[src], W, tgt, old, adv, w, entropy_coef=0.01, impl=impl)
    want = ref_linear_ppo(W64[src], W64, None, torch.float32, tgt, old, adv, None, w, None, 1.0, 0.01, None, 0.0)[0]
    (dW,), (dW64,) = torch.autograd.grad(loss, (W,)), torch.autograd.grad(want, (W64,))
    close(dW, dW64, TOL[torch.float32]["grad"], "tied dW", scaled=True)
    h, h64 = W.detach()[src].requires_grad_(True), W64.detach()[src].requires_grad_(True)
    frozen = W.detach()
    loss, *_ = fused_linear_ppo_loss(h, frozen, tgt, old, adv, w, entropy_coef=0.01, impl=impl)
    loss.backward()
    want = ref_linear_ppo(h64, W64.detach(), None, torch.float32, tgt, old, adv, None, w, None, 1.0, 0.01, None,
                          0.0)[0]
    (dh64,) = torch.autograd.grad(want, (h64,))
    assert frozen.grad is None
    close(h.grad, dh64, TOL[torch.float32]["grad"], "dh, frozen W", scaled=True)
    with torch.no_grad():
        loss_ng, *_ = fused_linear_ppo_loss(h, W, tgt, old, adv, w, entropy_coef=0.01, impl=impl)
    assert not loss_ng.requires_grad and loss_ng.item() == pytest.approx(loss.item(), rel=1e-6)


def test_second_backward_refused():
    (h, W, b), tgt, old, adv, _, w, _ = small_ppo_case("torch")
    loss, *_ = fused_linear_ppo_loss(h, W, tgt, old, adv, w, bias=b, impl="torch")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_token_weights(agg):
    """Packed weights equal agg_weights of the padded layout token for token, and sum(w * l) is the reference
    aggregate; global denominators are used as given."""
    _, _, _, _, mask = make_ppo_inputs(5, 7, True)
    lens = torch.tensor([3, 7, 1, 5, 4], device=DEV)  # row b holds lens[b] tokens, left-aligned
    pad = (torch.arange(7, device=DEV) < lens[:, None]).float() * mask  # (B, T) padded layout's mask
    keep = torch.arange(7, device=DEV) < lens[:, None]
    w = token_weights(lens, agg, mask[keep])  # (N,) packed
    torch.testing.assert_close(w, agg_weights(pad, agg)[keep])
    tok = torch.randn(5, 7, generator=torch.Generator().manual_seed(1)).to(DEV)
    close((w * tok[keep]).sum(), ref_aggregate(tok.double(), pad.double(), agg), (1e-6, 1e-6), "aggregate")
    scale = 4.0 if agg == "token-mean" else 3.0
    w_global = token_weights(lens, agg, mask[keep], n_tokens=pad.sum() * scale, n_seqs=(pad.sum(1) > 0).sum() * scale)
    torch.testing.assert_close(w_global, w / scale)


def test_fp32_out_addmm_is_probed_not_assumed():
    """addmm_fp32_out probes the dtype overload once per device and dtype: on CPU (no kernel for it) it says no
    instead of raising, as it must on CUDA torch 2.8-2.9 (the overload exists, an fp32 self is refused); where it says
    yes, the probe's sum is right."""
    probe = FUSED_LINEAR.addmm_fp32_out
    assert probe(torch.device("cpu"), torch.bfloat16) is False
    if torch.cuda.is_available():
        assert probe(torch.device("cuda"), torch.bfloat16) in (True, False)  # either way without an error


def test_bf16_weight_gradient_accumulates_in_fp32(monkeypatch):
    """bf16 h and W (CPU: each chunk's dW product a bf16 GEMM, added into the fp32 accumulator; CUDA: addmm's fp32
    output): chunks 1 and 3 hold the same tokens with advantages +1 and -1, chunk 2 others with 1e-3, so dW is chunk
    2's alone, added between +L and -L. An accumulator in bf16 loses it (relative error about 1); fp32 keeps it
    (gpu_probes.py's weight-gradient probe at a CPU size, with chunk 2 on chunk 1's targets). Relative Frobenius
    error against fp64 <= 2e-2."""
    C, H, V = 16, 64, 4099
    chunk_logits(monkeypatch, V * C)
    g = torch.Generator().manual_seed(0)
    h1, h2 = (torch.randn(C, H, generator=g).to(torch.bfloat16) for _ in range(2))
    t1 = torch.randint(0, V, (C,), generator=g)
    h, tgt = torch.cat([h1, h2, h1]).to(DEV), torch.cat([t1, t1, t1]).to(DEV)  # chunk 3 repeats chunk 1; chunk 2
    # has its targets, so its share lands on the rows chunks 1 and 3 cancel on
    adv = torch.cat([torch.full((C,), a) for a in (1.0, 1e-3, -1.0)]).to(DEV)  # (3C,)
    W = (2 * torch.randn(V, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(DEV)
    w = torch.full((3 * C,), 1 / (3 * C), device=DEV)
    W64 = W.double().requires_grad_(True)
    z = h.double() @ W64.T
    z = z + (z.to(torch.bfloat16).double() - z).detach()  # the values the bf16 GEMM rounds to
    (dW64,) = torch.autograd.grad(-(w * adv).double() @ torch.log_softmax(z, -1).gather(-1, tgt[:, None])[:, 0],
                                  [W64])
    W1 = W.clone().requires_grad_(True)
    fused_linear_ppo_loss(h, W1, tgt, torch.zeros_like(adv), adv, w, on_policy=torch.ones_like(tgt, dtype=torch.bool),
                          impl="torch")[0].backward()
    assert W1.grad.dtype == torch.bfloat16
    err = float((W1.grad.double() - dW64).norm() / dW64.norm())
    assert err <= 2e-2, err

"""kernels/ against independent fp64 references, forward and gradients, Triton and torch paths.

Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors (kernels/_common.jit), at small odd
shapes with the vocabulary / token blocks lowered so every row spans several blocks with a ragged tail. With
CUDA the same tests run on the GPU, plus the large shapes (V = 151936).
Inputs are rounded to the tested dtype first; the references see the rounded values, so the tolerances below
measure the kernels' arithmetic and output rounding only.
"""
import importlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import discounted_returns, fused_logits_ppo_loss, implicit_prm_rewards, ppo_loss, token_logprobs

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
IMPLS = ["triton", "torch"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (atol, rtol) vs fp64. fwd: logp / ent / loss (fp32 arithmetic); grad: dlogits, stored in the logits' dtype
# (bf16 keeps 8 bits: relative rounding 2^-9, fp16 2^-11), atol relative to the largest |dlogit|
TOL = {
    torch.float32: {"fwd": (5e-5, 1e-5), "grad": (1e-5, 1e-4)},
    torch.bfloat16: {"fwd": (5e-5, 1e-5), "grad": (1e-5, 8e-3)},
    torch.float16: {"fwd": (5e-5, 1e-5), "grad": (1e-5, 2e-3)},
}
large = pytest.mark.skipif(not CUDA, reason="large shapes need CUDA")


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Several vocabulary blocks / torch chunks / scan chunks per row even at the small CPU shapes."""
    if not CUDA:
        monkeypatch.setattr(importlib.import_module("kernels.token_logprobs"), "MAX_BLOCK_V", 128)
        monkeypatch.setattr(importlib.import_module("kernels.prm_reward"), "MAX_BLOCK_T", 16)
    monkeypatch.setattr(importlib.import_module("kernels.token_logprobs"), "_CHUNK_ELEMS", 1000)


def close(got, want, tol, what, scaled=False):
    """assert_close of got against the fp64 reference with an (atol, rtol) pair; scaled: atol * max |want|."""
    atol = tol[0] * (want.abs().max().item() if scaled else 1.0)
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=tol[1], msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------- fp64 references
def ref_token_logprobs(x, tgt, temperature):
    """x (..., V) fp64 -> logp, ent (...) by logsumexp; -inf logits become a constant that gets no gradient."""
    z = torch.where(torch.isinf(x), torch.full_like(x, -1e4), x / temperature)
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, tgt[..., None]).squeeze(-1) - lse
    ent = lse - (torch.softmax(z, -1) * z).sum(-1)
    return logp, ent


def ref_ppo_tokens(logp, old, adv, ref, clip_low, clip_high, dual_clip, kl_coef):
    """Paper form: l = -min(r A, clip(r) A), then max with the dual bound c A for A < 0; k3 KL; clip flags."""
    r = torch.exp(torch.clamp(logp - old, -20, 20))
    surr = torch.minimum(r * adv, torch.clamp(r, 1 - clip_low, 1 + clip_high) * adv)
    clipped = ((adv > 0) & (r > 1 + clip_high)) | ((adv < 0) & (r < 1 - clip_low))
    if dual_clip is not None:
        dual = (adv < 0) & (surr < dual_clip * adv)
        surr = torch.where(dual, dual_clip * adv, surr)
        clipped = clipped | dual
    loss = -surr
    if ref is not None:
        u = torch.clamp(ref - logp, -20, 20)
        loss = loss + kl_coef * (torch.exp(u) - u - 1)
    return loss, r, clipped


def ref_aggregate(tok, mask, agg):
    """Row by row: token mean over all valid tokens, or the mean over rows with a valid token of their mean / sum."""
    if agg == "token-mean":
        return (tok * mask).sum() / max(mask.sum().item(), 1)
    rows = [(tok[b] * mask[b]).sum() / (mask[b].sum() if agg == "seq-mean-token-mean" else 1)
            for b in range(tok.shape[0]) if mask[b].sum() > 0]
    return sum(rows) / len(rows) if rows else tok.sum() * 0


def ref_stats(logp, old, r, clipped, mask):
    """The four ppo stats over valid tokens."""
    v = mask > 0
    if not v.any():
        return dict(clip_frac=0.0, approx_kl=0.0, ratio_mean=0.0, ratio_max=0.0)
    return dict(clip_frac=clipped[v].double().mean().item(), approx_kl=(old - logp)[v].mean().item(),
                ratio_mean=r[v].mean().item(), ratio_max=r[v].max().item())


def ref_returns(r, mask, gamma):
    """Python loop over t: run_t = m_t r_t + gamma run_(t+1), G_t = m_t run_t."""
    G, run = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        run = mask[:, t] * r[:, t] + gamma * run
        G[:, t] = mask[:, t] * run
    return G


# ---------------------------------------------------------------- inputs
def make_logits(shape, dtype, neg_inf=False, seed=0):
    """Random logits (scale 3) rounded to dtype, optionally with -inf entries (a masked vocabulary slice);
    -> (x in dtype, x as fp64, targets); targets always point at finite logits."""
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*shape, generator=g)).to(dtype)
    tgt = torch.randint(0, shape[-1], shape[:-1], generator=g)
    if neg_inf:
        x[..., : shape[-1] // 3] = float("-inf")
        x.view(-1, shape[-1])[0, -1] = float("-inf")
        tgt = tgt.clamp(min=shape[-1] // 3)
        tgt.view(-1)[0] = shape[-1] // 2
    return x.to(DEV), x.double().to(DEV), tgt.to(DEV)


def make_ppo_inputs(B, T, adv_2d, seed=0):
    """logp (some beyond the +-20 clamp), old, adv, ref, mask with a fully masked row and a ragged one."""
    g = torch.Generator().manual_seed(seed)
    old = -2 + torch.randn(B, T, generator=g)
    logp = old + 0.5 * torch.randn(B, T, generator=g)
    logp[0, 0], logp[-1, -1] = old[0, 0] + 25, old[-1, -1] - 25
    adv = torch.randn(B, T, generator=g) if adv_2d else torch.randn(B, generator=g)
    adv.view(-1)[0] = -1.0  # with ratio e^20 at [0, 0]: unclipped unless dual clip, but the clamp cuts the gradient
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    mask[0, 0] = mask[-1, -1] = 1.0
    if B > 2:
        mask[1] = 0.0
        mask[2, T // 2:] = 0.0
    return [t.to(DEV) for t in (logp, old, adv, ref, mask)]


# ---------------------------------------------------------------- token_logprobs
LOGPROB_CASES = {  # name: (shape, temperature, with_entropy, -inf logits, sliced (B, T + 1, V)[:, :-1])
    "odd": ((7, 1001), 0.7, True, False, False),
    "single-token": ((1, 257), 1.0, True, False, False),
    "no-entropy": ((5, 300), 1.3, False, False, False),
    "neg-inf": ((6, 259), 1.0, True, True, False),
    "btv-slice": ((2, 5, 131), 0.9, True, False, True),
    "large": ((64, 151936), 0.8, True, False, False),
}


def check_token_logprobs(impl, dtype, shape, temperature, with_entropy, neg_inf, sliced):
    """Forward and dlogits for random upstream gradients of logp and ent against the fp64 reference."""
    full = (shape[0], shape[1] + 1, shape[2]) if sliced else shape
    x_full, x64_full, tgt = make_logits(full, dtype, neg_inf)
    tgt = tgt[:, :-1] if sliced else tgt
    x_full.requires_grad_(True)
    x64_full.requires_grad_(True)
    x, x64 = (x_full[:, :-1], x64_full[:, :-1]) if sliced else (x_full, x64_full)
    logp, ent = token_logprobs(x, tgt, temperature, with_entropy=with_entropy, impl=impl)
    want_logp, want_ent = ref_token_logprobs(x64, tgt, temperature)
    tol = TOL[dtype]
    assert logp.dtype == torch.float32 and logp.shape == tgt.shape
    close(logp, want_logp, tol["fwd"], "logp")
    g = torch.Generator().manual_seed(1)
    g_logp = torch.randn(tgt.shape, generator=g).to(DEV)
    out, want = (logp * g_logp).sum(), (want_logp * g_logp).sum()
    if with_entropy:
        close(ent, want_ent, tol["fwd"], "ent")
        g_ent = torch.randn(tgt.shape, generator=g).to(DEV)
        out, want = out + (ent * g_ent).sum(), want + (want_ent * g_ent).sum()
    else:
        assert ent is None
    (dx,) = torch.autograd.grad(out, x_full)
    (want_dx,) = torch.autograd.grad(want, x64_full)
    assert dx.dtype == dtype
    close(dx, want_dx, tol["grad"], "dlogits", scaled=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [c for c in LOGPROB_CASES if c != "large"])
def test_token_logprobs(impl, dtype, case):
    check_token_logprobs(impl, dtype, *LOGPROB_CASES[case])


@large
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_token_logprobs_large(dtype):
    check_token_logprobs("triton", dtype, *LOGPROB_CASES["large"])


def test_token_logprobs_only_entropy_gradient():
    """Backward with no gradient for logp (entropy bonus alone)."""
    x, x64, tgt = make_logits((3, 200), torch.float32)
    x.requires_grad_(True)
    x64.requires_grad_(True)
    for impl in IMPLS:
        _, ent = token_logprobs(x, tgt, 1.0, with_entropy=True, impl=impl)
        (dx,) = torch.autograd.grad(ent.sum(), x)
        (want,) = torch.autograd.grad(ref_token_logprobs(x64, tgt, 1.0)[1].sum(), x64)
        close(dx, want, TOL[torch.float32]["grad"], f"{impl} dlogits", scaled=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_target_at_neg_inf_logit(impl):
    """logp = -inf; d logp / dz = 1 - p at the target (p = 0 there) and -p elsewhere; other rows unaffected."""
    x, x64, tgt = make_logits((3, 150), torch.float32, neg_inf=True)
    tgt[1] = 0  # x[1, 0] is -inf
    x.requires_grad_(True)
    logp, _ = token_logprobs(x, tgt, 1.0, impl=impl)
    assert logp[1].item() == float("-inf")
    close(logp[[0, 2]], ref_token_logprobs(x64, tgt, 1.0)[0][[0, 2]], TOL[torch.float32]["fwd"], "logp")
    (dx,) = torch.autograd.grad(logp[1], x)
    want = -torch.softmax(x64[1], -1)
    want[0] += 1.0
    close(dx[1], want, TOL[torch.float32]["grad"], "dlogits", scaled=True)


# ---------------------------------------------------------------- ppo_loss
PPO_CASES = {  # name: (B, T, adv (B, T), dual_clip, kl_coef)
    "plain": (5, 37, False, None, 0.0),
    "dual-kl": (5, 37, True, 3.0, 0.1),
    "one-token": (1, 1, False, 10.0, 0.0),
    "large": (64, 4099, True, 10.0, 0.05),
}


def check_ppo_loss(impl, agg, B, T, adv_2d, dual_clip, kl_coef):
    """Loss, stats and d loss / d logp against the fp64 reference."""
    logp, old, adv, ref, mask = make_ppo_inputs(B, T, adv_2d)
    logp.requires_grad_(True)
    lp64 = logp.detach().double().requires_grad_(True)
    adv_bt = (adv if adv_2d else adv[:, None].expand(B, T)).double()
    ref_arg = ref if kl_coef else None
    loss, stats = ppo_loss(logp, old, adv, mask, 0.2, 0.28, dual_clip, ref_arg, kl_coef, agg, impl)
    tok, r, clipped = ref_ppo_tokens(lp64, old.double(), adv_bt, None if ref_arg is None else ref.double(), 0.2,
                                     0.28, dual_clip, kl_coef)
    want = ref_aggregate(tok, mask.double(), agg)
    close(loss, want, TOL[torch.float32]["fwd"], "loss")
    assert stats == pytest.approx(ref_stats(lp64.detach(), old.double(), r.detach(), clipped, mask), rel=1e-5,
                                  abs=1e-6)
    (g,) = torch.autograd.grad(loss * 0.5, logp)
    (want_g,) = torch.autograd.grad(want * 0.5, lp64)
    close(g, want_g, (1e-7, 1e-5), "dlogp")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("case", [c for c in PPO_CASES if c != "large"])
def test_ppo_loss(impl, agg, case):
    check_ppo_loss(impl, agg, *PPO_CASES[case])


@large
def test_ppo_loss_large():
    check_ppo_loss("triton", "token-mean", *PPO_CASES["large"])


@pytest.mark.parametrize("impl", IMPLS)
def test_ppo_loss_all_masked(impl):
    """No valid token: loss 0, zero gradient, stats 0 (never nan)."""
    logp, old, adv, _, mask = make_ppo_inputs(3, 4, False)
    logp.requires_grad_(True)
    for agg in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]:
        loss, stats = ppo_loss(logp, old, adv, torch.zeros_like(mask), agg=agg, impl=impl)
        (g,) = torch.autograd.grad(loss, logp)
        assert loss.item() == 0.0 and torch.all(g == 0)
        assert stats == dict(clip_frac=0.0, approx_kl=0.0, ratio_mean=0.0, ratio_max=0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_ppo_loss_ignores_masked_garbage(impl):
    """nan / -inf log-probs at masked tokens change nothing: same loss, gradient and stats as clean inputs."""
    logp, old, adv, ref, mask = make_ppo_inputs(4, 9, True)
    dirty = torch.where(mask > 0, logp, torch.tensor(float("nan")).to(DEV))
    dirty[tuple((mask == 0).nonzero()[0])] = float("-inf")
    out = []
    for lp in (logp, dirty):
        lp = lp.clone().requires_grad_(True)
        loss, stats = ppo_loss(lp, old, adv, mask, dual_clip=3.0, ref_logp=ref, kl_coef=0.1, impl=impl)
        (g,) = torch.autograd.grad(loss, lp)
        out.append((loss, g, stats))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert out[0][2] == out[1][2]


def test_bad_arguments():
    logp, old, adv, _, mask = make_ppo_inputs(2, 3, False)
    with pytest.raises(ValueError, match="agg"):
        ppo_loss(logp, old, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="impl"):
        ppo_loss(logp, old, adv, mask, impl="cuda")


# ---------------------------------------------------------------- PRM rewards and returns
@pytest.mark.parametrize("impl", IMPLS)
def test_implicit_prm_rewards(impl):
    prm, ref, _, _, mask = make_ppo_inputs(4, 13, True)
    prm.requires_grad_(True)
    ref.requires_grad_(True)
    r = implicit_prm_rewards(prm, ref, mask.bool(), 0.05, impl=impl)
    close(r, 0.05 * (prm.double() - ref.double()) * mask.double(), (1e-7, 1e-6), "rewards")
    g = torch.randn(4, 13).to(DEV)
    d_prm, d_ref = torch.autograd.grad((r * g).sum(), (prm, ref))
    close(d_prm, 0.05 * g.double() * mask.double(), (1e-8, 1e-6), "d prm")
    close(d_ref, -0.05 * g.double() * mask.double(), (1e-8, 1e-6), "d ref")


RETURN_SHAPES = {"odd": (4, 37), "single-token": (3, 1), "large": (16, 16411)}


def check_returns(impl, gamma, B, T):
    """Returns and their gradient vs a Python loop, with a hole in one mask and a fully masked row."""
    g = torch.Generator().manual_seed(0)
    r64 = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, T // 2:] = 0
    if B > 2:
        mask[1] = 0
        mask[2, T // 3] = 0
    r = r64.float().to(DEV).requires_grad_(True)
    r64 = r64.to(DEV).requires_grad_(True)
    mask = mask.to(DEV)
    G = discounted_returns(r, mask.float(), gamma, impl=impl)
    want = ref_returns(r64, mask, gamma)
    atol = 1e-6 * math.sqrt(T)  # fp32 sums of up to T terms
    close(G, want, (atol, 1e-5), "returns")
    up = torch.randn(B, T, generator=g).to(DEV)
    (dr,) = torch.autograd.grad((G * up).sum(), r)
    (want_dr,) = torch.autograd.grad((want * up).sum(), r64)
    close(dr, want_dr, (atol, 1e-5), "d returns")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gamma", [1.0, 0.95, 0.0])
@pytest.mark.parametrize("shape", [s for s in RETURN_SHAPES if s != "large"])
def test_discounted_returns(impl, gamma, shape):
    check_returns(impl, gamma, *RETURN_SHAPES[shape])


@large
@pytest.mark.parametrize("gamma", [1.0, 0.99])
def test_discounted_returns_large(gamma):
    check_returns("triton", gamma, *RETURN_SHAPES["large"])


# ---------------------------------------------------------------- fused logits -> PPO loss
FUSED_CASES = {  # name: (B, T, V, temperature, entropy_coef, dual_clip, kl_coef, agg, grad_scale, upstream)
    "plain": (3, 6, 301, 1.0, 0.0, None, 0.0, "token-mean", 1.0, 1.0),
    "all-terms": (4, 5, 259, 0.7, 0.01, 3.0, 0.1, "seq-mean-token-mean", 0.25, 0.25),
    "rescaled": (3, 4, 130, 1.2, 0.02, None, 0.0, "seq-mean-token-sum", 1.0, 0.3),
    "large": (2, 64, 151936, 0.9, 0.01, 10.0, 0.0, "token-mean", 1.0, 1.0),
}


def check_fused(impl, dtype, B, T, V, temperature, entropy_coef, dual_clip, kl_coef, agg, grad_scale, upstream):
    """Loss, stats and dlogits of the fused path (read from a (B, T + 1, V)[:, :-1] slice) vs the fp64 composition."""
    x_full, x64_full, tgt = make_logits((B, T + 1, V), dtype, seed=2)
    tgt = tgt[:, :-1]
    logp0, old, adv, ref, mask = make_ppo_inputs(B, T, False, seed=3)
    x_full.requires_grad_(True)
    x64_full.requires_grad_(True)
    with torch.no_grad():
        old = ref_token_logprobs(x64_full[:, :-1], tgt, temperature)[0].float() + 0.3 * (logp0 - old)
    ref_arg = ref if kl_coef else None
    loss, stats = fused_logits_ppo_loss(x_full[:, :-1], tgt, old, adv, mask, 0.2, 0.28, dual_clip, ref_arg, kl_coef,
                                        agg, temperature, entropy_coef, grad_scale, impl)
    lp64, ent64 = ref_token_logprobs(x64_full[:, :-1], tgt, temperature)
    m64 = mask.double()
    tok, r, clipped = ref_ppo_tokens(lp64, old.double(), adv[:, None].double(),
                                     None if ref_arg is None else ref.double(), 0.2, 0.28, dual_clip, kl_coef)
    want = ref_aggregate(tok - entropy_coef * ent64, m64, agg)
    close(loss, want, TOL[dtype]["fwd"], "loss")
    want_stats = ref_stats(lp64.detach(), old.double(), r.detach(), clipped, mask)
    want_stats["entropy"] = ((ent64 * m64).sum() / m64.sum()).item()
    assert stats == pytest.approx(want_stats, rel=1e-4, abs=1e-5)
    (dx,) = torch.autograd.grad(loss * upstream, x_full)
    (want_dx,) = torch.autograd.grad(want * upstream, x64_full)
    assert dx.dtype == dtype
    close(dx, want_dx, TOL[dtype]["grad"], "dlogits", scaled=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [c for c in FUSED_CASES if c != "large"])
def test_fused_logits_ppo_loss(impl, dtype, case):
    check_fused(impl, dtype, *FUSED_CASES[case])


@large
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_logits_ppo_loss_large(dtype):
    check_fused("triton", dtype, *FUSED_CASES["large"])


def test_fused_without_grad_and_second_backward():
    """A no-grad forward writes no dlogits; a second backward through the fused loss is refused."""
    x, _, tgt = make_logits((2, 3, 50), torch.float32)
    _, old, adv, _, mask = make_ppo_inputs(2, 3, False)
    loss, stats = fused_logits_ppo_loss(x, tgt, old, adv, mask, impl="triton")
    assert math.isfinite(loss.item()) and set(stats) == {"clip_frac", "approx_kl", "ratio_mean", "ratio_max",
                                                         "entropy"}
    x.requires_grad_(True)
    loss, _ = fused_logits_ppo_loss(x, tgt, old, adv, mask, impl="triton")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


# ---------------------------------------------------------------- import order
@pytest.mark.skipif(CUDA, reason="with CUDA the kernels compile instead of running in the interpreter")
def test_interpreter_after_triton_imported_first():
    """triton imported before kernels/ without TRITON_INTERPRET (as vllm does): every row reduction (row_sum,
    row_max, the scan carry) still runs in the interpreter. Fails if a kernel calls tl.sum / tl.max, which
    triton then decorated for compilation."""
    code = ("import triton, torch\n"
            "from kernels import discounted_returns, token_logprobs\n"
            "x = torch.randn(3, 50)\n"
            "logp, ent = token_logprobs(x, torch.tensor([1, 2, 3]), with_entropy=True, impl='triton')\n"
            "lsm = torch.log_softmax(x, -1)\n"
            "assert torch.allclose(logp, lsm[range(3), [1, 2, 3]], atol=1e-5)\n"
            "assert torch.allclose(ent, -(lsm.exp() * lsm).sum(-1), atol=1e-5)\n"
            "r = torch.randn(2, 5)\n"
            "G = discounted_returns(r, torch.ones(2, 5), 1.0, impl='triton')\n"
            "assert torch.allclose(G, r.flip(1).cumsum(1).flip(1), atol=1e-5)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]

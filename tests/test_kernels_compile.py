"""Every Triton kernel in kernels/ compiles to Hopper (sm_90) machine code, without a GPU.

The interpreter that runs the kernel tests on CPU accepts code the compiler rejects (a non-constexpr global, a
loop-carried value that changes type, ...). This compiles each kernel and specialisation through Triton's full
pipeline (TTIR -> PTX -> cubin, ptxas ships with triton) in a subprocess where torch reports CUDA, so kernels/
decorates with triton.jit instead of the interpreter.
"""
import importlib
import os
import subprocess
import sys
from pathlib import Path

ROW = dict(T="i32", V="i32", stride_b="i64", stride_t="i64", scale2="fp32")
PPO = dict(clip_low="fp32", clip_high="fp32", dual_clip="fp32", kl_coef="fp32")


def specialisations():
    """(module, kernel, signature, constexprs) for each kernel, logits dtype and compile-time flag used."""
    for dt in ("*bf16", "*fp16", "*fp32"):
        for ent in (True, False):
            yield ("token_logprobs", "_token_logprobs_fwd",
                   dict(x_ptr=dt, tgt_ptr="*i64", logp_ptr="*fp32", lse2_ptr="*fp32", ent_ptr="*fp32", **ROW),
                   dict(BLOCK_V=4096, WITH_ENT=ent))
            yield ("token_logprobs", "_token_logprobs_bwd",
                   dict(x_ptr=dt, dx_ptr=dt, tgt_ptr="*i64", lse2_ptr="*fp32", ent_ptr="*fp32", g_logp_ptr="*fp32",
                        g_ent_ptr="*fp32", **ROW), dict(BLOCK_V=4096, WITH_ENT=ent))
            yield ("fused_ppo", "_fused_logits_ppo_kernel",
                   dict(x_ptr=dt, dx_ptr=dt, tgt_ptr="*i64", old_ptr="*fp32", adv_ptr="*fp32", ref_ptr="*fp32",
                        w_ptr="*fp32", onp_ptr="*i1", logp_ptr="*fp32", ent_ptr="*fp32", loss_ptr="*fp32",
                        ratio_ptr="*fp32", clipped_ptr="*i8", **ROW, **PPO, entropy_coef="fp32", grad_scale="fp32"),
                   dict(BLOCK_V=4096, HAS_DUAL=ent, HAS_KL=ent, CISPO=not ent, HAS_ENT_COEF=ent, WRITE_GRAD=ent,
                        ON_POLICY=ent))
    for flag in (True, False):
        yield ("ppo_loss", "_ppo_loss_kernel",
               dict(logp_ptr="*fp32", old_ptr="*fp32", adv_ptr="*fp32", ref_ptr="*fp32", w_ptr="*fp32",
                    loss_ptr="*fp32", dlogp_ptr="*fp32", ratio_ptr="*fp32", clipped_ptr="*i8", n="i32", **PPO),
               dict(BLOCK=1024, HAS_DUAL=flag, HAS_KL=not flag, CISPO=not flag))
        yield ("prm_reward", "_masked_diff_kernel",
               dict(a_ptr="*fp32", b_ptr="*fp32", m_ptr="*i1", out_ptr="*fp32", n="i32", beta="fp32"),
               dict(BLOCK=1024, HAS_B=flag))
        yield ("prm_reward", "_discounted_scan_kernel",
               dict(x_ptr="*fp32", m_ptr="*fp32", out_ptr="*fp32", T="i32", gamma="fp32"),
               dict(BLOCK_T=1024, REVERSE=flag))


def compile_all() -> None:
    """Run in the subprocess: compile every specialisation for sm_90; raises on the first failure."""
    import torch
    torch.cuda.is_available = lambda: True  # kernels/_common.jit then gives triton.jit
    import triton
    from triton.backends.compiler import GPUTarget
    for module, name, sig, consts in specialisations():
        fn = getattr(importlib.import_module(f"kernels.{module}"), name)
        src = triton.compiler.ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                                        constexprs=consts)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
        assert kernel.asm["cubin"], name


def test_kernels_compile_for_sm90():
    root = Path(__file__).resolve().parents[1]
    code = f"import sys; sys.path[:0] = [{str(root)!r}, {str(Path(__file__).parent)!r}]; " \
           "import test_kernels_compile; test_kernels_compile.compile_all()"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert res.returncode == 0, res.stderr[-3000:]

"""Shared by the kernel files: the impl switch, the Triton decorator and two row reductions.

`jit` is `triton.jit` where CUDA exists; on a machine without it, Triton's interpreter (what TRITON_INTERPRET=1
selects), so impl="triton" runs on CPU tensors whatever the import order. Triton decorates its own library
functions (tl.sum, tl.max) when it is first imported: if that happened without TRITON_INTERPRET=1 (vllm imports
triton), they cannot run in the interpreter. row_sum / row_max call tl.reduce with the same combine functions,
which the interpreter maps to numpy either way, and compile to the same code as tl.sum / tl.max.
"""
import torch
import triton
import triton.language as tl

IMPLS = ("auto", "triton", "torch")


def use_triton(impl: str, x: torch.Tensor) -> bool:
    """impl="auto": Triton for CUDA tensors, the torch path otherwise; "triton" / "torch" force one."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl == "triton" or (impl == "auto" and x.is_cuda)


def jit(fn):
    """triton.jit, or the same function under Triton's interpreter where there is no CUDA."""
    if torch.cuda.is_available():
        return triton.jit(fn)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@jit
def row_sum(x):
    """tl.sum(x, 0) for a 1-D block."""
    return tl.reduce(x, 0, tl.standard._sum_combine)


@jit
def row_max(x):
    """tl.max(x, 0) for a 1-D block."""
    return tl.reduce(x, 0, tl.standard._elementwise_max)

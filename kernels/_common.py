"""Shared by the kernel files: the impl switch and the Triton decorator.

`jit` is `triton.jit` where CUDA exists; on a machine without it, Triton's interpreter (what
TRITON_INTERPRET=1 selects), so impl="triton" runs on CPU tensors whatever the import order.
"""
import torch
import triton

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

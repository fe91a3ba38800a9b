"""Shared by the kernel files: the impl switch, the Triton decorator and two row reductions.

`jit` is `triton.jit` where CUDA exists; on a machine without it, Triton's interpreter (what TRITON_INTERPRET=1
selects), so impl="triton" runs on CPU tensors whatever the import order. Triton decorates its own library
functions (tl.sum, tl.max) when it is first imported: if that happened without TRITON_INTERPRET=1 (vllm imports
triton), they cannot run in the interpreter. row_sum / row_max are tl.reduce with combine functions decorated
here by `jit`, so they run in the interpreter either way and compile to the same reduction as tl.sum / tl.max.
The interpreter reduces them element by element in Python (it maps only Triton's own combine functions to
numpy): the Triton-path kernel tests took 14.2 s instead of 9.2 s on the 2-core CPU development machine.
"""
import torch
import triton
import triton.language as tl

IMPLS = ("auto", "triton", "torch")


def use_triton(impl: str, x: torch.Tensor, *others) -> bool:
    """impl="auto": Triton for CUDA tensors, the torch path otherwise; "triton" / "torch" force one. x and every
    tensor among `others` (None and non-tensors are skipped) must be on one device type: a Triton kernel handed a
    CPU pointer beside CUDA ones fails deep inside the launch, so the entry point refuses it and names both."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    for i, t in enumerate(others):
        if isinstance(t, torch.Tensor) and t.device.type != x.device.type:
            raise ValueError(f"kernel inputs are on different devices: the first is on {x.device}, input {i + 1} on "
                             f"{t.device} (move every input to the run's device)")
    return impl == "triton" or (impl == "auto" and x.is_cuda)


def jit(fn):
    """triton.jit, or the same function under Triton's interpreter where there is no CUDA."""
    if torch.cuda.is_available():
        return triton.jit(fn)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@jit
def _add(a, b):
    """Combine function of row_sum (public tl.reduce with a local combine function)."""
    return a + b


@jit
def _max(a, b):
    """Combine function of row_max."""
    return tl.maximum(a, b)


@jit
def row_sum(x):
    """tl.sum(x, 0) for a 1-D block."""
    return tl.reduce(x, 0, _add)


@jit
def row_max(x):
    """tl.max(x, 0) for a 1-D block."""
    return tl.reduce(x, 0, _max)

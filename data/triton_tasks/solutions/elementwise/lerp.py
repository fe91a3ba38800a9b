import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def lerp_kernel(x_ptr, y_ptr, out_ptr, n, w, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + w * (y - x), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        lerp_kernel[(triton.cdiv(n, 256),)](x, y, out, n, self.w, BLOCK=256)
        return out

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def squared_diff_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, d * d, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        squared_diff_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=512)
        return out

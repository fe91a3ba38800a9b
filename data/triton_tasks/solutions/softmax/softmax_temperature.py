import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_t_kernel(x_ptr, out_ptr, N, inv_t, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=-float("inf")) * inv_t
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def forward(self, x):
        x = x.contiguous()
        N = x.shape[-1]
        rows = x.numel() // N
        out = torch.empty_like(x)
        softmax_t_kernel[(rows,)](x, out, N, 1.0 / self.temperature, BLOCK_N=triton.next_power_of_2(N))
        return out

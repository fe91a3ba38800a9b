import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, h_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    h = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0) + tl.load(r_ptr + row * N + cols, mask=mask, other=0.0)
    tl.store(h_ptr + row * N + cols, h, mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(out_ptr + row * N + cols, h * rstd * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))
        self.eps = 1e-6

    def forward(self, x, residual):
        x, residual = x.contiguous(), residual.contiguous()
        M, N = x.shape
        out, h = torch.empty_like(x), torch.empty_like(x)
        add_rms_norm_kernel[(M,)](x, residual, self.weight, out, h, N, self.eps, BLOCK_N=triton.next_power_of_2(N))
        return out, h

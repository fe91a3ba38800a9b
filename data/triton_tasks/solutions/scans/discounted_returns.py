import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def discounted_returns_kernel(r_ptr, out_ptr, M, T, gamma, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = rows < M
    running = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for i in range(0, T):
        t = T - 1 - i
        running = tl.load(r_ptr + rows * T + t, mask=mask, other=0.0) + gamma * running
        tl.store(out_ptr + rows * T + t, running, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, gamma):
        super().__init__()
        self.gamma = gamma

    def forward(self, r):
        r = r.contiguous()
        M, T = r.shape
        out = torch.empty_like(r)
        discounted_returns_kernel[(triton.cdiv(M, 4),)](r, out, M, T, self.gamma, BLOCK_M=4)
        return out

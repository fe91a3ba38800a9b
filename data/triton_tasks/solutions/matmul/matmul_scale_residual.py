import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_residual_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K, alpha, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + k + rk[None, :], mask=(rm[:, None] < M) & (k + rk[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + (k + rk[:, None]) * N + rn[None, :], mask=(k + rk[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    c = tl.load(c_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], alpha * acc + c, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b, c):
        a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
        M, K = a.shape
        N = b.shape[1]
        out = torch.empty((M, N), device=a.device, dtype=a.dtype)
        matmul_residual_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, out, M, N, K, self.alpha,
                                                                         BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        return out

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cross_entropy_kernel(logits_ptr, targets_ptr, out_ptr, M, V, BLOCK_V: tl.constexpr):
    cols = tl.arange(0, BLOCK_V)
    mask = cols < V
    total = 0.0
    for row in range(0, M):
        x = tl.load(logits_ptr + row * V + cols, mask=mask, other=-float("inf"))
        x_max = tl.max(x, axis=0)
        lse = x_max + tl.log(tl.sum(tl.exp(x - x_max), axis=0))
        target = tl.load(targets_ptr + row)
        total += lse - tl.load(logits_ptr + row * V + target)
    tl.store(out_ptr, total / M)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        logits, targets = logits.contiguous(), targets.contiguous()
        M, V = logits.shape
        out = torch.empty((), device=logits.device, dtype=logits.dtype)
        cross_entropy_kernel[(1,)](logits, targets, out, M, V, BLOCK_V=triton.next_power_of_2(V))
        return out

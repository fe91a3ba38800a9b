import torch
import torch.nn as nn


class Model(nn.Module):
    """Residual add then RMSNorm; returns (normed, the new residual stream)"""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))
        self.eps = 1e-6

    def forward(self, x, residual):
        h = x + residual
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight, h


def get_inputs():
    return [torch.randn(5, 56), torch.randn(5, 56)]


def get_init_inputs():
    return [56]

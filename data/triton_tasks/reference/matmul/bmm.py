import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matmul: (B, M, K) @ (B, K, N)"""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(3, 18, 24), torch.randn(3, 24, 12)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over the first dim: (M, N) -> (N,)"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=0)


def get_inputs():
    return [torch.randn(33, 50)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Exclusive prefix sum over the last dim: out[:, 0] = 0, out[:, j] = sum of x[:, :j]"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x, dim=1) - x


def get_inputs():
    return [torch.randn(5, 50)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """out = clamp(x, lo, hi)"""

    def __init__(self, lo, hi):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return torch.clamp(x, self.lo, self.hi)


def get_inputs():
    return [torch.randn(3, 5, 70)]


def get_init_inputs():
    return [-0.5, 1.25]

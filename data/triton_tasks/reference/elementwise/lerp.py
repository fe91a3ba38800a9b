import torch
import torch.nn as nn


class Model(nn.Module):
    """out = x + w * (y - x)"""

    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, x, y):
        return torch.lerp(x, y, self.w)


def get_inputs():
    return [torch.randn(5, 200), torch.randn(5, 200)]


def get_init_inputs():
    return [0.3]

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """out = leaky_relu(x, negative_slope)"""

    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


def get_inputs():
    return [torch.randn(6, 150) * 3]


def get_init_inputs():
    return [0.1]

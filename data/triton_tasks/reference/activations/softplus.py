import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """out = softplus(x) = log(1 + exp(x)), linear above the threshold 20"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.softplus(x)


def get_inputs():
    return [torch.randn(6, 120) * 3]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """out = x + alpha * y"""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return x + self.alpha * y


def get_inputs():
    return [torch.randn(4, 300), torch.randn(4, 300)]


def get_init_inputs():
    return [0.75]

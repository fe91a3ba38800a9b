import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Rows scaled to unit Euclidean norm: x / max(||x||, 1e-12)"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.normalize(x, dim=1)


def get_inputs():
    return [torch.randn(9, 33)]


def get_init_inputs():
    return []

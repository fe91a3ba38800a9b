import torch
import torch.nn as nn


class Model(nn.Module):
    """Integer arithmetic: out = 3 * x + y (int32, exact)"""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return 3 * x + y


def get_inputs():
    return [torch.randint(-1000, 1000, (600,), dtype=torch.int32),
            torch.randint(-1000, 1000, (600,), dtype=torch.int32)]


def get_init_inputs():
    return []

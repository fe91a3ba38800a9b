import torch
import torch.nn as nn


class Model(nn.Module):
    """Discounted returns over the last dim: G[:, t] = r[:, t] + gamma * G[:, t + 1], G[:, T] = 0"""

    def __init__(self, gamma):
        super().__init__()
        self.gamma = gamma

    def forward(self, r):
        out = torch.empty_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in range(r.shape[1] - 1, -1, -1):
            running = r[:, t] + self.gamma * running
            out[:, t] = running
        return out


def get_inputs():
    return [torch.randn(6, 40)]


def get_init_inputs():
    return [0.9]

"""Group-relative advantages. Rows of one group are consecutive: rows g*K .. g*K+K-1 form group g.

grpo_advantages: a_i = (r_i - mean_g) / (std_g + eps), std_g = torch.std (unbiased, K-1);
                 without scale_std: a_i = r_i - mean_g.
rloo_advantages: a_i = r_i - mean_{j != i} r_j = K/(K-1) * (r_i - mean_g).
"""
import torch


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, "
                         f"got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (G, K)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """(B,) -> (B,) (r - mean_g) / (std_g + eps), or r - mean_g when scale_std is False."""
    r = _groups(rewards, group_size).float()  # (G, K)
    a = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        a = a / (std + eps)
    return a.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B,) r_i - mean of the other K-1 rewards of its group (0 when K == 1)."""
    if group_size < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    r = _groups(rewards, group_size).float()  # (G, K)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).reshape(-1)

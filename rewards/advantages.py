"""Group-relative advantages. Rows of one group are consecutive: rows g*K .. g*K+K-1 form group g.
(PRIME's prime_advantages and accuracy_filter are at the end; DAPO's overlong shaping and filtering after them.)

grpo_advantages: a_i = (r_i - mean_g) / (std + eps), std = torch.std (unbiased) of the group's rewards
                 (scale_std "group"), of the whole batch's, every rank's ("batch": Liu et al. 2025, "Part I:
                 Tricks or Traps?"), or no division ("none": Dr. GRPO, Liu et al. 2025).
rloo_advantages: a_i = r_i - mean_{j != i} r_j = K/(K-1) * (r_i - mean_g).
"""
import torch

from kernels import discounted_returns

SCALES = ("group", "batch", "none")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, "
                         f"got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (G, K)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale_std: str = "group", eps: float = 1e-6,
                    reduce=None) -> torch.Tensor:
    """(B,) -> (B,) (r - mean_g) / (std + eps) with the group's std, the batch's or none (module docstring).
    reduce(t) -> t summed over ranks (a (3,) tensor of count, sum, sum of squares): the batch std covers every
    rank's rewards (None: this rank's only)."""
    if scale_std not in SCALES:
        raise ValueError(f"scale_std must be one of {SCALES}, got {scale_std!r}")
    r = _groups(rewards, group_size).float()  # (G, K)
    a = r - r.mean(dim=1, keepdim=True)
    if scale_std == "group":
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        a = a / (std + eps)
    elif scale_std == "batch":
        _, _, var = _moments(r.new_tensor(r.numel()), r.sum(), (r * r).sum(), reduce)
        a = a / (var ** 0.5 + eps)
    return a.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B,) r_i - mean of the other K-1 rewards of its group (0 when K == 1)."""
    if group_size < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    return rewards.float() - _others_mean(rewards.float(), group_size)


def prime_advantages(outcome: torch.Tensor, token_rewards: torch.Tensor, mask: torch.Tensor, group_size: int,
                     gamma: float = 1.0, outcome_coef: float = 1.0, process_coef: float = 1.0,
                     whiten: bool = True, reduce=None) -> torch.Tensor:
    """PRIME advantages (paper Eq. 5), (B,) outcomes and (B, T) token rewards -> (B, T).

    process_i,t = sum_{s >= t} gamma^(s-t) [r_i,s - mean_{j != i} (sum_s r_j,s / |y_j|)]   (RLOO baseline)
    outcome_i   = r_o(i) - mean_{j != i} r_o(j), the same at every valid token
    A = process_coef * process + outcome_coef * outcome; whiten: (A - mean) / sqrt(var + 1e-8) over the valid
    tokens of the whole batch (unbiased var); 0 where mask is 0. Both coefficients take effect (PRIME's own code
    ignores them). reduce(t) -> t summed over ranks (a (3,) tensor of count, sum, sum of squares): with it the
    whitening statistics cover every rank's rows, so the result does not depend on the number of ranks."""
    m = mask.float()  # (B, T)
    r = token_rewards.float() * m  # (B, T)
    seq_mean = r.sum(1) / m.sum(1).clamp(min=1)  # (B,) each sample's mean token reward
    process = discounted_returns(r - _others_mean(seq_mean, group_size)[:, None] * m, m, gamma)  # (B, T)
    out = outcome.float() - _others_mean(outcome.float(), group_size)  # (B,)
    adv = (process_coef * process + outcome_coef * out[:, None]) * m  # (B, T)
    if whiten:
        _, mean, var = _moments(m.sum(), adv.sum(), (adv * adv).sum(), reduce)
        adv = (adv - mean) * (var + 1e-8) ** -0.5 * m
    return adv


def _moments(count: torch.Tensor, total: torch.Tensor, squares: torch.Tensor, reduce) -> tuple[float, float, float]:
    """(n, mean, unbiased variance) from this rank's count, sum and sum of squares (0-d tensors), summed over ranks
    by reduce(t) (a (3,) tensor; None: this rank's only), in float64."""
    stats = torch.stack([count, total, squares]).double()  # (3,)
    n, s1, s2 = (stats if reduce is None else reduce(stats)).tolist()
    mean = s1 / max(n, 1.0)
    return n, mean, max(s2 - n * mean * mean, 0.0) / max(n - 1, 1.0)


def _others_mean(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B,) mean of the other K-1 values of each row's group (0 when K == 1)."""
    if group_size < 2:
        return torch.zeros_like(x)
    g = _groups(x, group_size)  # (G, K)
    return ((g.sum(1, keepdim=True) - g) / (group_size - 1)).reshape(-1)


def accuracy_filter(rewards: torch.Tensor, group_size: int, low: float = 0.2, high: float = 0.8) -> torch.Tensor:
    """(B,) outcome rewards in [0, 1] -> (G,) bool: keep groups whose mean accuracy is in [low, high]."""
    acc = _groups(rewards, group_size).float().mean(1)  # (G,)
    return (acc >= low - 1e-9) & (acc <= high + 1e-9)


def overlong_penalty(lengths: torch.Tensor, truncated: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13): lengths (B,) |y| in tokens, truncated (B,) bool
    -> (B,) R_len = 0 if |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache inside the buffer, -1 for a
    truncated response; L_max = max_len, L_cache = buffer."""
    inside = ((max_len - buffer) - lengths.double()) / buffer  # (B,) <= 0 past L_max - L_cache
    return torch.where(truncated, -1.0, inside.clamp(-1.0, 0.0)).float()


class Overlong:
    """DAPO's overlong handling as a step of the advantage phase, before the advantages:
    shaping (buffer > 0): each sample's reward += factor * overlong_penalty (verl's penalty_factor);  filtering
    (filter): a truncated response's mask becomes all False, so it contributes no loss, no KL and no denominator
    (TRL's mask_truncated_completions). |y| is the whole response, observation tokens included: the length that
    max_response_len cuts, so the ramp ends where truncation starts (verl's DAPO reward counts the same).
    reduce(t) sums a tensor over ranks (the metrics cover every rank)."""

    def __init__(self, max_len: int, buffer: int, filter: bool, reduce, factor: float = 1.0):
        self.max_len, self.buffer, self.filter, self.reduce, self.factor = max_len, buffer, filter, reduce, factor

    def __call__(self, rows: list, rewards: torch.Tensor, truncated: list[bool]) -> tuple[torch.Tensor, dict]:
        """rows, rewards (B,), truncated per row -> (shaped rewards (B,), metrics)."""
        lengths = torch.tensor([len(r.response) for r in rows])  # (B,) model and observation tokens
        if self.filter:
            for r, cut in zip(rows, truncated):
                r.mask = torch.zeros(len(r.response), dtype=torch.bool) if cut else r.mask
        if not self.buffer:
            return rewards, {}
        pen = self.factor * overlong_penalty(lengths, torch.tensor(truncated, dtype=torch.bool), self.max_len,
                                             self.buffer)  # (B,)
        n, total = self.reduce(torch.tensor([len(rows), float(pen.sum())])).tolist()
        return rewards + pen, {"overlong/penalty_mean": total / max(n, 1.0)}

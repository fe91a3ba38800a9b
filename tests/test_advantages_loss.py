"""GRPO / RLOO advantages and the PPO-clip loss against values worked out by hand."""
import math

import pytest
import torch

from kernels import ppo_loss
from rewards.advantages import grpo_advantages, rloo_advantages


def test_grpo_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    a = grpo_advantages(r, 4, eps=0.0)
    # group 0: mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735
    s = math.sqrt(1 / 3)
    assert torch.allclose(a[:4], torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]))
    assert torch.all(grpo_advantages(r, 4)[4:] == 0)  # equal rewards: no signal (eps keeps it finite)
    assert torch.allclose(grpo_advantages(r, 4, scale_std="none")[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.allclose(grpo_advantages(torch.tensor([3.0, 1.0]), 2, eps=1e-6),
                          torch.tensor([1.0, -1.0]) / (math.sqrt(2) + 1e-6))


def test_grpo_batch_std_hand_values():
    """scale_std batch: group means, the std of all 8 rewards (unbiased: sum of squares 1 over 7); with reduce, a
    rank holding half the batch gets the same values (the statistics summed over ranks)."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    want = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) * math.sqrt(7)
    assert torch.allclose(grpo_advantages(r, 4, "batch", eps=0.0), want)
    other = torch.tensor([4.0, r[4:].sum(), (r[4:] ** 2).sum()], dtype=torch.float64)  # the other rank's stats
    half = grpo_advantages(r[:4], 4, "batch", eps=0.0, reduce=lambda t: t + other)
    assert torch.allclose(half, want[:4])
    with pytest.raises(ValueError, match="scale_std"):
        grpo_advantages(r, 4, scale_std=False)


def test_rloo_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0])
    # r_i - mean of the other three: 1 - 2/3, 0 - 1, 0 - 1, 2 - 1/3
    assert torch.allclose(rloo_advantages(r, 4), torch.tensor([1 / 3, -1.0, -1.0, 5 / 3]))
    assert torch.allclose(rloo_advantages(torch.tensor([1.0, 0.0]), 2), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="multiple of group_size"):
        rloo_advantages(torch.ones(5), 2)


def test_ppo_clip_hand_values():
    # token ratios e^0.5=1.6487 (clipped at 1.28 for a>0), e^-0.5=0.6065 (clipped at 0.8 for a<0), 1.0
    logp = torch.tensor([[0.5, -0.5, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, stats = ppo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean")
    # per token: -min(r a, clip(r) a) = [-1.28, +0.8, -2.0]; mean = -2.48 / 3
    assert loss.item() == pytest.approx(-2.48 / 3, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    # clipped tokens get no gradient; the unclipped one: d/dlogp (-r a) / 3 = -2 / 3
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, -2 / 3]]), atol=1e-6)


def test_dual_clip_bounds_negative_advantages():
    logp = torch.tensor([[math.log(5.0)]], requires_grad=True)  # ratio 5
    old, mask, adv = torch.zeros(1, 1), torch.ones(1, 1), torch.tensor([-1.0])
    plain, _ = ppo_loss(logp, old, adv, mask, dual_clip=None)
    dual, _ = ppo_loss(logp, old, adv, mask, dual_clip=3.0)
    assert plain.item() == pytest.approx(5.0, rel=1e-5)  # -min(-5, -1.28) = 5
    assert dual.item() == pytest.approx(3.0, rel=1e-5)  # bounded by c * |a|


def test_masks_and_aggregations():
    logp = torch.zeros(2, 3)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, 3.0])  # per sequence; ratio 1 so token loss = -adv
    tm, _ = ppo_loss(logp, old, adv, mask, agg="token-mean")
    sm, _ = ppo_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    ss, _ = ppo_loss(logp, old, adv, mask, agg="seq-mean-token-sum")
    dr, _ = ppo_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm")  # Dr. GRPO: / (rows x T), T = 3
    assert tm.item() == pytest.approx(-(1 + 1 + 3) / 3)
    assert sm.item() == pytest.approx(-(1 + 3) / 2)
    assert ss.item() == pytest.approx(-(2 + 3) / 2)
    assert dr.item() == pytest.approx(-(2 + 3) / (2 * 3))


def test_k3_kl_term():
    logp = torch.tensor([[0.0]])
    ref = torch.tensor([[-1.0]])  # u = ref - logp = -1: k3 = e^-1 + 1 - 1 = e^-1
    loss, _ = ppo_loss(logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), ref_logp=ref, kl_coef=0.5)
    assert loss.item() == pytest.approx(0.5 * math.exp(-1), rel=1e-5)

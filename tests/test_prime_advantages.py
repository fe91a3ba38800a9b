"""PRIME advantages (DESIGN.md section 4) and the accuracy filter against an independent fp64 loop."""
import pytest
import torch

from rewards.advantages import accuracy_filter, prime_advantages


def reference(outcome, r, mask, K, gamma, oc, pc, whiten):
    B, T = r.shape
    o, r, m = outcome.double(), r.double(), mask.double()
    A = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        g = i // K
        others = [j for j in range(g * K, g * K + K) if j != i]
        base = sum(float((r[j] * m[j]).sum() / max(m[j].sum(), 1)) for j in others) / len(others) if others else 0.0
        ob = sum(float(o[j]) for j in others) / len(others) if others else 0.0
        for t in range(T):
            if m[i, t]:
                ret = sum(gamma ** (s - t) * (float(r[i, s]) - base) for s in range(t, T) if m[i, s])
                A[i, t] = pc * ret + oc * (float(o[i]) - ob)
    if whiten:
        vals = A[m.bool()]
        A = torch.where(m.bool(), (A - vals.mean()) / torch.sqrt(vals.var() + 1e-8), 0.0)
    return A


@pytest.mark.parametrize("K, gamma, oc, pc, whiten", [
    (2, 1.0, 1.0, 1.0, True), (4, 1.0, 1.0, 1.0, False), (4, 0.9, 2.0, 0.5, True), (3, 1.0, 0.0, 1.0, False),
    (4, 1.0, 1.0, 0.0, False),
])
def test_matches_loop_reference(K, gamma, oc, pc, whiten):
    g = torch.Generator().manual_seed(K)
    B, T = 3 * K, 7
    outcome = torch.randint(0, 2, (B,), generator=g).float()
    r = torch.randn(B, T, generator=g) * 0.1
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lens[:, None]).float()  # ragged, masked tail
    got = prime_advantages(outcome, r, mask, K, gamma, oc, pc, whiten)
    want = reference(outcome, r, mask, K, gamma, oc, pc, whiten)
    assert torch.allclose(got.double(), want, atol=1e-5), (got - want).abs().max()
    assert torch.all(got[mask == 0] == 0)


def test_coefficients_take_effect_and_equal_groups_have_no_outcome_signal():
    outcome = torch.tensor([1.0, 1.0, 0.0, 1.0])
    r, mask = torch.zeros(4, 3), torch.ones(4, 3)
    a1 = prime_advantages(outcome, r, mask, 2, outcome_coef=1.0, whiten=False)
    a2 = prime_advantages(outcome, r, mask, 2, outcome_coef=3.0, whiten=False)
    assert torch.all(a1[:2] == 0)  # equal outcomes in group 0
    assert torch.allclose(a2, 3 * a1) and a1[2, 0] == -1.0 and a1[3, 0] == 1.0


def test_accuracy_filter_keeps_exactly_the_groups_in_range():
    rewards = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1.0])  # acc 0, .25, .5, .75, 1
    assert accuracy_filter(rewards, 4).tolist() == [False, True, True, True, False]
    assert accuracy_filter(rewards, 4, low=0.5, high=0.5).tolist() == [False, False, True, False, False]

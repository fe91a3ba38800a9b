"""Rollout-training mismatch (rollout/mismatch.py): every correction mode's weights and masks against an fp64
loop written from the formulas, the loss denominator rule, the metrics; and on the real engine, an injected
mismatch (engine weights perturbed) is seen by the metrics and acted on, while no injection reads ~0."""
import math
from pathlib import Path

import pytest

from helpers import result_of
import torch

from rollout import mismatch

ROOT = Path(__file__).resolve().parents[1]
LOW, C = 0.5, 2.0


def reference_weights(mode: str, old: list[float], roll: list[float], low: float = LOW, C: float = C) -> list[float]:
    """The formulas of rollout/mismatch.py's docstring, one token at a time in float64 (0 = masked), on the
    float32 values the trainer holds."""
    old, roll = torch.tensor(old).tolist(), torch.tensor(roll).tolist()
    d = [max(-20.0, min(20.0, o - r)) for o, r in zip(old, roll)]
    ratio = [math.exp(x) for x in d]
    rho = math.exp(max(-20.0, min(20.0, sum(d))))  # the product of the token ratios
    g = math.exp(sum(d) / len(d))  # their geometric mean
    if mode == "token_truncate":
        return [min(x, C) for x in ratio]
    if mode == "token_mask":
        return [x if low <= x <= C else 0.0 for x in ratio]
    if mode == "sequence_truncate":
        return [min(rho, C)] * len(d)
    if mode == "sequence_geo_mask":
        return [1.0 if low <= g <= C else 0.0] * len(d)
    return [rho if low <= rho <= C else 0.0] * len(d)


SEQS = [  # (old, roll): ratios inside, above C, below LOW, just inside and outside the bounds, a long tail, one token
    ([-1.0, -2.0, -0.5], [-1.1, -1.9, -0.5]),
    ([-0.1, -3.0, -2.0, -1.0, -1.0], [-1.0, -3.0, -0.2, -1.0 - math.log(1.99), -1.0 - math.log(2.01)]),
    ([-2.0 + math.log(0.49), -2.0 + math.log(0.51), -1.0], [-2.0, -2.0, -1.0]),
    ([-5.0] * 20, [-5.9] * 20),
    ([-0.7], [-0.7 - 40.0]),
    ([-1.0] * 30, [-1.0 - 0.03] * 30),  # every token ratio 1.03 (inside the bounds), their product 2.43 (above C)
    ([-1.0] * 50, [-1.0 + 1.0] * 50),  # sum of d = -50: the product is clamped at exp(-20), no underflow
]
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence_geo_mask"]


@pytest.mark.parametrize("mode", MODES)
def test_correction_weights_match_the_formulas(mode):
    fn = mismatch.correction(mode, LOW, C)
    for i, (old, roll) in enumerate(SEQS):
        got = fn(torch.tensor(old), torch.tensor(roll)).tolist()
        want = reference_weights(mode, old, roll)
        for t, (g, w) in enumerate(zip(got, want)):
            assert abs(g - w) <= 1e-6 * max(1.0, w), f"{mode} sequence {i} token {t}: {g} vs {w}"
    assert mismatch.correction("none", LOW, C) is None


def test_sequence_modes_use_the_product_of_token_ratios():
    """Seq-TIS / Seq-MIS (the MIS paper, verl): rho_i = prod_t ratio_t. Known sums in fp64: 2,000 tokens with
    d ~ N(0.002, 0.05) (sum 4.9, the issue's case) give rho = e^4.9 = 134 (clipped to C, masked), where the geometric
    mean is 1.0025 (what the old code used: it neither clipped nor masked)."""
    g = torch.Generator().manual_seed(0)
    d = 0.002 + 0.05 * torch.randn(2000, generator=g, dtype=torch.float64)
    roll = torch.full((2000,), -2.0, dtype=torch.float64)
    old = roll + d
    s = float((old - roll).sum())
    assert s > 2, s  # the drawn sequence's log-ratio sum: its product is far above C = 2
    trunc = mismatch.correction("sequence_truncate", LOW, C)(old, roll)
    mask = mismatch.correction("sequence_mask", LOW, C)(old, roll)
    geo = mismatch.correction("sequence_geo_mask", LOW, C)(old, roll)
    assert torch.all(trunc == C), trunc[:3]
    assert torch.all(mask == 0), mask[:3]
    assert torch.all(geo == 1), "the geometric mean (1.00..) is inside [0.5, 2]: kept"
    assert abs(float(mismatch.seq_log_ratio(old, roll)) - s) < 1e-9
    tight = mismatch.correction("sequence_geo_mask", 0.999, 1.001)(old, roll)
    assert torch.all(tight == 0) == (not 0.999 <= math.exp(s / 2000) <= 1.001)
    huge = mismatch.correction("sequence_truncate", LOW, 1e30)(roll + 1.0, roll)  # sum 2,000: clamped, finite
    assert torch.isfinite(huge).all() and abs(float(huge[0]) - math.exp(20)) < 1e-3 * math.exp(20)


def test_metrics_match_the_formulas():
    old = [torch.tensor(o) for o, _ in SEQS]
    roll = [torch.tensor(r) for _, r in SEQS]
    weights = [mismatch.correction("token_mask", LOW, C)(o, r) for o, r in zip(old, roll)]
    got = mismatch.metrics(mismatch.token_sums(old, roll, weights), mismatch.sequence_ratios(old, roll), True)
    f32 = [(torch.tensor(o).tolist(), torch.tensor(r).tolist()) for o, r in SEQS]
    d = [max(-20.0, min(20.0, a - b)) for o, r in f32 for a, b in zip(o, r)]
    w = [x for ws in weights for x in ws.tolist()]
    def p99(x):  # linear interpolation at q = 0.99
        x = sorted(x)
        return x[-2] + 0.99 * (len(x) - 1) % 1 * (x[-1] - x[-2])
    ds = [[max(-20.0, min(20.0, a - b)) for a, b in zip(o, r)] for o, r in f32]
    want = {"mismatch/kl_k3": sum(math.exp(x) - x - 1 for x in d) / len(d),
            "mismatch/log_ratio_abs_mean": sum(abs(x) for x in d) / len(d),
            "mismatch/prob_diff_max": max(abs(math.exp(b) - math.exp(a)) for o, r in f32 for a, b in zip(o, r)),
            "mismatch/seq_ratio_p99": p99([math.exp(max(-20.0, min(20.0, sum(x)))) for x in ds]),
            "mismatch/seq_geo_ratio_p99": p99([math.exp(sum(x) / len(x)) for x in ds]),
            "correction/masked_token_frac": sum(x == 0 for x in w) / len(w),
            "correction/weight_mean": sum(w) / len(w)}
    assert set(got) == set(want)
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-6 * max(1.0, abs(want[k])), f"{k}: {got[k]} vs {want[k]}"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_masked_tokens_leave_numerator_and_denominator(world_of_one, agg):
    """loss_weights: a masked token weighs 0 and is not counted; the rest are the aggregation over kept tokens
    times the correction weight (here: 3 rows, one of them fully masked)."""
    import trainer
    from model import Row
    run = trainer.Run(trainer.Config(loss_agg=agg), 0, 1, torch.device("cpu"), None, None)
    rows = [Row([1], [5, 6, 7], weight=torch.tensor([1.5, 0.0, 2.0])), Row([1], [8, 9], weight=torch.zeros(2)),
            Row([1], [4, 4, 4, 4])]
    got = [w.tolist() for w in trainer.loss_weights(run, rows)]
    kept = [[1.5, 0.0, 2.0], [0.0, 0.0], [1.0] * 4]
    n_tok, n_seq = 2 + 0 + 4, 2  # kept tokens, rows with a kept token
    per_row = {"token-mean": [1 / n_tok] * 3, "seq-mean-token-mean": [1 / (2 * n_seq), 0.0, 1 / (4 * n_seq)],
               "seq-mean-token-sum": [1 / n_seq] * 3}[agg]
    want = [[c * per_row[i] for c in row] for i, row in enumerate(kept)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert all(abs(a - b) < 1e-7 for a, b in zip(g, w)), f"{agg} row {i}: {g} vs {w}"


@pytest.mark.slow
def test_injected_mismatch_is_measured_and_corrected(tiny):
    out = result_of(["tests/mismatch_worker.py", str(tiny / "model")])
    clean, injected = out["clean"], out["injected"]
    assert clean["mismatch/kl_k3"] < 1e-9 and clean["mismatch/log_ratio_abs_mean"] < 1e-5, clean  # fp32 on CPU
    assert clean["mismatch/prob_diff_max"] < 1e-5 and abs(clean["mismatch/seq_ratio_p99"] - 1) < 1e-5, clean
    assert clean["correction/masked_token_frac"] == 0.0 and abs(clean["correction/weight_mean"] - 1) < 1e-5, clean
    assert injected["mismatch/kl_k3"] > 1e-3 and injected["mismatch/log_ratio_abs_mean"] > 1e-2, injected
    assert injected["correction/masked_token_frac"] > 0.01, injected  # token_mask acts on it
    assert abs(injected["correction/weight_mean"] - 1) > 1e-3, injected


@pytest.mark.slow
def test_bf16_engine_and_trainer_mismatch_stays_small(tiny):
    """precision: bf16 on CPU: the engine runs in bf16 and the push casts to it, so a clean step's mismatch is bf16
    kernels against bf16 kernels (docs/algorithms.md's GPU range: kl_k3 about 1e-4 to 1e-3), and an injected
    mismatch still stands out above it."""
    out = result_of(["tests/mismatch_worker.py", str(tiny / "model"), "bf16"])
    clean, injected = out["clean"], out["injected"]
    assert clean["mismatch/kl_k3"] < 1e-3 and clean["mismatch/log_ratio_abs_mean"] < 3e-2, clean
    assert injected["mismatch/kl_k3"] > 3 * clean["mismatch/kl_k3"], (clean, injected)

"""Trainer phases on real FSDP2 process groups (tests/trainer_worker.py at 1 and 2 ranks): world-size
invariance of the loss, the gradient, PRIME's whitening and the critic (GAE); packed vs plain log-probs and
gradients; cross-stage old log-probs; old log-probs supplied by the update's own forward; mini-batch metrics."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def run_worker(tiny, tmp_path, world: int) -> dict:
    out = tmp_path / f"w{world}.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                        "tests/trainer_worker.py", str(tiny / "model"), str(out)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phases")
    return run_worker(tiny, tmp, 1), run_worker(tiny, tmp, 2)


def close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_same_batch_same_loss_and_gradient_on_1_and_2_ranks(results, agg):
    one, two = results[0][f"update/{agg}"], results[1][f"update/{agg}"]
    for key in ("loss", "grad_norm", "entropy"):
        assert close(one[key], two[key]), f"{agg} {key}: 1 rank {one[key]} vs 2 ranks {two[key]}"
    assert one["grad_norm"] > 0


def test_prime_whitening_covers_every_rank(results):
    one, two = results[0]["prime_adv"], results[1]["prime_adv"]
    assert sorted(one) == sorted(two) == [str(i) for i in range(8)]
    for row in one:
        for t, (a, b) in enumerate(zip(one[row], two[row])):
            assert abs(a - b) < 1e-5, f"row {row} token {t}: 1 rank {a} vs 2 ranks {b}"
    flat = [x for v in one.values() for x in v]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / (len(flat) - 1))
    assert abs(mean) < 1e-5 and abs(std - 1) < 1e-3  # whitened over the whole batch


def test_critic_is_the_same_on_1_and_2_ranks(results):
    """advantage: gae's critic on FSDP2 over 2 ranks (head gradients averaged, whitening and value-loss
    denominators over both) gives the 1-rank figures: every row's advantages, the critic/ metrics and the head."""
    one, two = results[0], results[1]
    assert sorted(one["critic_adv"]) == sorted(two["critic_adv"]) == [str(i) for i in range(8)]
    for row in one["critic_adv"]:
        for t, (a, b) in enumerate(zip(one["critic_adv"][row], two["critic_adv"][row])):
            assert abs(a - b) < 1e-4, f"row {row} token {t}: 1 rank {a} vs 2 ranks {b}"
    for key, a in one["critic_stats"].items():
        assert close(a, two["critic_stats"][key], 1e-4), f"{key}: 1 rank {a} vs 2 ranks {two['critic_stats'][key]}"
    assert one["critic_stats"]["critic/vf_clipfrac"] > 0 and one["critic_stats"]["critic/grad_norm"] > 0
    for j, (a, b) in enumerate(zip(one["critic_head"], two["critic_head"])):
        assert abs(a - b) < 1e-3, f"head weight {j}: 1 rank {a} vs 2 ranks {b}"


def test_packed_logprobs_and_gradients_match_a_plain_forward(results):
    got, want = results[0]["packed_logp"]
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"row {i}: {len(g)} vs {len(w)} tokens"
        for t, (a, b) in enumerate(zip(g, w)):
            assert abs(a - b) < 1e-5, f"row {i} token {t}: packed {a} vs plain {b}"
    scale = results[0]["grad_max"]
    for name, diff in results[0]["packed_grad_max_diff"].items():
        assert diff < 1e-5 * max(1.0, scale), f"{name}: gradient differs by {diff} (largest gradient {scale})"
    assert results[0]["checkpointed_grad_max_diff"] < 1e-6 * max(1.0, scale)  # activation checkpointing: same grads


def test_cross_stage_old_logprobs_keep_earlier_stages(results):
    c = results[0]["cross_stage"]
    for i, (k, v0, filled, v1) in enumerate(zip(c["k"], c["stage1_v0"], c["filled"], c["v1"])):
        assert len(filled) == len(v1), f"trajectory {i}: {len(filled)} old log-probs for {len(v1)} tokens"
        assert filled[:k] == v0, f"trajectory {i}: stage 1 values changed: {filled[:k]} vs {v0}"
        for t in range(k, len(v1)):
            assert abs(filled[t] - v1[t]) < 1e-5, f"trajectory {i} token {t}: {filled[t]} vs version 1 {v1[t]}"
        if k < len(v1):
            assert max(abs(a - b) for a, b in zip(v0, v1[:k])) > 1e-3, f"trajectory {i}: versions indistinguishable"
    assert results[0]["rollout_source"] == [[-0.5] * len(v) for v in c["v1"]]  # old_logprob_source: rollout


def test_update_supplies_old_logprobs_of_the_policy_before_it(results):
    s = results[0]["self_old"]
    for i, (before, after) in enumerate(zip(s["before"], s["after_update"])):
        half = len(before) // 2
        assert after[:half] == [-9.0] * half, f"row {i}: known old log-probs overwritten"
        for t in range(half, len(before)):
            assert abs(after[t] - before[t]) < 1e-5, f"row {i} token {t}: {after[t]} vs pre-update {before[t]}"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_two_mini_batches_report_means_not_sums(results, agg):
    s = results[0][f"mini_batches/{agg}"]
    both, first, second = s["both"], s["first"], s["second"]
    assert close(both["loss"], (first["loss"] + second["loss"]) / 2), (both, first, second)
    assert close(both["grad_norm"], (first["grad_norm"] + second["grad_norm"]) / 2), (both, first, second)
    for key in ("entropy", "approx_kl", "clip_frac"):  # token-weighted over the step's trained tokens
        lo, hi = sorted((first[key], second[key]))
        assert lo - 1e-6 <= both[key] <= hi + 1e-6, f"{key}: {both[key]} outside [{lo}, {hi}]"

"""Held-out metrics from known per-sample scores: greedy, mean@k, pass@k and per-source figures, exactly; the
unbiased pass@k against its closed form."""
import math

import pytest

from report import eval_metrics, eval_sums, pass_at_k


@pytest.mark.parametrize("n, c, k", [(1, 0, 1), (1, 1, 1), (4, 0, 2), (4, 1, 2), (4, 3, 2), (5, 2, 3), (8, 8, 4),
                                     (10, 1, 1), (16, 3, 8)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    want = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert abs(pass_at_k(n, c, k) - want) < 1e-12, (n, c, k)


def test_eval_metrics_from_known_scores():
    k = 3
    rows = [{"data_source": "a"}, {"data_source": "b"}, {"data_source": "a"}, {"data_source": "b"}]
    scores = [1.0, 1.0, 0.0, 1.0,  # a: greedy right, 2 of 3 samples
              0.0, 0.0, 0.0, 0.0,  # b: nothing
              0.0, 0.0, 1.0, 0.0,  # a: greedy wrong, 1 of 3
              1.0, 0.5, 0.5, 1.0]  # b: greedy right, partial credit 0.5 does not pass
    sources = ["a", "b"]
    half = eval_sums(rows[:2], scores[:8], k, sources)  # two ranks' shares, summed as all_sum would
    other = eval_sums(rows[2:], scores[8:], k, sources)
    m = eval_metrics([x + y for x, y in zip(half, other)], sources, k)
    assert m == {
        "eval/greedy_acc": 2 / 4, "eval/mean@3": (2 + 0 + 1 + 2) / 12, "eval/pass@3": (1 + 0 + 1 + 1) / 4,
        "eval/a/greedy_acc": 1 / 2, "eval/a/mean@3": 3 / 6, "eval/a/pass@3": 1.0,
        "eval/b/greedy_acc": 1 / 2, "eval/b/mean@3": 2 / 6, "eval/b/pass@3": 1 / 2,
        "eval/rows": 4}
    single = eval_metrics(eval_sums(rows[:1], scores[:4], k, ["a"]), ["a"], k)
    assert single == {"eval/greedy_acc": 1.0, "eval/mean@3": 2 / 3, "eval/pass@3": 1.0, "eval/rows": 1}


def test_greedy_completion_is_not_one_of_the_k_samples():
    """mean@k and pass@k are figures of the k samples alone: a right greedy answer moves greedy_acc and nothing else
    (here no sample passes, so pass@3 stays 0)."""
    for greedy in (0.0, 1.0):
        m = eval_metrics(eval_sums([{"data_source": "a"}], [greedy, 0.0, 0.5, 0.0], 3, ["a"]), ["a"], 3)
        assert m == {"eval/greedy_acc": greedy, "eval/mean@3": 0.5 / 3, "eval/pass@3": 0.0, "eval/rows": 1}, greedy

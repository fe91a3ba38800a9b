"""The math reward: equivalent forms, wrong and missing answers, hostile text; the reward pool."""
import time

import pytest

from rewards.math import gold, math_reward
from rewards.pool import RewardPool


@pytest.mark.parametrize("completion, answer", [
    ("so 12+7=19. \\boxed{19}", "19"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac12"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("first \\boxed{3} then corrected \\boxed{4}", "4"),
    ("the answer is \\boxed 5", "5"),  # brace-less: math-verify's own extraction accepts it
    ("so \\fbox{7}.", "7"),
    ("\\boxed{3} then \\fbox 12.", "12"),
    ("\\boxed{8} and a \\boxedfoo macro", "8"),  # \boxedfoo is another command
])
def test_equivalent_forms_score_one(completion, answer):
    score, info = math_reward(completion, answer)
    assert score == 1.0 and info["reason"] == "ok"


def test_a_gold_answer_is_parsed_once():
    """A group's samples share the gold parse (cached); the gold's own text scores 1 without a second parse, and an
    equivalent or wrong form still goes through math-verify."""
    gold.cache_clear()
    got = [math_reward(c, "\\frac{7}{2}") for c in ("\\boxed{3.5}", "\\boxed{ \\frac{7}{2} }", "\\boxed{3}")]
    assert [(s, i["reason"]) for s, i in got] == [(1.0, "ok"), (1.0, "ok"), (0.0, "wrong")]
    assert (gold.cache_info().misses, gold.cache_info().hits) == (1, 2)


@pytest.mark.parametrize("completion, answer, reason", [
    ("\\boxed{18}", "19", "wrong"),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{8}", "wrong"),
    ("\\boxed{1.2}", "1.23", "wrong"),  # decimals compared past the first place (math-verify rounds at the 6th)
    ("\\boxed{3.1416}", "3.14159", "wrong"),
    ("the answer is 19", "19", "no_answer"),
    ("\\boxed{19", "19", "no_answer"),
    ("", "19", "no_answer"),
])
def test_wrong_and_missing(completion, answer, reason):
    score, info = math_reward(completion, answer)
    assert score == 0.0 and info["reason"] == reason


@pytest.mark.parametrize("completion, score, reason", [
    ("\\boxed{" + "{" * 200_000, 0.0, "too_long"),  # deeply nested: over MAX_DEPTH
    ("x" * 20_000_000 + "\\boxed{3}", 1.0, "ok"),  # huge, but the answer is there
    ("\\boxed{" + "(" * 50 + "1" + ")" * 50 + "}", 0.0, "too_long"),  # nesting that makes sympy crawl
    ("\\boxed{" + "9^{" * 5 + "9" + "}" * 5 + "}", 0.0, "timeout"),  # a power tower: the verifier's timeout
    ("\\boxed{" + "1+" * 5000 + "1}", 0.0, "too_long"),  # over the length cap
    ("\\boxed " + "7" * 300, 0.0, "too_long"),  # a brace-less answer over the length cap
])
def test_hostile_text_returns_promptly(completion, score, reason):
    t0 = time.monotonic()
    got, info = math_reward(completion, "3")
    assert time.monotonic() - t0 < 5.0
    assert (got, info["reason"]) == (score, reason), info


def _sleepy(row, completion):
    if completion == "hang":
        time.sleep(60)
    if completion == "die":
        import os
        os._exit(3)
    if completion == "raise":
        raise RuntimeError("verifier bug")
    return math_reward(completion, row["answer"])


def test_pool_scores_timeouts_and_crashes_zero_and_counts_them():
    pool = RewardPool(workers=2, timeout_s=2.0, fn=_sleepy)
    try:
        row = {"answer": "4"}
        t0 = time.monotonic()
        out = pool.score([(row, "\\boxed{4}"), (row, "hang"), (row, "die"), (row, "raise"), (row, "\\boxed{5}"),
                          (row, "\\boxed{4}")])
        assert time.monotonic() - t0 < 50  # the hung job (60 s) was cut at 2 s; replaced workers' start-ups count
        assert [s for s, _ in out] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        assert [i["reason"] for _, i in out] == ["ok", "timeout", "crash", "error", "wrong", "ok"]
        assert pool.score([(row, "\\boxed{4}")])[0][0] == 1.0  # replaced workers keep serving
    finally:
        pool.close()


def test_numeric_answers_from_a_data_file_score(tmp_path):
    """GSM8K-style rows carry numbers: `"answer": 42` loads and scores like "42" (it used to raise inside the scorer
    and score 0 with reason error for every completion); close numbers are not equal (no rounding)."""
    import json
    from data.rows import load_rows
    from tasks import score_row
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "6*7?", "answer": 42}, {"prompt": "1.23?", "answer": 1.23}, {"prompt": "-3?", "answer": -3})))
    rows = load_rows(str(path), "rl")
    assert [score_row(r, f"so \\boxed{{{t}}}")[0] for r, t in zip(rows, ("42", "1.23", "-3"))] == [1.0, 1.0, 1.0]
    assert score_row(rows[0], "\\boxed{41}") == (0.0, {"reason": "wrong", "pred": "41"})
    for near in ("1.2", "1.230001", "1.22"):
        assert score_row(rows[1], f"\\boxed{{{near}}}")[0] == 0.0, near
    assert math_reward("\\boxed{0.5}", 0.5)[0] == 1.0 and math_reward("\\boxed{1/2}", 0.5)[0] == 1.0


@pytest.mark.parametrize("answer", [True, "", "  ", float("nan"), None, [1]])
def test_answers_that_cannot_be_scored_are_refused_at_load(answer):
    from tasks import check_math
    assert check_math({"answer": answer}) == "'answer' must be a non-empty string or a number"


def test_a_step_whose_rewards_all_fail_stops_the_run(world_of_one):
    """Every sample's reward failed: a data or code bug, which the run reports (file:row, reason) instead of training
    on all-zero rewards; one success in the step is enough to go on."""
    import torch
    import trainer
    from rollout.copris import Group
    run = trainer.Run(trainer.Config(), 0, 1, torch.device("cpu"), None, None)
    row = {"_where": "gsm.jsonl:7", "task": "math"}
    failing = [Group(0, row, [], scores=[(0.0, {"reason": "error", "error": "AttributeError: 'int' object"})] * 4)]
    with pytest.raises(trainer.TrainingError, match="gsm.jsonl:7 .*error: AttributeError"):
        trainer.stop_if_rewards_failed(run, 1, failing)
    trainer.stop_if_rewards_failed(run, 1, failing + [Group(1, row, [], scores=[(0.0, {"reason": "wrong"})])])
    mine = {"reason": "reward_error", "failed": {"f": ["raised", "m.py:3 (f): KeyError: 'x'"]}, "error": "m.py:3 (f): KeyError: 'x'"}
    with pytest.raises(trainer.TrainingError, match=r"reward_error: m.py:3 \(f\): KeyError: 'x'; check that reward function$"):
        trainer.stop_if_rewards_failed(run, 1, [Group(0, row, [], scores=[(0.0, mine)] * 4)])

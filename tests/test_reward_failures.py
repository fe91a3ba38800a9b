"""A reward that could not look at a sample is never a silent 0 (issue 52): each reason of tasks.NOT_SCORED, through
the trainer's own wiring (tests/fake_rl.py), is counted in reward_errors and reward_errors/<reason>, printed in the
step's line on the console, and a step in which every sample failed stops the run with that reason and its row."""
import zlib

import pytest

from fake_rl import run_args, train
from tasks import NOT_SCORED
from trainer import TrainingError


def failing(reason: str, share: int):
    """A job function: samples whose crc32 % 4 < share fail with `reason` (scored 0), the others score 1."""
    def score(row, completion, ctx=None):
        if zlib.crc32(completion.encode()) % 4 < share:
            return 0.0, {"reason": reason, "detail": f"{reason}: the reward did not look"}
        return 1.0, {"reason": "ok"}
    return score


# named here, not read from NOT_SCORED: a reason dropped from it must fail its test, not lose it
LOOKED_AWAY = ("no_sandbox", "sandbox_error", "reference_error", "harness_error", "error", "bad_answer")


def test_the_set_holds_every_reason():
    assert set(LOOKED_AWAY) | {"reward_error"} == NOT_SCORED


@pytest.mark.parametrize("reason", LOOKED_AWAY)
def test_each_reason_is_counted_said_and_stops_a_step_where_all_failed(world_of_one, tiny, tmp_path, capsys, reason):
    res = train(run_args(tiny, tmp_path / "some", "--steps=2"), score=failing(reason, 2))
    for m, call in zip(res.metrics[1:], res.pool.calls):
        n = sum(info["reason"] == reason for _, info in call)
        assert m["reward_errors"] == n and m.get(f"reward_errors/{reason}", 0) == n, m
        assert all(k == f"reward_errors/{reason}" for k in m if k.startswith("reward_errors/")), m
    out = capsys.readouterr().out
    assert f"sample {reason} x" in out and f"{reason}: the reward did not look" in out, out[-2000:]
    with pytest.raises(TrainingError, match=f"every reward of this step failed .*{reason}"):
        train(run_args(tiny, tmp_path / "all"), score=failing(reason, 4))


def test_ordinary_zeros_are_not_failures(world_of_one, tiny, tmp_path):
    res = train(run_args(tiny, tmp_path / "wrong"), score=lambda row, completion, ctx=None: (0.0, {"reason": "wrong"}))
    assert res.metrics[1]["reward_errors"] == 0 and not any(k.startswith("reward_errors/") for k in res.metrics[1])

"""A reward that could not look at a sample is never a silent 0 (issue 52): each reason of tasks.NOT_SCORED, through
the trainer's own wiring (tests/fake_rl.py), is counted in reward_errors and reward_errors/<reason>, printed in the
step's line on the console, and a step in which every sample failed stops the run with that reason and its row."""
import json
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


def test_a_rank_whose_triton_reward_cannot_score_stops_at_start(world_of_one, tiny, tmp_path, monkeypatch):
    """The preflight (trainer.start_rewards): with Triton rows, each rank scores the shipped relu solution through
    its reward pool first. On CPU it scores 1.0 and the run goes on; where the native run cannot look (the device
    says cuda, and this machine has none: the reference on the GPU fails) the run stops at start, in one line."""
    from data.triton_tasks import load_tasks
    from rewards.triton import kernel
    relu = next(t for t in load_tasks() if t["name"] == "relu")
    rows = tmp_path / "triton.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "prompt": "write a relu kernel", "task": "triton",
                                        "reference_code": relu["reference_code"]}) + "\n" for i in range(4)))
    res = train(run_args(tiny, tmp_path / "cpu", f"--train_data={rows}"))
    assert res.metrics[1]["reward_errors"] == 0 and len(res.updates) == 1
    monkeypatch.setattr(kernel, "_device", lambda: "cuda")
    with pytest.raises(TrainingError, match="preflight: the shipped relu solution scored 0.0 on this rank "
                                            r"\(reference_error"):
        train(run_args(tiny, tmp_path / "cuda", f"--train_data={rows}"))

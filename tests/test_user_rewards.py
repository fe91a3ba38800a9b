"""Reward functions from the user's file (reward.funcs, rewards/user.py): the weighted sum and its components, the
contract (row, completion[, messages]) -> float | (float, info), errors named per sample and never the run's end,
start-up errors as one line; and a short RL run on the tiny model's demo task with docs/data.md's example file
(two weighted functions plus one that raises on some samples): every logged sample's reward is the weighted sum
of its components, the failing samples carry reason reward_error naming the function, the run ends normally with
reward/<function>, lr (linear schedule) and samples.jsonl, and its export serves chat without flags (chat template)."""
import json
import math
import re
import subprocess

import pytest

from helpers import ENV, ROOT, metrics, rl_args, trainer_cmd
from rewards.user import SpecError, UserReward, messages_of, parse

EXAMPLE = "rewards/example_reward_funcs.py"
ROW = {"prompt": "Eli has 5 books. Eli loses 2. How many books now? Answer:", "task": "math", "answer": "3"}


def user_file(tmp_path, body: str, name: str = "mine.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_weighted_sum_and_components():
    u = UserReward(parse([f"{EXAMPLE}:boxed_answer", f"{EXAMPLE}:digit_share"], [1.0, 0.5]))
    score, info = u(ROW, "5-2=3 \\boxed{3}")
    digits = 4 / 14  # 5, 2, 3, 3 of the 14 non-space characters
    assert info["components"] == {"boxed_answer": 1.0, "digit_share": pytest.approx(digits)}
    assert score == pytest.approx(1.0 + 0.5 * digits) and info["reason"] == "ok"
    assert u(ROW, "\\boxed{4}")[0] == pytest.approx(0.5 * 1 / 9)


def test_the_rows_task_is_a_component_and_keeps_its_reason():
    u = UserReward(parse(["task", f"{EXAMPLE}:digit_share"], [2.0, 1.0]))
    assert u(ROW, "\\boxed{3}")[0] == pytest.approx(2.0 + 1 / 9)
    score, info = u(ROW, "no box here")
    assert score == 0.0 and info["reason"] != "ok" and info["components"]["task"] == 0.0


def test_messages_reach_a_three_argument_function(tmp_path):
    path = user_file(tmp_path, "def turns(row, completion, messages):\n"
                               "    return (len(messages or []), {'roles': [m['role'] for m in messages or []]})\n")
    u = UserReward(parse([f"{path}:turns"], []))
    msgs = messages_of(ROW, [{"role": "model", "text": "<tool_call>..."}, {"role": "tool", "text": "3"},
                             {"role": "model", "text": "\\boxed{3}"}])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[0]["content"] == ROW["prompt"]
    assert u(ROW, "x", {"messages": msgs}) == (4.0, {"reason": "ok", "components": {"turns": 4.0}})
    assert u(ROW, "x")[0] == 0.0  # a single-turn row: messages is None


@pytest.mark.parametrize("body, reason, error", [
    ("def f(row, completion):\n    x = 0\n    return 1 / x\n", "raised", "mine.py:3 (f): ZeroDivisionError"),
    ("def g(x):\n    return x[5]\ndef f(row, completion):\n    return g(completion)\n", "raised",
     "mine.py:2 (f): IndexError"),  # the deepest line of the user's file
    ("import json\ndef f(row, completion):\n    return json.loads(completion + 'x')\n", "raised",
     "mine.py:3 (f): JSONDecodeError"),  # raised in the standard library: the user's line is named
    ("def f(row, completion):\n    return float('nan')\n", "bad_return", "mine.py:1 (f): returned nan"),
    ("def f(row, completion):\n    return 'high'\n", "bad_return", "mine.py:1 (f): returned 'high'"),
    ("def f(row, completion):\n    return (1.0, 2.0)\n", "bad_return", "mine.py:1 (f): returned (1.0, 2.0)"),
    ("def f(row, completion):\n    return True\n", "bad_return", "mine.py:1 (f): returned True"),
    ("import not_a_package_here\ndef f(row, completion):\n    return 1.0\n", "import",
     "mine.py:1 (import): ModuleNotFoundError"),
    ("def f(completions, **kwargs):\n    return [1.0, 2.0]\n", "bad_return", "mine.py:1 (f): returned [1.0, 2.0]: "
     "expected a list of one"),
])
def test_a_failing_function_is_that_components_failure(tmp_path, body, reason, error):
    """The component that failed is left out of the sum (as a None is), the sample's other components still count,
    and the info names the function, the reason and the file's line."""
    u = UserReward(parse([f"{user_file(tmp_path, body)}:f", f"{EXAMPLE}:digit_share"], [1.0, 0.5]))
    score, info = u(ROW, "123")
    assert info["components"] == {"digit_share": 1.0} and score == 0.5, info
    assert info["reason"] == "reward_error" and info["failed"]["f"][0] == reason, info
    assert info["error"].startswith(error) and info["failed"]["f"][1] == info["error"], info


@pytest.mark.parametrize("funcs, weights, said", [
    (["nothere.py:f"], [], "no such file nothere.py"),
    (["rewards/example_reward_funcs.py"], [], "expected file.py:function"),
    ([f"{EXAMPLE}:missing"], [], "has no top-level def 'missing'"),
    ([f"{EXAMPLE}:boxed_answer"], [1.0, 2.0], "2 values for 1 reward.funcs"),
    ([f"{EXAMPLE}:boxed_answer"], [math.inf], "finite"),
])
def test_unusable_entries_are_refused_at_start(funcs, weights, said):
    with pytest.raises(SpecError, match=said):
        parse(funcs, weights)


@pytest.mark.parametrize("body, said", [
    ("def f(x):\n    return 1.0\n", "mine.py:1: f(x) is none of the reward shapes"),
    ("def f(*args):\n    return 1.0\n", "f() is none of the reward shapes"),
    ("x = 1\ndef f(row, completion)\n    return 1.0\n", "mine.py:2: expected ':'"),
    ("f = lambda row, completion: 1.0\n", "mine.py has no top-level def 'f'"),
])
def test_shapes_and_syntax_are_refused_at_start_without_running_the_file(tmp_path, body, said):
    """parse reads the def with ast: the file's top level never runs in the launcher or the ranks."""
    marker = tmp_path / "ran"
    path = user_file(tmp_path, body + f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(SpecError, match=re.escape(said)):
        parse([path + ":f"], [])
    assert not marker.exists()


def test_a_bad_entry_is_one_line_and_exit_2(tiny, tmp_path):
    p = subprocess.run(trainer_cmd(2, *rl_args(tiny, tmp_path / "run"), "--reward.funcs=rewards/nope.py:f"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines == ["config error: reward.funcs entry 'rewards/nope.py:f': no such file rewards/nope.py"], lines


def test_a_file_that_raises_on_import_is_refused_by_the_launcher(tiny, tmp_path):
    """The launcher imports reward.funcs' files in a reward worker of its own (never in itself) before any rank
    starts: exit 2, one line with the file's line, no rank started (no train.log)."""
    path = user_file(tmp_path, "import json\nCONFIG = json.loads('{')\ndef f(row, completion):\n    return 1.0\n")
    p = subprocess.run(trainer_cmd(2, *rl_args(tiny, tmp_path / "run"), f"--reward.funcs={path}:f"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith("config error: reward.funcs: mine.py:2 (import): JSONDecodeError"), lines
    assert not (tmp_path / "run" / "train.log").exists()


FLAKY = "def flaky(completions, **kwargs):  # TRL's shape\n    if len(completions[0]) % 3 == 0:\n" \
        "        raise ValueError('a third fail')\n    return [0.0 for _ in completions]\n"
VERL = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # verl's shape\n" \
       "    return {'score': float(ground_truth in solution_str), 'data_source': data_source}\n"


def test_user_reward_file_trains_the_demo_task(tiny, tmp_path):
    """2 ranks, 3 steps of GRPO on the demo's arithmetic rows with the example's function (our shape), a verl-shaped
    compute_score, a TRL-shaped function that raises on about a third of the samples and one of our shape."""
    flaky, verl = user_file(tmp_path, FLAKY), user_file(tmp_path, VERL, "verl_score.py")
    run_dir = tmp_path / "run"
    p = subprocess.run(trainer_cmd(2, *rl_args(tiny, run_dir, "--steps=3", "--save_every=0", "--log_samples=100",
                                               "--lr_schedule=linear", "--warmup_steps=1",
                                               f"--reward.funcs={EXAMPLE}:boxed_answer,{EXAMPLE}:digit_share,"
                                               f"{flaky}:flaky,{verl}:compute_score", "--reward.weights=1,0.5,1,2")),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    steps = metrics(run_dir)[1:]
    assert [m["step"] for m in steps] == [1, 2, 3]
    said = re.findall(r"step (\d): rewards failed for (\d+) of 16 samples: flaky raised x(\d+); first: mine.py:3 "
                      r"\(flaky\): ValueError: a third fail", p.stdout)
    log = (run_dir / "train.log").read_text()
    for m in steps:
        assert {"reward/boxed_answer", "reward/digit_share", "reward/flaky", "reward/compute_score"} <= set(m)
        assert 0 < m["reward_errors"] < 16, m["reward_errors"]  # 16 samples a step over both ranks
        n = str(int(m["reward_errors"]))
        assert (str(m["step"]), n, n) in said, (m, p.stdout[-3000:])
        assert f"step {m['step']}: rewards failed for {n} of 16" in log
        assert m["reward/digit_share"] > 0
    # lr: warm-up step, then linear from the peak (1e-3) to 10% at the last step: 3 steps -> 1e-3, 1e-3, 1e-4
    assert [m["lr"] for m in steps] == pytest.approx([1e-3, 1e-3, 1e-4])
    samples = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert {s["step"] for s in samples} == {1, 2, 3} and len(samples) == 3 * 8  # rank 0's 8 samples a step
    failed = [s for s in samples if s["reason"] == "reward_error"]
    assert failed and all(s["error"] == "mine.py:3 (flaky): ValueError: a third fail" for s in failed)
    for s in samples:  # the logged reward is the weighted sum of the logged components (the failed one left out)
        c = s["components"]
        assert isinstance(s["prompt"], str) and (len(s["completion"]) % 3 == 0) == (s in failed) == ("flaky" not in c)
        assert s["reward"] == pytest.approx(c["boxed_answer"] + 0.5 * c["digit_share"] + c.get("flaky", 0.0)
                                            + 2 * c["compute_score"])
    template = (run_dir / "export" / "chat_template.jinja").read_text()
    assert template == (ROOT / "rollout" / "plain_tools.jinja").read_text()  # the tiny model has no template

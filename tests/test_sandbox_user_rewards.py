"""reward.sandbox: the user's reward functions run in the bubblewrap sandbox (rewards/sandbox.py) and give the same
scores as in the worker, but see nothing of the repository or the network, and their failures still name the
function. (A test_sandbox_* file: conftest.py insists on real isolation.)"""
import pytest

from helpers import ROOT
from rewards.user import SpecError, UserReward, parse

EXAMPLE = "rewards/example_reward_funcs.py"
ROW = {"prompt": "Eli has 5 books. Eli loses 2. How many books now? Answer:", "task": "math", "answer": "3",
       "_where": "x.jsonl:1", "prompt_ids": [1, 2]}


def test_sandboxed_functions_score_as_in_the_worker():
    specs = parse([f"{EXAMPLE}:boxed_answer", f"{EXAMPLE}:digit_share"], [1.0, 0.5])
    for text in ("5-2=3 \\boxed{3}", "\\boxed{4}", ""):
        assert UserReward(specs, sandbox=True)(ROW, text) == UserReward(specs)(ROW, text)


@pytest.mark.parametrize("body, error", [
    (f"def f(row, completion):\n    return float(len(open({str(ROOT / 'README.md')!r}).read()))\n",
     "mine.py:2 (f): FileNotFoundError"),
    ("import socket\ndef f(row, completion):\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
     "    return 1.0\n", "mine.py:3 (f): OSError"),
    ("def f(row, completion):\n    return 1 / 0\n", "mine.py:2 (f): ZeroDivisionError: division by zero"),
    ("def f(row, completion):\n    return 'high'\n", "mine.py:1 (f): returned 'high'"),
    ("def f(completions, **kwargs):\n    return [len(completions[0]) / 0]\n", "mine.py:2 (f): ZeroDivisionError"),
])
def test_what_the_sandbox_refuses_is_that_components_failure(tmp_path, body, error):
    """The failed component is named with the user's file and line (not the sandbox's copy of it); the other
    components still count."""
    path = tmp_path / "mine.py"
    path.write_text(body)
    score, info = UserReward(parse([f"{path}:f", f"{EXAMPLE}:digit_share"], []), sandbox=True)(ROW, "1x")
    assert score == 0.5 and info["reason"] == "reward_error" and info["error"].startswith(error), info


def test_the_same_function_reads_the_repository_outside_the_sandbox(tmp_path):
    """The file check above can fail: without reward.sandbox the same function reads README.md."""
    path = tmp_path / "outside.py"
    path.write_text(f"def f(row, completion):\n    return float(len(open({str(ROOT / 'README.md')!r}).read()))\n")
    score, info = UserReward(parse([f"{path}:f"], []))(ROW, "x")
    assert score == len((ROOT / "README.md").read_text()) and info["reason"] == "ok"


def test_the_file_is_read_at_start_not_run(tmp_path):
    """parse checks the def without importing the file (its top level would run outside the sandbox)."""
    path = tmp_path / "loud.py"
    marker = tmp_path / "ran"
    path.write_text(f"open({str(marker)!r}, 'w').close()\ndef f(row, completion):\n    return 1.0\n")
    (spec,) = parse([f"{path}:f"], [])
    assert spec[1] == "f" and not marker.exists()
    with pytest.raises(SpecError, match="no top-level def 'g'"):
        parse([f"{path}:g"], [])
    with pytest.raises(SpecError, match="none of the reward shapes"):
        path.write_text("def f(row):\n    return 1.0\n")
        parse([f"{path}:f"], [])
    assert UserReward(parse([f"{EXAMPLE}:boxed_answer"], []), sandbox=True)(ROW, "\\boxed{3}")[0] == 1.0

"""rewards/code.py: share of tests passed, both test formats, per-test timeout, hostile solutions."""
import pytest

from rewards.code import code_reward, extract_code

ADD_STDIO = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7", "0\n"]}
ADD_ASSERTS = ["assert add(1, 2) == 3", "assert add(10, -3) == 7", "assert add(0, 0) == 0"]


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\nDone."


def test_extract_code():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```python\ny = 2\n```\nc") == "y = 2"
    assert extract_code("text\n```python\nz = 3\n") == "z = 3"           # unclosed last block (truncated output)
    assert extract_code("  w = 4  ") == "w = 4"
    assert extract_code("```\nnot python\n```") == "```\nnot python\n```"


@pytest.mark.parametrize("tests", [ADD_STDIO, [{"input": i, "output": o} for i, o in
                                                zip(ADD_STDIO["inputs"], ADD_STDIO["outputs"])]])
def test_stdio_all_pass(tests):
    score, info = code_reward(fenced("a, b = map(int, input().split())\nprint(a + b)"), tests)
    assert score == 1.0 and info["reason"] == "ok" and info["per_test"] == ["ok"] * 3, info


def test_share_of_tests_passed():
    # right for the first two, wrong for 0 0
    score, info = code_reward(fenced("a, b = map(int, input().split())\nprint(a + b if a else 5)"), ADD_STDIO)
    assert score == pytest.approx(2 / 3) and info["per_test"] == ["ok", "ok", "wrong_answer"], info
    assert info["reason"] == "wrong_answer" and (info["passed"], info["total"]) == (2, 3)


def test_asserts():
    score, info = code_reward(fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS)
    assert score == 1.0, info
    score, info = code_reward(fenced("def add(a, b):\n    return a + b + (a == 0)"), ADD_ASSERTS)
    assert score == pytest.approx(2 / 3) and info["per_test"][2] == "runtime_error", info


@pytest.mark.parametrize("code, reason", [
    ("import sys\nsys.exit(0)", "early_exit"),
    ("import os\nos._exit(0)", "early_exit"),
    ("raise SystemExit(0)", "early_exit"),
])
def test_early_exit_does_not_pass_asserts(code, reason):
    score, info = code_reward(fenced(code), ADD_ASSERTS)
    assert score == 0.0 and info["per_test"] == [reason] * 3, info


def test_per_test_timeout_and_crash():
    code = "a, b = map(int, input().split())\nif a == 10:\n    while True: pass\n" \
           "if a == 0:\n    import os, signal; os.kill(os.getpid(), signal.SIGSEGV)\nprint(a + b)"
    score, info = code_reward(fenced(code), ADD_STDIO, timeout_s=2)
    assert info["per_test"] == ["ok", "timeout", "crash"], info
    assert score == pytest.approx(1 / 3) and info["time_s"] < 30


@pytest.mark.parametrize("completion, tests, reason", [
    ("", ADD_ASSERTS, "no_code"),
    (fenced("def add(a, b) return a"), ADD_ASSERTS, "syntax_error"),
    (fenced("print(1)"), [], "no_tests"),
    (None, ADD_ASSERTS, "no_code"),
])
def test_nothing_to_run(completion, tests, reason):
    score, info = code_reward(completion, tests)
    assert (score, info["reason"]) == (0.0, reason), info


def test_memory_bomb_and_output_flood():
    score, info = code_reward(fenced("x = bytearray(8 << 30)"), ["pass"])
    assert (score, info["reason"]) == (0.0, "runtime_error"), info
    score, info = code_reward(fenced("print('x' * 10**6)"), {"inputs": [""], "outputs": ["x"]})
    assert (score, info["reason"]) == (0.0, "output_too_large"), info

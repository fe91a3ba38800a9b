"""rewards/code.py: share of tests passed, both test formats, per-test timeout, hostile solutions.

Execution needs bubblewrap (without it the reward refuses: no_sandbox, tested with a stand-in)."""
import pytest

from rewards import sandbox
from rewards.code import code_reward, extract_code
from rewards.sandbox import OPT_OUT_ENV, bwrap_problem, running_sandboxes

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"needs isolation: {bwrap_problem()}")

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
    assert score == pytest.approx(2 / 3) and info["per_test"] == ["ok", "ok", "wrong_answer"], info
    score, info = code_reward(fenced("def add(a, b):\n    return a + b if a else None + 1"), ADD_ASSERTS)
    assert score == pytest.approx(2 / 3) and info["per_test"] == ["ok", "ok", "runtime_error"], info


def test_asserts_see_objects_mutation_and_iteration():
    code = """
class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)
        return len(self.items)

def sort_in_place(xs):
    xs.sort()

def count(n):
    yield from range(n)
"""
    tests = ["s = Stack()\nassert s.push(4) == 1 and s.push(5) == 2\nassert s.items == [4, 5]",
             "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
             "assert list(count(3)) == [0, 1, 2] and sum(count(4)) == 6",
             "import math\nassert math.isclose(len(Stack().items) + 0.5, 0.5)"]
    score, info = code_reward(fenced(code), tests)
    assert (score, info["per_test"]) == (1.0, ["ok"] * 4), info


@pytest.mark.parametrize("code, reason", [
    ("import sys\nsys.exit(0)", "early_exit"),
    ("import os\nos._exit(0)", "early_exit"),
    ("raise SystemExit(0)", "early_exit"),
    ("def add(a, b):\n    raise SystemExit(0)", "runtime_error"),
    ("def add(a, b):\n    raise KeyboardInterrupt", "runtime_error"),
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
    (fenced("def add(a, b):\n    return a + b  # \ud800"), ADD_ASSERTS, "syntax_error"),
    (fenced("def add(a, b):\n    return a + b"), [{"input": "1"}], "reward_error"),
])
def test_nothing_to_run(completion, tests, reason):
    score, info = code_reward(completion, tests)
    assert (score, info["reason"]) == (0.0, reason), info


def test_memory_bomb_and_output_flood():
    score, info = code_reward(fenced("x = bytearray(8 << 30)"), ["pass"])
    assert (score, info["reason"]) == (0.0, "runtime_error"), info
    score, info = code_reward(fenced("print('x' * 10**6)"), {"inputs": [""], "outputs": ["x"]})
    assert (score, info["reason"]) == (0.0, "output_too_large"), info


# ---- issue 16: cheats that scored 1.0 when the asserts ran in the candidate's interpreter next to a pass token
TOKEN_FROM_MAIN = """import __main__, os
print(getattr(__main__, "token", ""), flush=True)
os._exit(0)"""
TOKEN_FROM_FRAMES = """import os, sys
f = sys._getframe()
while f is not None and "token" not in f.f_globals:
    f = f.f_back
print(f.f_globals["token"] if f else "", flush=True)
os._exit(0)"""
TOKEN_FROM_GC = """import gc, os
print(next((o["token"] for o in gc.get_objects() if type(o) is dict and type(o.get("token")) is str), ""), flush=True)
os._exit(0)"""
EXEC_REPLACED = "import builtins\nbuiltins.exec = lambda *a, **k: None"
COMPILE_REPLACED = """import builtins
real = builtins.compile
builtins.compile = lambda *a, **k: real("pass", "test.py", "exec")"""
READS_TEST_FILE = """import re
TABLE = {(int(a), int(b)): int(r) for a, b, r in re.findall(r"add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)",
                                                              open("test.py").read())}
def add(a, b):
    return TABLE[(a, b)]"""
ATEXIT_HOOK = """import atexit, os, __main__
def hook():
    print(getattr(__main__, "token", ""), flush=True)
    os._exit(0)
atexit.register(hook)
def add(a, b):
    return -1"""
EQUAL_TO_EVERYTHING = """class Any:
    def __eq__(self, other):
        return True
def add(a, b):
    return Any()"""
INT_SUBCLASS = """class I(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return I(0)"""
SHADOWS_SORTED = "def rev(xs):\n    return xs\nsorted = lambda xs: [1, 2, 3]"
TRUTHY_OBJECT = "def is_even(n):\n    return object()"
EVEN_ASSERTS = ["assert is_even(4)", "assert is_even(10)"]
CHEATS = [
    ("pass_token_from_main_module", TOKEN_FROM_MAIN, ADD_ASSERTS, "early_exit"),
    ("pass_token_from_frame_globals", TOKEN_FROM_FRAMES, ADD_ASSERTS, "early_exit"),
    ("pass_token_from_gc_scan", TOKEN_FROM_GC, ADD_ASSERTS, "early_exit"),
    ("builtins_exec_replaced", EXEC_REPLACED, ADD_ASSERTS, "runtime_error"),
    ("builtins_compile_replaced", COMPILE_REPLACED, ADD_ASSERTS, "runtime_error"),
    ("expected_values_read_from_test_file", READS_TEST_FILE, ADD_ASSERTS, "runtime_error"),
    ("atexit_hook_prints_token", ATEXIT_HOOK, ADD_ASSERTS, "wrong_answer"),
    ("object_equal_to_everything", EQUAL_TO_EVERYTHING, ADD_ASSERTS, "wrong_answer"),
    ("int_subclass_equal_to_everything", INT_SUBCLASS, ADD_ASSERTS, "wrong_answer"),
    ("builtin_used_by_the_test_shadowed", SHADOWS_SORTED, ["assert sorted(rev([3, 1, 2])) == [1, 2, 3]"],
     "shadowed_builtin"),
    ("truthy_object_for_bare_asserts", TRUTHY_OBJECT, EVEN_ASSERTS, "runtime_error"),
]


@pytest.mark.parametrize("code, tests, reason", [c[1:] for c in CHEATS], ids=[c[0] for c in CHEATS])
def test_assert_cheats_score_zero(code, tests, reason):
    score, info = code_reward(fenced(code), tests)
    assert (score, info["per_test"]) == (0.0, [reason] * len(tests)), info
    assert running_sandboxes(wait_s=10) == []


# ---- issue 36: a test's free names that are standard-library modules are the tester's own, never the candidate's.
# Each candidate defines the module the test uses without importing it (MBPP style) and scored 1.0 before.
OWN_MATH = """class math:
    @staticmethod
    def isclose(*args, **kwargs):
        return True
def circle_area(r):
    return 0"""
OWN_RE = """class re:
    @staticmethod
    def fullmatch(pattern, text):
        return True
def phone(digits):
    return ''"""
OWN_ITERTOOLS = """class itertools:
    @staticmethod
    def combinations(xs, k):
        return []
def pairs(xs):
    return []"""
OWN_COLLECTIONS = """class collections:
    @staticmethod
    def Counter(xs):
        return 1
def letters(text):
    return 'zzz'"""
STDLIB_TESTS = {
    "math": ["assert math.isclose(circle_area(2), 12.566, rel_tol=1e-3)"],
    "re": ["assert re.fullmatch(r'\\d{3}-\\d{4}', phone('5551234'))"],
    "itertools": ["assert sorted(pairs([1, 2, 3])) == sorted(itertools.combinations([1, 2, 3], 2))"],
    "collections": ["assert collections.Counter(letters('abca')) == collections.Counter('abca')"],
}
HONEST_STDLIB = {
    "math": "import math\ndef circle_area(r):\n    return math.pi * r * r",
    "re": "def phone(digits):\n    return digits[:3] + '-' + digits[3:]",
    "itertools": "def pairs(xs):\n    return [(a, b) for i, a in enumerate(xs) for b in xs[i + 1:]]",
    "collections": "def letters(text):\n    return list(text)",
}


@pytest.mark.parametrize("module, code", [("math", OWN_MATH), ("re", OWN_RE), ("itertools", OWN_ITERTOOLS),
                                          ("collections", OWN_COLLECTIONS)], ids=lambda x: x[:12])
def test_tests_resolve_standard_modules_themselves(module, code):
    score, info = code_reward(fenced(code), STDLIB_TESTS[module])
    assert (score, info["per_test"]) == (0.0, ["wrong_answer"]), info
    score, info = code_reward(fenced(HONEST_STDLIB[module]), STDLIB_TESTS[module])
    assert (score, info["reason"]) == (1.0, "ok"), info


# ---- issue 44: a candidate's exception is that test's failure, never the test's control flow; third-party
# modules a test uses without importing them (`np`) are the real ones. Each attack scored 1.0 before.
STOPS_ITERATION = "def is_even(n):\n    raise StopIteration"
CAUGHT_BY_THE_TEST = "def is_even(n):\n    raise KeyError(n)"
OWN_NUMPY = """class np:
    @staticmethod
    def isclose(*args, **kwargs):
        return True
def circle_area(r):
    return 0"""
RAISE_TESTS = ["assert all(map(is_even, [2, 4, 6]))",
               "try:\n    assert is_even(8)\nexcept KeyError:\n    pass"]
NUMPY_TESTS = ["assert np.isclose(circle_area(2), 12.566, rtol=1e-3)"]


@pytest.mark.parametrize("code, tests, reason, honest", [
    (STOPS_ITERATION, RAISE_TESTS[:1], "runtime_error", "def is_even(n):\n    return n % 2 == 0"),
    (CAUGHT_BY_THE_TEST, RAISE_TESTS[1:], "runtime_error", "def is_even(n):\n    return n % 2 == 0"),
    (OWN_NUMPY, NUMPY_TESTS, "wrong_answer", "import math\ndef circle_area(r):\n    return math.pi * r * r"),
], ids=["stop_iteration_ends_all_early", "exception_caught_by_the_test", "own_numpy"])
def test_candidate_exceptions_fail_and_third_party_modules_are_real(code, tests, reason, honest):
    score, info = code_reward(fenced(code), tests)
    assert (score, info["per_test"]) == (0.0, [reason]), info
    score, info = code_reward(fenced(honest), tests)
    assert (score, info["reason"]) == (1.0, "ok"), info


def test_no_isolation_fails_closed(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap not installed (apt-get install bubblewrap)")
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    score, info = code_reward(fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS)
    assert (score, info["reason"], info["per_test"]) == (0.0, "no_sandbox", []), info
    assert "bubblewrap" in info["detail"]
    monkeypatch.setenv(OPT_OUT_ENV, "1")          # the operator accepted the risk: rlimits only
    score, info = code_reward(fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS)
    assert (score, info["reason"]) == (1.0, "ok"), info


# ---- issue 52 (round 6): the tester's own errors are out of the test's reach, and a raise the test expects passes.
# Each attack scored 1.0 on e2de9f9, and the honest raise 0.0 (runtime_error).
EXPECTS_VALUE_ERROR = ["try:\n    check(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
                       "try:\n    out = check(-2)\n    assert False\nexcept ValueError:\n    pass",
                       "assert check(3) == 3"]
EXPECTS_ANY_ERROR = ["try:\n    check(-1)\nexcept Exception:\n    pass\nelse:\n    assert False",
                     "assert check(3) == 3"]
OVERSIZED_REPLY = "def check(n):\n    return 'x' * (1 << 25) if n < 0 else n"      # the tester's 16 MiB limit
LEAVES = "import os\ndef check(n):\n    if n < 0:\n        os._exit(0)\n    return n"
HONEST_RAISE = "def check(n):\n    if n < 0:\n        raise ValueError(n)\n    return n"
HONEST_OWN_CLASS = "class Negative(ValueError):\n    pass\ndef check(n):\n    if n < 0:\n        raise Negative(n)\n" \
    "    return n"


@pytest.mark.parametrize("code, tests, reasons, honest", [
    (OVERSIZED_REPLY, EXPECTS_VALUE_ERROR, ["runtime_error", "runtime_error", "ok"], HONEST_RAISE),
    (LEAVES, EXPECTS_ANY_ERROR, ["early_exit", "ok"], HONEST_OWN_CLASS),
], ids=["message_too_large_caught_by_the_test", "candidate_gone_caught_by_the_test"])
def test_tester_errors_are_out_of_reach_and_expected_raises_pass(code, tests, reasons, honest):
    score, info = code_reward(fenced(code), tests)
    assert info["per_test"] == reasons, info
    score, info = code_reward(fenced(honest), tests)
    assert (score, info["reason"]) == (1.0, "ok"), info


def test_a_raise_the_test_does_not_expect_fails_whatever_it_catches():
    """Only a call that is a whole statement of a try body may raise into the test: inside an assert, even a bare
    `except:` does not turn the candidate's exception into a pass; a deadline is the test's end too."""
    tests = ["try:\n    assert check(-1) == 0\nexcept:\n    pass", "try:\n    check(-1)\nexcept OSError:\n    pass"]
    score, info = code_reward(fenced(HONEST_RAISE), tests)
    assert info["per_test"] == ["runtime_error", "runtime_error"], info
    sleeper = "import time\ndef check(n):\n    time.sleep(30)"
    score, info = code_reward(fenced(sleeper), ["try:\n    check(-1)\nexcept Exception:\n    pass"], timeout_s=2)
    assert info["per_test"] == ["timeout"], info

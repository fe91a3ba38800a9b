"""Code reward with test cases (PRIME-style coding tasks), every test in its own sandbox (rewards/sandbox.py).

    score, info = code_reward(completion, tests, timeout_s=10)
    completion: model output; the code is the last ```python block (an unclosed last block counts), or the
                whole text if there is none (extract_code, shared with the Triton reward)
    tests: either stdin/stdout cases  {"inputs": [str], "outputs": [str]}  or  [{"input": str, "output": str}]
           (the program reads stdin; its stdout must equal the expected output token for token),
           or assert snippets  [str]  run after the code in the same module (pass = they finish)
    score: share of tests passed, in [0, 1]; timeout_s is per test
    info: {"reason": "ok" | "no_code" | "syntax_error" | "no_tests" | the first failing test's reason,
           "passed": int, "total": int, "per_test": [reason], "time_s": float}
    per-test reasons: ok, wrong_answer, runtime_error (exited non-zero), early_exit (assert tests: the code
    ended the process before the tests finished, e.g. sys.exit(0)), timeout, crash (killed by a signal),
    output_too_large, sandbox_error.

An assert test passes only if the runner prints a per-call random token after the tests ran; the token is read
from a file and deleted before the code runs, so exiting early (sys.exit(0), os._exit(0)) scores 0.
"""
import re
import secrets
import time

from rewards.sandbox import run_python

_CODE_BLOCK = re.compile(r"```python[^\n]*\n(.*?)(?:```|\Z)", re.S)
_STDIO_RUNNER = "exec(compile(open('solution.py').read(), 'solution.py', 'exec'), {'__name__': '__main__'})\n"
_ASSERT_RUNNER = """import os
with open('token') as f:
    token = f.read()
os.remove('token')
ns = {'__name__': '__main__'}
exec(compile(open('solution.py').read(), 'solution.py', 'exec'), ns)
exec(compile(open('test.py').read(), 'test.py', 'exec'), ns)
print(token)
"""


def extract_code(completion: str) -> str:
    """The last ```python block of the completion (stripped), or the whole stripped text if it has none."""
    blocks = _CODE_BLOCK.findall(completion)
    return (blocks[-1] if blocks else completion).strip()


def _cases(tests) -> list:
    """[(stdin or None, expected stdout or assert source)] from either test format."""
    if isinstance(tests, dict):
        return list(zip(tests["inputs"], tests["outputs"], strict=True))
    return [(t["input"], t["output"]) if isinstance(t, dict) else (None, t) for t in tests]


def _run_case(code: str, stdin, expected: str, timeout_s: float) -> str:
    """Reason for one test case: ok or why not."""
    if stdin is None:
        token = secrets.token_hex(16)
        res = run_python(_ASSERT_RUNNER, {"solution.py": code, "test.py": expected, "token": token},
                         timeout_s=timeout_s, mem_mb=1024, nproc=16)
        passed = res.status == "ok" and res.stdout.rstrip().endswith(token)
        failure = "early_exit" if res.status == "ok" else None
    else:
        res = run_python(_STDIO_RUNNER, {"solution.py": code}, stdin=stdin, timeout_s=timeout_s, mem_mb=1024,
                         nproc=16)
        passed = res.status == "ok" and res.stdout.split() == expected.split()
        failure = "wrong_answer" if res.status == "ok" else None
    if passed:
        return "ok"
    return failure or {"exit_nonzero": "runtime_error", "signal": "crash"}.get(res.status, res.status)


def code_reward(completion: str, tests, timeout_s: float = 10.0) -> tuple:
    """(share of tests passed, info); never raises on model output."""
    t0 = time.monotonic()
    code = extract_code(completion if isinstance(completion, str) else "")
    cases = _cases(tests)
    info = {"passed": 0, "total": len(cases), "per_test": []}
    if not code:
        info["reason"] = "no_code"
    elif not cases:
        info["reason"] = "no_tests"
    else:
        try:
            compile(code, "solution.py", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:    # ValueError: NUL bytes
            info.update(reason="syntax_error", detail=f"{type(e).__name__}: {e}")
        else:
            info["per_test"] = [_run_case(code, stdin, expected, timeout_s) for stdin, expected in cases]
            info["passed"] = info["per_test"].count("ok")
            info["reason"] = next((r for r in info["per_test"] if r != "ok"), "ok")
    info["time_s"] = time.monotonic() - t0
    return (info["passed"] / len(cases) if cases else 0.0), info

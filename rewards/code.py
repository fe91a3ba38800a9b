"""Code reward with test cases (PRIME-style coding tasks); untrusted code runs only in sandboxes
(rewards/sandbox.py), and the verdict comes from a process the candidate's code never runs in.

    score, info = code_reward(completion, tests, timeout_s=10)
    completion: model output; the code is the last ```python block (an unclosed last block counts), or the
                whole text if there is none (extract_code, shared with the Triton reward)
    tests: either stdin/stdout cases  {"inputs": [str], "outputs": [str]}  or  [{"input": str, "output": str}]
           (the program reads stdin; its stdout must equal the expected output token for token),
           or assert snippets  [str]  (Python run against the candidate's top-level names; pass = they finish)
    score: share of tests passed, in [0, 1]; timeout_s is per test
    info: {"reason": "ok" | "no_code" | "syntax_error" | "no_tests" | "no_sandbox" | "reward_error" |
           the first failing test's reason, "passed": int, "total": int, "per_test": [reason], "time_s": float}
    per-test reasons: ok, wrong_answer (stdout differs, or an assert failed), runtime_error (the code raised, or
    the test raised because of what it got), early_exit (the candidate's process ended before the tests had
    their answers, e.g. sys.exit(0)), timeout, crash (killed by a signal), output_too_large, oom, sandbox_error.

stdin/stdout: the program runs in one sandbox; this process compares its stdout with the expected output,
which never enters the sandbox.

Assert tests: two sandboxes per test, joined by two pipes. The candidate's process (_SERVE) runs the code, then only
answers requests: look up a top-level name, read an attribute, call, iterate. The tester's process (_TEST) runs the
test source (which exists only there); a free name of the test that is a standard-library module (an MBPP test's
`math.isclose` without its own `import math`) or a common third-party one under its usual name (`np`, `pd`: MODULES)
is imported there, never taken from the candidate, and every other free name that is not a builtin is bound to a
proxy of the candidate's object of that name: the candidate's definitions are visible under the names the test asks
for and nowhere else. Each call sends the arguments as JSON of plain values and gets back the result the same way
(or a handle to an object that is not plain data, which equals only itself), and list / dict / set arguments are
updated in place with their state after the call. The tester decides the verdict and writes it; the candidate can
neither read the test (the expected values stay in the tester), nor reach the tester's memory, builtins, exec or
exit code: it can only answer calls. An exception the candidate raises fails that test, unless the test expects
it: a call that is a whole statement (or an assignment's value) of a `try` body raises into the test as the builtin exception
class the candidate's derives from (StopIteration and StopAsyncIteration never), so `try: f(-1)` / `except
ValueError:` passes an honest raise; anywhere else (inside an assert, map(f, xs), an iterator protocol) the test
stops with runtime_error. The tester's own failures while it waits (the candidate's process gone, the deadline, a
reply too large or malformed) stop the test too: `Stop`, a BaseException, with the verdict set before unwinding,
so no `except` of the test's, bare or not, turns them into a pass. A candidate that defines a
builtin name the test uses fails that test (the test would otherwise call whichever one it liked); one whose entry
point is named like a standard-library module the test uses fails too (the test gets the module). As in plain
Python, a test's list argument holds what the call left in it: `assert f(xs) == sorted(xs)` sorts what f left in xs
(a test that needs the original must copy it first).
"""
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

from rewards.sandbox import inner_limit, refusal, run_python

_CODE_BLOCK = re.compile(r"```python[^\n]*\n(.*?)(?:```|\Z)", re.S)
_STDIO_RUNNER = ("exec(compile(open('solution.py', encoding='utf-8').read(), 'solution.py', 'exec'), "
                 "{'__name__': '__main__'})\n")
_MAX_MESSAGE = 1 << 24          # bytes of one JSON message between the two processes
_MARGIN_S = 1.0                 # the candidate's process may outlive the tester's deadline by this much
_LIMITS = {"mem_mb": 1024, "nproc": 16}

# Shared by both processes: one JSON message per line, plain values tagged by type (exact types only:
# a subclass of int or list is not plain data, it becomes a handle).
_WIRE = r'''
import json, os, select, time
MAX = %d
PLAIN = (bool, int, float, str, type(None))


def enc(v, handle, depth=0):
    t = type(v)
    if depth > 100:
        raise ValueError("nested too deep")
    if t in PLAIN:
        return {"v": v}
    tags = {list: "l", tuple: "t", set: "s", frozenset: "f"}
    if t in tags:
        return {tags[t]: [enc(x, handle, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[enc(k, handle, depth + 1), enc(x, handle, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"b": v.hex()}
    if getattr(t, "__module__", None) == "numpy" and hasattr(v, "tolist"):
        return enc(v.tolist(), handle, depth + 1)      # numpy scalars and arrays as the plain values they hold
    return {"h": handle(v)}


def dec(m, remote, depth=0):
    if type(m) is not dict or len(m) != 1 or depth > 100:
        raise ValueError("malformed value")
    (tag, x), = m.items()
    if tag == "v" and type(x) in PLAIN:
        return x
    if tag == "h" and type(x) is int:
        return remote(x)
    if tag == "b" and type(x) is str:
        return bytes.fromhex(x)
    if type(x) is not list:
        raise ValueError("malformed value")
    if tag == "d":
        if not all(type(p) is list and len(p) == 2 for p in x):
            raise ValueError("malformed dict")
        return {dec(k, remote, depth + 1): dec(v, remote, depth + 1) for k, v in x}
    kinds = {"l": list, "t": tuple, "s": set, "f": frozenset}
    if tag not in kinds:
        raise ValueError("malformed value")
    return kinds[tag](dec(v, remote, depth + 1) for v in x)


class Channel:
    """Line-delimited JSON over a pair of pipe fds; recv(deadline) raises TimeoutError or EOFError."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buf = rfd, wfd, b""

    def send(self, msg):
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data):]

    def recv(self, deadline=None):
        while b"\n" not in self.buf:
            if len(self.buf) > MAX:
                raise ValueError("message too large")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)
''' % _MAX_MESSAGE

# The candidate's process: runs the code, then answers requests until EOF. Nothing here is trusted.
_SERVE = _WIRE + r'''
import sys
chan = Channel(int(os.environ["RL_REQ_FD"]), int(os.environ["RL_RESP_FD"]))
objects = []


def handle(obj):
    objects.append(obj)
    return len(objects) - 1


def remote(h):
    return objects[h]


ns = {"__name__": "__main__"}
try:
    exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), ns)
    chan.send({"ready": True})
except BaseException as e:
    chan.send({"raise": type(e).__name__})
    raise SystemExit(1)
while True:
    try:
        req = chan.recv()
    except EOFError:
        break
    try:
        op = req["op"]
        if op == "get":
            found = req["name"] in ns and not req["name"].startswith("__")
            chan.send({"ok": enc(ns[req["name"]], handle)} if found else {"missing": True})
            continue
        obj = objects[req["h"]]
        if op == "attr":
            out = getattr(obj, req["name"])
        elif op == "iter":
            out = iter(obj)
        elif op == "next":
            out = next(obj, StopIteration)
            if out is StopIteration:
                chan.send({"stop": True})
                continue
        else:
            args = [dec(a, remote) for a in req["args"]]
            kwargs = {k: dec(v, remote) for k, v in req["kwargs"].items()}
            out = obj(*args, **kwargs)
            chan.send({"ok": enc(out, handle), "after": [enc(a, handle) for a in args],
                       "kw_after": {k: enc(v, handle) for k, v in kwargs.items()}})
            continue
        chan.send({"ok": enc(out, handle)})
    except BaseException as e:       # the nearest builtin class: a test's `except ValueError` expects a subclass too
        chan.send({"raise": next(c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins")})
'''

# The tester's process: trusted code and the test source; writes verdict.json. The candidate can only answer.
_TEST = _WIRE + r'''
import ast, builtins, importlib, sys
STDLIB = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))
# third-party modules a test may use under their usual names without importing them: always the real module
# (or unbound when not installed: the test fails), never an object of the candidate's
MODULES = {"np": "numpy", "numpy": "numpy", "pd": "pandas", "pandas": "pandas", "scipy": "scipy", "sp": "scipy",
           "plt": "matplotlib.pyplot", "matplotlib": "matplotlib", "nx": "networkx", "networkx": "networkx",
           "sympy": "sympy", "torch": "torch"}
DEADLINE = time.monotonic() + float(os.environ["RL_TEST_S"])
chan = Channel(int(os.environ["RL_RESP_FD"]), int(os.environ["RL_REQ_FD"]))


class Stop(BaseException):
    """The tester's own failure while it waits on the candidate (its process gone, the deadline, a reply too large
    or malformed), or an exception the candidate raised where the test does not expect one: the verdict is set
    (VERDICT, the first one wins) before unwinding, and no `except` of the test's, bare or not, changes it."""


VERDICT = []


def stop(reason):
    if not VERDICT:
        VERDICT.append(reason)
    raise Stop(reason)


# an exception of the candidate's that a test may expect (`try: f(-1)` / `except ValueError:`): builtin Exception
# classes, but the iteration protocol's own (StopIteration would end all(map(f, xs)) early)
EXPECTABLE = {n: c for n, c in vars(builtins).items() if isinstance(c, type) and issubclass(c, Exception) and
              not issubclass(c, (StopIteration, StopAsyncIteration))}


def ask(msg, expect=False):
    """The candidate's reply to msg. Its exception: raised here as the builtin class it derives from where the test
    expects a raise (`expect`: a call that is a whole statement of a try body, _Expect), else a Stop."""
    try:
        chan.send(msg)
        reply = chan.recv(DEADLINE)
    except TimeoutError:
        stop("timeout")
    except (EOFError, OSError):
        stop("early_exit")
    except (ValueError, RecursionError, MemoryError):        # too large, not JSON
        stop("runtime_error")
    if type(reply) is not dict:
        stop("runtime_error")
    if "raise" in reply:
        if expect and reply["raise"] in EXPECTABLE:
            raise EXPECTABLE[reply["raise"]]("raised by the candidate")
        stop("runtime_error")
    return reply


def parsed(fn):
    """fn() decodes a reply: a malformed one is the candidate's failure, never an exception the test sees."""
    try:
        return fn()
    except (ValueError, TypeError, KeyError, RecursionError, MemoryError):
        stop("runtime_error")


class _Expect(ast.NodeTransformer):
    """A call that is a whole statement (or an assignment's value) in a try body expects a raise: f(a, b) becomes
    _rl_expect_raise(f, a, b), so its arguments are evaluated as before and only that call may raise into the test."""

    def visit_Try(self, node):
        self.generic_visit(node)
        for stmt in node.body:
            if isinstance(stmt, (ast.Expr, ast.Assign)) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                expect = ast.Name("_rl_expect_raise", ast.Load())
                stmt.value = ast.copy_location(ast.Call(expect, [call.func, *call.args], call.keywords), call)
        return node

    visit_TryStar = visit_Try


def expect(fn, *args, **kwargs):
    return fn(*args, _expect=True, **kwargs) if type(fn) is Remote else fn(*args, **kwargs)


class Remote:
    """An object that lives in the candidate's process: equal only to itself."""
    __slots__ = ("_h",)

    def __init__(self, h):
        object.__setattr__(self, "_h", h)

    def __getattr__(self, name):
        reply = ask({"op": "attr", "h": self._h, "name": name})
        return parsed(lambda: dec(reply["ok"], Remote))

    def __call__(self, *args, _expect=False, **kwargs):
        reply = ask({"op": "call", "h": self._h, "args": [enc(a, remote_id) for a in args],
                     "kwargs": {k: enc(v, remote_id) for k, v in kwargs.items()}}, _expect)

        def result():
            after, kw_after = reply["after"], reply["kw_after"]
            if type(after) is not list or len(after) != len(args) or type(kw_after) is not dict:
                raise ValueError("malformed reply")
            for a, new in zip(args, after):
                mirror(a, new)
            for k, v in kwargs.items():
                mirror(v, kw_after.get(k))
            return dec(reply["ok"], Remote)
        return parsed(result)

    def __iter__(self):
        reply = ask({"op": "iter", "h": self._h})
        return parsed(lambda: dec(reply["ok"], Remote))

    def __next__(self):
        reply = ask({"op": "next", "h": self._h})
        if "stop" in reply:
            raise StopIteration
        return parsed(lambda: dec(reply["ok"], Remote))

    def __bool__(self):
        raise TypeError("an object of the candidate's has no truth value here")

    def __repr__(self):
        return f"<candidate object {self._h}>"


def remote_id(v):
    if type(v) is Remote:
        return v._h
    raise TypeError(f"{type(v).__name__} cannot be sent to the candidate")


def mirror(arg, new):
    """Apply the candidate's in-place changes of a list / dict / set argument to the test's own object."""
    if type(arg) in (list, dict, set) and new is not None:
        value = dec(new, Remote)
        if type(value) is type(arg):
            arg.clear()
            arg.update(value) if type(arg) is not list else arg.extend(value)


def free_names(tree):
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound)


def verdict():
    source = open("test.py", encoding="utf-8").read()
    tree = ast.parse(source)
    try:
        hello = chan.recv(DEADLINE)
    except EOFError:
        return "early_exit"
    if hello != {"ready": True}:     # the code raised at import: SystemExit is leaving early, not passing
        return "runtime_error" if type(hello) is dict and hello.get("raise") != "SystemExit" else "early_exit"
    ns = {"__name__": "__main__"}
    for name in free_names(tree):
        if name in STDLIB:      # math, re, itertools, ...: the tester imports them, the candidate's are never asked
            ns[name] = importlib.import_module(name)
            continue
        if name in MODULES:     # np, pd, ...: the real module or nothing
            try:
                ns[name] = importlib.import_module(MODULES[name])
            except ImportError:
                pass
            continue
        reply = ask({"op": "get", "name": name})
        if "missing" in reply:
            continue
        if hasattr(builtins, name):
            return "shadowed_builtin"
        ns[name] = parsed(lambda: dec(reply["ok"], Remote))
    ns["_rl_expect_raise"] = expect
    exec(compile(ast.fix_missing_locations(_Expect().visit(tree)), "test.py", "exec"), ns)
    return "ok"


try:
    result = verdict()
except AssertionError:
    result = "wrong_answer"
except Stop:
    result = "runtime_error"
except TimeoutError:         # waiting for the candidate's module to load
    result = "timeout"
except Exception:
    result = "runtime_error"
result = VERDICT[0] if VERDICT else result       # set before unwinding: what the test did after it changes nothing
with open("verdict.json", "w") as f:
    json.dump(result, f)
'''
_VERDICTS = frozenset({"ok", "wrong_answer", "runtime_error", "early_exit", "timeout", "shadowed_builtin"})


def extract_code(completion: str) -> str:
    """The last ```python block of the completion (stripped), or the whole stripped text if it has none."""
    blocks = _CODE_BLOCK.findall(completion)
    return (blocks[-1] if blocks else completion).strip()


def _cases(tests) -> list:
    """[(stdin or None, expected stdout or assert source)] from either test format."""
    if isinstance(tests, dict):
        return list(zip(tests["inputs"], tests["outputs"], strict=True))
    return [(t["input"], t["output"]) if isinstance(t, dict) else (None, t) for t in tests]


def _status_reason(res) -> str:
    return {"exit_nonzero": "runtime_error", "signal": "crash"}.get(res.status, res.status)


def _run_stdio(code: str, stdin: str, expected: str, timeout_s: float) -> str:
    res = run_python(_STDIO_RUNNER, {"solution.py": code}, stdin=stdin, timeout_s=timeout_s, **_LIMITS)
    if res.status == "ok":
        return "ok" if res.stdout.split() == expected.split() else "wrong_answer"
    return _status_reason(res)


def _run_asserts(code: str, test: str, timeout_s: float) -> str:
    """One assert test: the candidate's process and the tester's, joined by two pipes (see module doc)."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    limit = inner_limit(timeout_s + _MARGIN_S)            # both sandboxes' wall limit, under the pool job's
    timeout_s = max(0.0, min(timeout_s, limit - _MARGIN_S))   # the tester's own deadline, under that
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(run_python, _SERVE, {"solution.py": code}, timeout_s=limit, pass_fds=(req_r, resp_w),
                             env={"RL_REQ_FD": str(req_r), "RL_RESP_FD": str(resp_w)}, **_LIMITS)
        tester = run_python(_TEST, {"test.py": test}, timeout_s=limit, read_back=("verdict.json",),
                            pass_fds=(req_w, resp_r), env={"RL_REQ_FD": str(req_w), "RL_RESP_FD": str(resp_r),
                                                           "RL_TEST_S": repr(float(timeout_s))}, **_LIMITS)
        candidate = served.result()
    if tester.status != "ok":
        return _status_reason(tester)
    try:
        verdict = json.loads(tester.files.get("verdict.json", b"null"))
    except ValueError:
        verdict = None
    if verdict not in _VERDICTS:
        return "crash"
    if verdict == "early_exit" and candidate.status in ("oom", "signal", "timeout"):
        return _status_reason(candidate)       # it did not leave, it was stopped
    return verdict


def code_reward(completion: str, tests, timeout_s: float = 10.0) -> tuple:
    """(share of tests passed, info); never raises: a failure of the reward itself scores 0 (reward_error)."""
    t0 = time.monotonic()
    info = {"passed": 0, "total": 0, "per_test": []}
    try:
        code = extract_code(completion if isinstance(completion, str) else "")
        cases = _cases(tests)
        info["total"] = len(cases)
        problem, syntax = refusal(), _syntax_problem(code)
        if not code:
            info["reason"] = "no_code"
        elif not cases:
            info["reason"] = "no_tests"
        elif syntax:
            info.update(reason="syntax_error", detail=syntax)
        elif problem:
            info.update(reason="no_sandbox", detail=problem)
        else:
            info["per_test"] = [_run_asserts(code, expected, timeout_s) if stdin is None else
                                _run_stdio(code, stdin, expected, timeout_s) for stdin, expected in cases]
            info["passed"] = info["per_test"].count("ok")
            info["reason"] = next((r for r in info["per_test"] if r != "ok"), "ok")
    except Exception as e:      # a bug here (or malformed tests) must cost one sample, not the batch
        info.update(reason="reward_error", detail=type(e).__name__, passed=0)
    info["time_s"] = time.monotonic() - t0
    return (info["passed"] / info["total"] if info["total"] else 0.0), info


def _syntax_problem(code: str) -> str | None:
    """Why code does not compile as the utf-8 text the sandbox will run, else None."""
    try:
        code.encode("utf-8")
        compile(code, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeEncodeError) as e:
        return f"{type(e).__name__}: {str(e)[:500]}"          # ValueError: NUL bytes
    return None

"""The task table: for each row `task`, the keys a row must have, its scorer, its row check and its environment.
Read by data/ (row checks), rewards/ (the pool scores by it) and rollout/ (which rows are multi-turn episodes); it
sits below them all and imports none of them at load time. Adding a task is one scoring function plus one line in
TASKS; adding an environment is one class (rollout/environments.py) plus one line here.

    task = TASKS[row["task"]]                  # Task(keys, score, check, env)
    problem = task.check(row)                  # None, or what is wrong with the data row (data/rows.py says it)
    reward, info = task.score(row, completion) # (float, {"reason": str, ...}); never raises on model output
    task.env                                   # None (single turn) or an environment's name: episodes with tools

Adding a task: a scorer and a check below, one line in TASKS, and a row with `"task": "<name>"` (docs/data.md). Each
scorer imports its reward module when first called: math-verify (sympy) and the sandboxed rewards load only in the
processes that score those tasks.
"""
import ast
import importlib
from typing import Callable, NamedTuple


def score_math(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.math import math_reward
    return math_reward(completion, row["answer"])


def score_code(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.code import code_reward
    return code_reward(completion, row["tests"])


def score_triton(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.triton.kernel import triton_reward
    return triton_reward(completion, row)


def score_char_share(row: dict, completion: str) -> tuple[float, dict]:
    """A toy task any model earns something on, random ones included: the share of the completion's characters
    that are in row["chars"] (the tests use it to see learning in a few steps; docs/data.md's worked example)."""
    if not completion:
        return 0.0, {"reason": "empty"}
    chars = set(str(row["chars"]))
    return sum(c in chars for c in completion) / len(completion), {"reason": "ok"}


def check_math(row: dict) -> str | None:
    a = row["answer"]
    ok = (isinstance(a, str) and a.strip()) or (isinstance(a, (int, float)) and not isinstance(a, bool) and a == a)
    return None if ok else "'answer' must be a non-empty string or a number"


def check_code(row: dict) -> str | None:
    t = row["tests"]
    io = isinstance(t, dict) and isinstance(t.get("inputs"), list) and isinstance(t.get("outputs"), list) \
        and len(t["inputs"]) == len(t["outputs"]) and all(isinstance(x, str) for x in t["inputs"] + t["outputs"])
    cases = isinstance(t, list) and all(isinstance(x, str) or (isinstance(x, dict) and isinstance(x.get("input"), str)
                                        and isinstance(x.get("output"), str)) for x in t)
    if not (io or cases) or not (t["inputs"] if io else t):
        return "'tests' must be {inputs: [str], outputs: [str]} or a non-empty list of {input, output} or assert strings"
    return None


def check_triton(row: dict) -> str | None:
    code = row["reference_code"]
    if not isinstance(code, str):
        return "'reference_code' must be a string"
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"'reference_code' does not parse (its line {e.lineno}: {e.msg})"
    missing = {"Model", "get_inputs", "get_init_inputs"} - {n.name for n in tree.body if hasattr(n, "name")}
    return f"'reference_code' does not define {sorted(missing)}" if missing else None


def check_char_share(row: dict) -> str | None:
    return None if isinstance(row["chars"], str) and row["chars"] else "'chars' must be a non-empty string"


class Task(NamedTuple):
    keys: tuple  # keys a row of the task must have
    score: Callable  # (row, completion) -> (reward, info)
    check: Callable  # row -> None or what is wrong with it
    env: str | None = None  # rollout/environments.py's ENVIRONMENTS name: the rows are episodes with tools
    module: str | None = None  # the reward module its scorer imports (a pool worker imports it before the job's clock)


MATH, CODE, TRITON = "rewards.math", "rewards.code", "rewards.triton.kernel"
TASKS = {
    "math": Task(("answer",), score_math, check_math, module=MATH),
    "code": Task(("tests",), score_code, check_code, module=CODE),
    "triton": Task(("reference_code",), score_triton, check_triton, module=TRITON),
    "char_share": Task(("chars",), score_char_share, check_char_share),
    "math_calculator": Task(("answer",), score_math, check_math, env="calculator", module=MATH),
    "math_python": Task(("answer",), score_math, check_math, env="python", module=MATH),
    "triton_refine": Task(("reference_code",), score_triton, check_triton, env="triton_refine", module=TRITON),
}
UNTRUSTED_TASKS = ("code", "triton", "math_python", "triton_refine")  # they run model-written code: in the sandbox
# reasons that say the reward did not look at the sample (the scorer or the row failed, the sandbox or the Triton
# reward's reference or harness could not run): reward failures, counted and never taken for a score of 0
NOT_SCORED = frozenset({"error", "reward_error", "bad_answer", "no_sandbox", "sandbox_error", "reference_error",
                        "harness_error"})


def env_of(row: dict) -> str | None:
    """The row's environment (None: a single-turn row)."""
    task = TASKS.get(row.get("task", "math"))
    return task.env if task else None


def prepare_row(row: dict, completion: str, ctx=None) -> None:
    """Import the row's reward module (math-verify and sympy: seconds on a busy machine) and run its `prepare(row)`
    where it has one (the Triton reward's reference): a pool worker calls this before the job's wall limit starts
    (rewards/pool.py), so neither is counted as scoring time."""
    task = TASKS.get(row.get("task", "math"))
    if task is not None and task.module:
        prepare_module(task.module, row)


def prepare_module(name: str, row: dict) -> None:
    """Import a reward module and run its `prepare(row)` where it has one (what a row's scoring needs computed
    before the job's clock: the Triton reward's reference)."""
    module = importlib.import_module(name)
    if hasattr(module, "prepare"):
        module.prepare(row)


def preflight(pool, rows: list[dict]) -> str | None:
    """Why the rows' rewards cannot score on this rank, or None: where a row is a Triton task, the Triton reward's
    preflight (a shipped solution through `pool`, the rank's reward pool, or through score_row here when the pool
    sums the user's functions)."""
    if not any(TASKS.get(r.get("task", "math"), TASKS["math"]).module == TRITON for r in rows):
        return None
    from rewards.triton.kernel import preflight as triton_preflight
    return triton_preflight(pool.score if pool.fn is score_row else lambda jobs: [score_row(*j) for j in jobs])


def score_row(row: dict, completion: str, ctx=None) -> tuple[float, dict]:
    """Reward of one completion for one data row, by row["task"] (ctx, the job's context, is for rewards/user.py)."""
    task = row.get("task", "math")
    if task not in TASKS:
        return 0.0, {"reason": "unknown_task", "task": str(task)}
    return TASKS[task].score(row, completion)

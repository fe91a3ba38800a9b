"""The reward of each row `task`: one table, read by the data loader (which keys a row must have) and by the
reward pool (which function scores it). Adding a task is one scoring function plus one line in TASKS.

    keys, score = TASKS[row["task"]]
    reward, info = score(row, completion)      # (float, {"reason": str, ...}); never raises on model output

Each scorer imports its reward module when first called: math-verify (sympy) and the sandboxed rewards load only
in the processes that score those tasks.
"""


def score_math(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.math import math_reward
    return math_reward(completion, row["answer"])


def score_code(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.code import code_reward
    return code_reward(completion, row["tests"])


def score_triton(row: dict, completion: str) -> tuple[float, dict]:
    from rewards.triton_kernel import triton_reward
    return triton_reward(completion, row)


def score_char_share(row: dict, completion: str) -> tuple[float, dict]:
    """A toy task any model earns something on, random ones included: the share of the completion's characters
    that are in row["chars"] (the tests use it to see learning in a few steps; the README's worked example)."""
    if not completion:
        return 0.0, {"reason": "empty"}
    chars = set(str(row["chars"]))
    return sum(c in chars for c in completion) / len(completion), {"reason": "ok"}


TASKS = {  # task -> (keys a row of that task must have, scorer)
    "math": (("answer",), score_math),
    "code": (("tests",), score_code),
    "triton": (("reference_code",), score_triton),
    "char_share": (("chars",), score_char_share),
}


def score_row(row: dict, completion: str) -> tuple[float, dict]:
    """Reward of one completion for one data row, by row["task"]."""
    task = row.get("task", "math")
    if task not in TASKS:
        return 0.0, {"reason": "unknown_task", "task": str(task)}
    return TASKS[task][1](row, completion)

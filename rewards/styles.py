"""The three shapes a reward function of reward.funcs may have, told apart by its `def` read with ast (the file is
not run), and one call of it on one sample. Standard library only: the reward sandbox runs this file beside the
user's (rewards/user.py).

    ours  fn(row, completion) or fn(row, completion, messages) -> float | (float, info dict) | None
    trl   fn(prompts, completions, **kwargs) -> [float | None]          TRL's GRPOTrainer reward_funcs
    verl  fn(data_source, solution_str, ground_truth, extra_info=None) -> float | {"score": float, ...}   verl's
          custom_reward_function (compute_score)

Detection from the parameter names: `solution_str` -> verl; `completions` or a `**kwargs` -> trl; otherwise two or
three positional parameters -> ours. A TRL function is called with a batch of one sample: prompts=[prompt] (a string,
or the chat messages), completions=[completion] (a string, or [{"role": "assistant", "content"}] and the episode's
later turns for a chat prompt), completion_ids=[token ids], trainer_state (global_step, max_steps) and the row's
other columns as one-element lists; a verl function gets the row's data_source, reward_model.ground_truth (or
answer) and extra_info. None means "does not apply to this sample" (TRL's rule): the sample's reward is the weighted
sum over the functions that apply.
"""
import ast
import inspect
import math
import numbers
import os
import traceback
import types
from pathlib import Path

NOT_COLUMNS = ("prompt", "prompt_ids", "completion", "completion_ids", "prompts", "completions", "trainer_state")


class Failure(Exception):
    """A function failed on one sample: reason "raised" | "bad_return" | "import", and a message that starts with
    the file and line (`mine.py:12 (f): ZeroDivisionError: division by zero`)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def signature(path: str, name: str) -> tuple[str, int]:
    """-> (style, line of the def) of the top-level `def name` in the file at `path`, read with ast, not run.
    SyntaxError as ast raises it; ValueError saying what is wrong with the def."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not defs:
        raise ValueError(f"{Path(path).name} has no top-level def {name!r} (the file is read, not run, at start; "
                         f"only the reward workers import it)")
    a = defs[-1].args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if "solution_str" in names:
        return "verl", defs[-1].lineno
    if "completions" in names or a.kwarg:
        return "trl", defs[-1].lineno
    if len(a.posonlyargs + a.args) in (2, 3) and not a.vararg and not a.kwonlyargs:
        return "ours", defs[-1].lineno
    raise ValueError(f"{Path(path).name}:{defs[-1].lineno}: {name}({', '.join(names)}) is none of the reward "
                     f"shapes: (row, completion[, messages]), TRL's (prompts, completions, **kwargs) or verl's "
                     f"(data_source, solution_str, ground_truth, extra_info)")


def _accepted(fn, kwargs: dict) -> dict:
    """kwargs cut to the parameters fn names, unless it takes **kwargs."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _ours(fn, row: dict, completion: str, ctx: dict):
    n = len(inspect.signature(fn).parameters)
    return fn(row, completion, ctx.get("messages")) if n == 3 else fn(row, completion)


def _trl(fn, row: dict, completion: str, ctx: dict):
    prompt, messages = row["prompt"], ctx.get("messages")
    if isinstance(prompt, str):
        shown = completion
    else:  # conversational: the assistant's message, or the episode's turns after the prompt
        shown = messages[len(prompt):] if messages else [{"role": "assistant", "content": completion}]
    columns = {k: [v] for k, v in row.items() if k not in NOT_COLUMNS and not k.startswith("_")}
    state = types.SimpleNamespace(global_step=ctx.get("step"), max_steps=ctx.get("steps"))
    return fn(**_accepted(fn, {"prompts": [prompt], "completions": [shown],
                               "completion_ids": [ctx.get("completion_ids")], "trainer_state": state, **columns}))


def _verl(fn, row: dict, completion: str, ctx: dict):
    rm = row.get("reward_model")
    truth = rm["ground_truth"] if isinstance(rm, dict) and "ground_truth" in rm else row.get("answer")
    return fn(**_accepted(fn, {"data_source": row.get("data_source"), "solution_str": completion,
                               "ground_truth": truth, "extra_info": row.get("extra_info")}))


CALLS = {"ours": _ours, "trl": _trl, "verl": _verl}


def _where(e: BaseException, path: str) -> str:
    """`file:line` of the deepest frame of e's traceback in the file at `path` (else the deepest frame at all)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)] or frames[-1:]
    return f"{Path(mine[-1].filename).name}:{mine[-1].lineno}" if mine else Path(path).name


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def checked(out, style: str) -> tuple[float | None, dict]:
    """A function's return in its style -> (score or None, info); ValueError naming what came back otherwise."""
    if style == "trl":
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise ValueError(f"returned {out!r:.80}: expected a list of one float or None (one per completion)")
        out = out[0]
    info = {}
    if style == "ours" and isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        out, info = out
    if style == "verl" and isinstance(out, dict) and "score" in out:
        out, info = out["score"], {k: v for k, v in out.items() if k != "score"}
    if out is not None and not _number(out):
        raise ValueError(f"returned {out!r:.80}: expected a finite number"
                         + {"ours": ", (number, info dict)", "verl": ", {'score': number, ...}"}.get(style, "")
                         + " or None")
    return (None if out is None else float(out)), info


def call(fn, style: str, row: dict, completion: str, ctx: dict, path: str, name: str, line: int):
    """fn (the def `name` at `path`:`line`) on one sample in its style -> (score or None, info); Failure when it
    raises ("raised", the deepest line of `path` in the traceback) or returns something else ("bad_return")."""
    shown = f"{Path(path).name}:{line} ({name})"
    try:
        out = CALLS[style](fn, row, completion, ctx)
    except Exception as e:  # the user's code: any exception fails this component of this sample
        raise Failure("raised", f"{_where(e, path)} ({name}): {type(e).__name__}: {e}"[:300]) from None
    try:
        return checked(out, style)
    except ValueError as e:
        raise Failure("bad_return", f"{shown}: {e}"[:300]) from None


def load(path: str, module: str):
    """The file at `path` imported as module `module`; Failure("import") naming the file's line when its top level
    raises."""
    import importlib.util
    try:
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:  # the user's module: anything
        raise Failure("import", f"{_where(e, path)} (import): {type(e).__name__}: {e}"[:300]) from None
    return mod

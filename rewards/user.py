"""Reward functions from the user's own file (TRL's reward_funcs / reward_weights, verl's custom_reward_function):

    reward:
      funcs: ["my_rewards.py:correct", "my_rewards.py:boxed"]   # file.py:function, or "task" (the row's own scorer)
      weights: [1.0, 0.2]                                        # one per function; default 1 each

A function's contract (docs/data.md): fn(row, completion) or fn(row, completion, messages) -> float or
(float, info dict). row: the data row as read (its keys, "task", "data_source"); completion: what the model wrote
(observations left out); messages: None for a single-turn row, the episode as chat messages where tools are on
([{"role": "user" | "assistant" | "tool", "content"}], the prompt first). The sample's reward is
sum_i weights[i] * fn_i(...), its info {"reason": "ok" (or the row's task scorer's reason when "task" is one of
the functions), "components": {name: score}}. A function that raises,
returns something else than a finite number (or (number, dict)), or whose file does not load, gives the sample 0 with
reason "reward_error" and an error naming the function: the run goes on (and stops, as for any scorer, only when
every sample of a step failed).

Runs in the reward pool (rewards/pool.py): each worker imports the files once, before a job's wall limit starts;
the whole sum is one job under reward_timeout_s. With reward.sandbox the functions run in the bubblewrap sandbox
(rewards/sandbox.py): the file and the sample go in, only the scores come out.
"""
import ast
import importlib.util
import inspect
import json
import math
import os
from pathlib import Path

from rewards.deadline import time_left
from rewards.pool import RewardPool
from rewards.sandbox import refusal, run_python
from tasks import prepare_row, score_row

TASK = "task"  # the name that stands for the row's own scorer in tasks.py
_LOADED: dict = {}  # (path, name) -> the function, in a worker


class SpecError(ValueError):
    """A reward.funcs entry that cannot be used: said at start, before any rank trains."""


def parse(funcs: list[str], weights: list[float], sandbox: bool = False) -> tuple:
    """The config's lists -> ((path, name, weight), ...), path absolute ("" for TASK); each file is loaded and each
    function checked here (in the launcher and on every rank) so a typo is a start-up error, not N reward errors.
    sandbox: the files are read, never run, outside the sandbox: each function must be a top-level def."""
    if weights and len(weights) != len(funcs):
        raise SpecError(f"reward.weights has {len(weights)} values for {len(funcs)} reward.funcs")
    if not all(math.isfinite(w) for w in weights):
        raise SpecError(f"reward.weights must be finite numbers, got {weights}")
    specs = []
    for spec, w in zip(funcs, weights or [1.0] * len(funcs)):
        if spec == TASK:
            specs.append(("", TASK, float(w)))
            continue
        path, _, name = spec.rpartition(":")
        if not path.endswith(".py") or not name.isidentifier():
            raise SpecError(f"reward.funcs entry {spec!r}: expected file.py:function or {TASK!r}")
        if not Path(path).is_file():
            raise SpecError(f"reward.funcs entry {spec!r}: no such file {path}")
        specs.append((str(Path(path).resolve()), name, float(w)))
        try:
            n_args = _arity_of_def(*specs[-1][:2]) if sandbox else len(inspect.signature(function(*specs[-1][:2])).parameters)
        except Exception as e:  # the user's module raised while importing: anything
            raise SpecError(f"reward.funcs entry {spec!r}: {type(e).__name__}: {e}"[:400]) from None
        if n_args not in (2, 3):
            raise SpecError(f"reward.funcs entry {spec!r}: takes {n_args} arguments; the contract is "
                            f"(row, completion) or (row, completion, messages)")
    return tuple(specs)


def _arity_of_def(path: str, name: str) -> int:
    """The number of parameters of the top-level `def name` in the file, read without running it."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise AttributeError(f"{Path(path).name} has no top-level def {name!r} (reward.sandbox reads it, not runs it)")
    a = defs[-1].args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)


def function(path: str, name: str):
    """The function `name` of the Python file `path` (imported once per process, as a module of its own)."""
    if (path, name) not in _LOADED:
        mod = _LOADED.get(path)
        if mod is None:
            spec = importlib.util.spec_from_file_location(f"user_reward_{abs(hash(path))}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _LOADED[path] = mod
        fn = getattr(mod, name, None)
        if not callable(fn):
            raise AttributeError(f"{Path(path).name} has no function {name!r}")
        _LOADED[(path, name)] = fn
    return _LOADED[(path, name)]


def names(specs: tuple) -> list[str]:
    """Each component's name in metrics (reward/<name>): the function's name, file stem first if two collide."""
    short = [n for _, n, _ in specs]
    return [n if short.count(n) == 1 else f"{Path(p).stem}.{n}" for (p, n, _), n in zip(specs, short)]


def _checked(out, who: str) -> tuple[float, dict]:
    """A function's return -> (score, info); ValueError if it is not a finite number or (number, dict)."""
    score, info = out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {})
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise ValueError(f"{who} returned {out!r:.100}: expected a finite number or (number, info dict)")
    return float(score), info


class UserReward:
    """The pool's job function when reward.funcs is set: (row, completion[, messages]) -> (weighted sum, info).
    Picklable (the specs only): spawned workers load the files themselves."""

    def __init__(self, specs: tuple, sandbox: bool = False):
        self.specs, self.sandbox, self.names = specs, sandbox, names(specs)

    def prepare(self, row: dict, completion: str, messages=None) -> None:
        """Before the job's clock (rewards/pool.py): import the user's files and the row's reward module."""
        if any(name == TASK for _, name, _ in self.specs):
            prepare_row(row, completion)
        if not self.sandbox:
            for path, name, _ in self.specs:
                if name != TASK:
                    function(path, name)

    def __call__(self, row: dict, completion: str, messages=None) -> tuple[float, dict]:
        parts, total = {}, 0.0
        user = [s for s in self.specs if s[1] != TASK]
        try:
            scores = _sandboxed(user, row, completion, messages) if self.sandbox and user else \
                [self._one(path, name, row, completion, messages) for path, name, _ in user]
        except (ValueError, RuntimeError) as e:
            return 0.0, {"reason": "reward_error", "error": str(e)[:300]}
        it, verdict = iter(scores), {"reason": "ok"}
        for (path, name, w), key in zip(self.specs, self.names):
            score, info = score_row(row, completion) if name == TASK else next(it)
            parts[key] = score
            total += w * score
            verdict = info if name == TASK else verdict  # the task scorer's reason (wrong, no_sandbox...) is kept
        return total, {**verdict, "components": parts}

    @staticmethod
    def _one(path: str, name: str, row: dict, completion: str, messages) -> tuple[float, dict]:
        who = f"{Path(path).name}:{name}"
        try:
            fn = function(path, name)
            out = fn(row, completion, messages) if len(inspect.signature(fn).parameters) == 3 else fn(row, completion)
        except Exception as e:  # the user's code: any exception is that sample's reward_error, never the run's end
            raise RuntimeError(f"{who}: {type(e).__name__}: {e}") from None
        return _checked(out, who)


_SANDBOX_MAIN = """
import importlib.util, inspect, json
job = json.load(open("job.json"))
out = []
for i, name in enumerate(job["names"]):
    try:
        spec = importlib.util.spec_from_file_location(f"user_reward_{i}", f"user_reward_{job['files'][i]}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = getattr(mod, name)
        r = fn(*(job["row"], job["completion"], job["messages"])[:len(inspect.signature(fn).parameters)])
        score, info = r if isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], dict) else (r, {})
        ok = isinstance(score, (int, float)) and not isinstance(score, bool)
        out.append([score if ok else repr(score), json.loads(json.dumps(info, default=str)), None])
    except Exception as e:
        out.append([None, {}, f"{type(e).__name__}: {e}"])
open("scores.json", "w").write(json.dumps(out))
"""


def _sandboxed(user: list, row: dict, completion: str, messages) -> list[tuple[float, dict]]:
    """Every user function of one sample in one sandbox run (rewards/sandbox.py): the files and the sample go in as
    read-only files, the scores come back in scores.json; a failure is a RuntimeError naming the function, or with the
    sandbox's verdict (timeout, oom...)."""
    problem = refusal()
    if problem:
        raise RuntimeError(f"reward.sandbox: {problem}")
    paths = sorted({p for p, _, _ in user})
    files = {f"user_reward_{i}.py": Path(p).read_text(encoding="utf-8") for i, p in enumerate(paths)}
    job = {"names": [n for _, n, _ in user], "files": [paths.index(p) for p, _, _ in user],
           "row": {k: v for k, v in row.items() if not k.startswith("_") and k != "prompt_ids"},
           "completion": completion, "messages": messages}
    files["job.json"] = json.dumps(job, default=str)
    res = run_python(_SANDBOX_MAIN, files, timeout_s=time_left() or 60.0, read_back=("scores.json",))
    if res.status != "ok" or "scores.json" not in res.files:
        last = (res.stderr.strip().splitlines() or [res.status])[-1]
        raise RuntimeError(f"sandboxed reward: {res.status}: {last}"[:300])
    out = []
    for (score, info, error), (path, name, _) in zip(json.loads(res.files["scores.json"]), user):
        if error:
            raise RuntimeError(f"{os.path.basename(path)}:{name}: {error}")
        out.append(_checked((score, info), f"{os.path.basename(path)}:{name}"))
    return out


def messages_of(row: dict, turns: list[dict]) -> list[dict]:
    """An episode (trainer.episode_turns: [{"role": "model" | "tool", "text"}]) as chat messages, the prompt first."""
    prompt = row["prompt"]
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    return head + [{"role": "assistant" if t["role"] == "model" else "tool", "content": t["text"]} for t in turns]


def reward_pool(cfg) -> RewardPool:
    """The run's reward pool: the rows' task scorers (tasks.py), or the weighted sum of reward.funcs."""
    if not cfg.reward.funcs:
        return RewardPool(cfg.reward_workers, cfg.reward_timeout_s)
    fn = UserReward(parse(cfg.reward.funcs, cfg.reward.weights, cfg.reward.sandbox), cfg.reward.sandbox)
    return RewardPool(cfg.reward_workers, cfg.reward_timeout_s, fn=fn, prepare=fn.prepare)


def component_metrics(pool: RewardPool, infos: list[dict], all_sum, device) -> dict:
    """reward/<name>: each function's mean (unweighted) score over the step's samples of every rank that it scored
    (a sample whose reward failed has none); {} without reward.funcs."""
    if not isinstance(getattr(pool, "fn", None), UserReward):
        return {}
    sums = [x for key in pool.fn.names for x in (sum(i["components"].get(key, 0.0) for i in infos if "components" in i),
                                                sum(key in i.get("components", ()) for i in infos))]
    sums = all_sum(sums, device)
    return {f"reward/{key}": sums[2 * j] / max(sums[2 * j + 1], 1.0) for j, key in enumerate(pool.fn.names)}

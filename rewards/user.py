"""Reward functions from the user's own files (TRL's reward_funcs / reward_weights, verl's custom_reward_function):

    reward:
      funcs: ["my_rewards.py:correct", "trl_rewards.py:format_reward"]   # file.py:function, or "task" (the row's scorer)
      weights: [1.0, 0.2]                                                 # one per function; default 1 each

Each function has our shape, TRL's or verl's (rewards/styles.py), told from its def: at start the files are read
with ast, never run (not in the launcher, not in the ranks); only the reward pool's workers import them. The
sample's reward is sum_i weights[i] * fn_i(...) over the functions that apply (None: does not apply, TRL's rule);
its info {"reason": "ok" (or the row's task scorer's reason when "task" is one of the functions), "components":
{name: score}}. A function that raises, returns something else, or whose file does not import fails that component
for that sample: it is left out of the sum as a None is, the info lists it in "failed" ({name: [reason, message]},
the message starting with the file and line), the reason is "reward_error" and "error" the first message; the
other components still count (docs/data.md says why). The run stops, as for any scorer, only when every sample of
a step failed.

Runs in the reward pool (rewards/pool.py): each worker imports the files once, before a job's wall limit starts;
the whole sum is one job under reward_timeout_s. With reward.sandbox the functions run in the bubblewrap sandbox
(rewards/sandbox.py): the files, rewards/styles.py and the sample go in, only the scores come out.
"""
import json
import math
from pathlib import Path

from config import ConfigError
from rewards.deadline import time_left
from rewards.pool import RewardPool
from rewards.sandbox import refusal, run_python
from rewards.styles import Failure, call, load, signature
from tasks import prepare_row, score_row

TASK = "task"  # the name that stands for the row's own scorer in tasks.py
_LOADED: dict = {}  # path -> the user's module, in a worker


class SpecError(ValueError):
    """A reward.funcs entry that cannot be used: said at start, before any rank trains."""


def parse(funcs: list[str], weights: list[float]) -> tuple:
    """The config's lists -> ((path, name, weight, style, line of the def), ...), path absolute ("" for TASK); each
    function's def is read here with ast (in the launcher and on every rank, never run) so a typo or a shape none of
    the three styles takes is a start-up error, not N reward errors."""
    if weights and len(weights) != len(funcs):
        raise SpecError(f"reward.weights has {len(weights)} values for {len(funcs)} reward.funcs")
    if not all(math.isfinite(w) for w in weights):
        raise SpecError(f"reward.weights must be finite numbers, got {weights}")
    specs = []
    for spec, w in zip(funcs, weights or [1.0] * len(funcs)):
        if spec == TASK:
            specs.append(("", TASK, float(w), TASK, 0))
            continue
        path, _, name = spec.rpartition(":")
        if not path.endswith(".py") or not name.isidentifier():
            raise SpecError(f"reward.funcs entry {spec!r}: expected file.py:function or {TASK!r}")
        if not Path(path).is_file():
            raise SpecError(f"reward.funcs entry {spec!r}: no such file {path}")
        try:
            style, line = signature(path, name)
        except SyntaxError as e:
            raise SpecError(f"reward.funcs entry {spec!r}: {Path(path).name}:{e.lineno}: {e.msg}") from None
        except (ValueError, OSError) as e:  # a def none of the styles takes; an unreadable file
            raise SpecError(f"reward.funcs entry {spec!r}: {e}"[:400]) from None
        specs.append((str(Path(path).resolve()), name, float(w), style, line))
    return tuple(specs)


def function(path: str, name: str):
    """The function `name` of the Python file `path` (the file imported once per process, as a module of its own);
    Failure("import") if its top level raises."""
    if path not in _LOADED:
        _LOADED[path] = load(path, f"user_reward_{abs(hash(path))}")
    return getattr(_LOADED[path], name)


def names(specs: tuple) -> list[str]:
    """Each component's name in metrics (reward/<name>): the function's name, file stem first if two collide."""
    short = [s[1] for s in specs]
    return [n if short.count(n) == 1 else f"{Path(s[0]).stem}.{n}" for s, n in zip(specs, short)]


class UserReward:
    """The pool's job function when reward.funcs is set: (row, completion, context) -> (weighted sum, info), where
    context = {"messages", "completion_ids", "step", "steps"} (rewards/styles.py hands each style its part).
    Picklable (the specs only): spawned workers load the files themselves."""

    def __init__(self, specs: tuple, sandbox: bool = False):
        self.specs, self.sandbox, self.names = specs, sandbox, names(specs)

    def prepare(self, row: dict, completion: str, ctx: dict | None = None) -> None:
        """Before the job's clock (rewards/pool.py): import the user's files and the row's reward module. A file
        that does not import is left to the job, which reports it as each sample's failed component."""
        if any(s[1] == TASK for s in self.specs):
            prepare_row(row, completion)
        for path, name, *_ in self.specs if not self.sandbox else ():
            if name != TASK:
                try:
                    function(path, name)
                except Failure:
                    pass

    def __call__(self, row: dict, completion: str, ctx: dict | None = None) -> tuple[float, dict]:
        ctx = ctx or {}
        user = [s for s in self.specs if s[1] != TASK]
        try:
            results = _sandboxed(user, row, completion, ctx) if self.sandbox and user else \
                [_one(s, row, completion, ctx) for s in user]
        except RuntimeError as e:  # the sandbox itself failed, not a function
            return 0.0, {"reason": "reward_error", "error": str(e)[:300]}
        it, total, parts, failed, verdict = iter(results), 0.0, {}, {}, {"reason": "ok"}
        for (_, name, w, *_), key in zip(self.specs, self.names):
            score, info, failure = (*score_row(row, completion), None) if name == TASK else next(it)
            if failure:
                failed[key] = failure
            elif score is not None:
                parts[key] = score
                total += w * score
            verdict = info if name == TASK else verdict  # the task scorer's reason (wrong, no_sandbox...) is kept
        out = {**verdict, "components": parts}
        if failed:
            out.update(reason="reward_error", failed=failed, error=next(iter(failed.values()))[1])
        return total, out


def _one(spec: tuple, row: dict, completion: str, ctx: dict) -> tuple:
    """One user function on one sample in this process -> (score or None, info, None) or (None, {}, [reason,
    message]) when it failed."""
    path, name, _, style, line = spec
    try:
        return (*call(function(path, name), style, row, completion, ctx, path, name, line), None)
    except Failure as f:
        return None, {}, [f.reason, str(f)]


_SANDBOX_MAIN = """
import importlib.util, json
spec = importlib.util.spec_from_file_location("reward_styles", "reward_styles.py")
styles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(styles)
job, mods, out = json.load(open("job.json")), {}, []
for (name, style, line, k), shown in zip(job["funcs"], job["shown"]):
    path = f"user_reward_{k}.py"
    try:
        mods[path] = mods.get(path) or styles.load(path, f"user_reward_{k}")
        score, info = styles.call(getattr(mods[path], name), style, job["row"], job["completion"], job["ctx"], path,
                                  name, line)
        out.append([score, json.loads(json.dumps(info, default=str)), None])
    except styles.Failure as f:
        out.append([None, {}, [f.reason, str(f).replace(path, shown)]])
open("scores.json", "w").write(json.dumps(out))
"""


def _sandboxed(user: list, row: dict, completion: str, ctx: dict) -> list[tuple]:
    """Every user function of one sample in one sandbox run (rewards/sandbox.py): the files, rewards/styles.py and
    the sample go in as read-only files, the (score, info, failure) of each come back in scores.json; the sandbox's
    own failure (timeout, oom...) is a RuntimeError."""
    problem = refusal()
    if problem:
        raise RuntimeError(f"reward.sandbox: {problem}")
    paths = sorted({s[0] for s in user})
    files = {f"user_reward_{i}.py": Path(p).read_text(encoding="utf-8") for i, p in enumerate(paths)}
    files["reward_styles.py"] = (Path(__file__).parent / "styles.py").read_text(encoding="utf-8")
    job = {"funcs": [(name, style, line, paths.index(p)) for p, name, _, style, line in user],
           "shown": [Path(s[0]).name for s in user], "completion": completion, "ctx": ctx,
           "row": {k: v for k, v in row.items() if not k.startswith("_") and k != "prompt_ids"}}
    files["job.json"] = json.dumps(job, default=str)
    res = run_python(_SANDBOX_MAIN, files, timeout_s=time_left() or 60.0, read_back=("scores.json",))
    if res.status != "ok" or "scores.json" not in res.files:
        last = (res.stderr.strip().splitlines() or [res.status])[-1]
        raise RuntimeError(f"sandboxed reward: {res.status}: {last}"[:300])
    return [tuple(x) for x in json.loads(res.files["scores.json"])]


def messages_of(row: dict, turns: list[dict]) -> list[dict]:
    """An episode (trainer.episode_turns: [{"role": "model" | "tool", "text"}]) as chat messages, the prompt first."""
    prompt = row["prompt"]
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    return head + [{"role": "assistant" if t["role"] == "model" else "tool", "content": t["text"]} for t in turns]


def context(row: dict, turns: list[dict] | None, ids: list[int] | None, version: int, cfg) -> dict:
    """A pool job's third part: the episode's messages (None: a single-turn row), the response's token ids (None in
    evaluation), and TRL's trainer_state figures: step = optimizer steps taken (the policy version, TRL's
    global_step), steps = steps x ppo_epochs x mini_batches (its max_steps)."""
    return {"messages": messages_of(row, turns) if turns else None, "completion_ids": ids, "step": version,
            "steps": cfg.steps * cfg.ppo_epochs * cfg.mini_batches}


def _import_files(specs: tuple) -> tuple[float, dict]:
    """A pool job: import every user file of specs ("task" has none); -> (0, {"reason": "ok"}) or the first failure's
    message."""
    for path, name, *_ in (s for s in specs if s[1] != TASK):
        try:
            function(path, name)
        except Failure as f:
            return 0.0, {"reason": "reward_error", "error": str(f)}
    return 0.0, {"reason": "ok"}


def check_imports(cfg) -> None:
    """The launcher's check before any rank starts: reward.funcs' files import in a reward worker (never in this
    process; not with reward.sandbox, whose files run only in the sandbox); a file that raises is a ConfigError with
    its line."""
    if not cfg.reward.funcs or cfg.reward.sandbox:
        return
    pool = RewardPool(1, cfg.reward_timeout_s + 300.0, fn=_import_files)
    try:
        _, info = pool.score([(parse(cfg.reward.funcs, cfg.reward.weights),)])[0]
    finally:
        pool.close()
    if info["reason"] != "ok":
        raise ConfigError(f"reward.funcs: {info.get('error') or info['reason']}")


def reward_pool(cfg) -> RewardPool:
    """The run's reward pool: the rows' task scorers (tasks.py), or the weighted sum of reward.funcs."""
    if not cfg.reward.funcs:
        return RewardPool(cfg.reward_workers, cfg.reward_timeout_s)
    fn = UserReward(parse(cfg.reward.funcs, cfg.reward.weights), cfg.reward.sandbox)
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

"""Evaluate Triton completions with the AutoTriton reward: call / exec accuracy (and fast_1 / speedup on CUDA).

    python -m rewards.triton.eval completions.jsonl [--tasks tasks.jsonl] [--workers 2] [--out scored.jsonl]
    python -m rewards.triton.eval --check data/triton_tasks/solutions/CATEGORY/NAME.py   # a solution scores 1.0?

completions.jsonl rows: {"name": task name, "completion": model output}, any number per task; a row that
    carries "reference_code" is scored against it, otherwise against the shipped task of that name
    (data/triton_tasks) or the --tasks jsonl (rows as written by data/triton_tasks/build.py). The trainer's
    RUN_DIR/eval_samples.jsonl works as is: its rows carry "name" for triton tasks; rows without one (other
    tasks) are skipped and counted.
--check: the file is the completion, scored against the shipped task of its name; exit 0 only at 1.0.
Metrics, each over all completions:
    call   the code passed the linter and ran to the end (reason ok, wrong_output or input_mutated)
    exec   the output matched the reference (reward 1.0)
    fast_1 exec and faster than the PyTorch reference (CUDA only; KernelBench's fast_1)
    speedup  geometric mean of reference time / candidate time over the exec-correct ones (CUDA only)
Prints a per-task table, then one JSON line with the totals and the count of each reason.
"""
import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from config import ConfigError
from data.rows import read_records
from data.triton_tasks import load_tasks
from rewards.triton.kernel import triton_reward

CALLED = {"ok", "wrong_output", "input_mutated"}


def score_completions(rows: list, tasks: dict, workers: int = 2, timeout_s: float = 60.0) -> list:
    """[(score, info)] in row order; tasks: {name: task dict}, used for rows without reference_code."""
    def one(row):
        task = row if "reference_code" in row else tasks.get(row["name"])
        if task is None:
            return 0.0, {"reason": "unknown_task", "detail": row["name"]}
        return triton_reward(row["completion"], task, timeout_s=timeout_s)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, rows))


def summarize(rows: list, results: list) -> dict:
    """Totals: n, call, exec, fast_1 / speedup (None without CUDA timings), reasons, per_task."""
    per_task = defaultdict(lambda: {"n": 0, "call": 0, "exec": 0})
    speedups = []
    for row, (score, info) in zip(rows, results):
        t = per_task[row["name"]]
        t["n"] += 1
        t["call"] += info["reason"] in CALLED
        t["exec"] += score == 1.0
        if score == 1.0 and "speedup" in info:
            speedups.append(info["speedup"])
    n = len(rows)
    timed = bool(speedups)
    return {"n": n, "call": sum(t["call"] for t in per_task.values()) / max(n, 1),
            "exec": sum(t["exec"] for t in per_task.values()) / max(n, 1),
            "fast_1": sum(s > 1.0 for s in speedups) / max(n, 1) if timed else None,
            "speedup": math.exp(sum(map(math.log, speedups)) / len(speedups)) if timed else None,
            "reasons": dict(Counter(info["reason"] for _, info in results)), "per_task": dict(per_task)}


def check_solution(path: str, tasks: dict, timeout_s: float) -> int:
    """--check: score one solution file against the task of its name; -> exit code (0 at 1.0)."""
    name = Path(path).stem
    if name not in tasks:
        print(f"{path}: no task named {name!r} (the file name must be the task's name)", file=sys.stderr)
        return 2
    score, info = triton_reward("```python\n" + Path(path).read_text() + "\n```", tasks[name], timeout_s=timeout_s)
    print(f"{name}: score {score} ({info['reason']})")
    return 0 if score == 1.0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("completions", nargs="?")
    ap.add_argument("--check", help="a solution file: does it score 1.0 on the shipped task of its name?")
    ap.add_argument("--tasks", help="jsonl of task rows (default: the shipped data/triton_tasks)")
    ap.add_argument("--workers", type=int, default=2, help="candidates scored at once")
    ap.add_argument("--timeout", type=float, default=60.0, help="wall seconds per candidate")
    ap.add_argument("--out", help="write each row with its score and info here")
    a = ap.parse_args()
    try:
        tasks = {t["name"]: t for _, t in read_records(a.tasks)} if a.tasks else {t["name"]: t for t in load_tasks()}
        if a.check:
            return check_solution(a.check, tasks, a.timeout)
        if not a.completions:
            raise ConfigError("give a completions.jsonl (or --check SOLUTION.py)")
        every = [r for _, r in read_records(a.completions)]
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = [r for r in every if isinstance(r, dict) and isinstance(r.get("name"), str) and "completion" in r]
    if len(rows) < len(every):
        print(f"skipped {len(every) - len(rows)} rows without a task name and a completion")
    if not rows:
        print(f"error: {a.completions}: no rows with a triton task name and a completion", file=sys.stderr)
        return 2
    results = score_completions(rows, tasks, a.workers, a.timeout)
    if a.out:
        with open(a.out, "w") as f:
            for row, (score, info) in zip(rows, results):
                f.write(json.dumps({**row, "score": score, "info": info}) + "\n")
    summary = summarize(rows, results)
    print(f"{'task':32s} {'n':>3s} {'call':>6s} {'exec':>6s}")
    for name, t in sorted(summary["per_task"].items()):
        print(f"{name:32s} {t['n']:3d} {t['call'] / t['n']:6.2f} {t['exec'] / t['n']:6.2f}")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_task"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

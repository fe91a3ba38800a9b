"""What the GPU-semantics checks cost per Triton candidate: the sm_90 compile of every launch, and the record of
every load, store and atomic with the checks on it (races between programs, bounds, store visibility inside a
program), on the shipped solutions (CPU, the interpreter). A table, then one JSON line last.

    python benchmarks/bench_triton_checks.py                  # all 48 tasks, one run of each variant
    python benchmarks/bench_triton_checks.py --reps 3 matmul relu
    python benchmarks/bench_triton_checks.py --base /tmp/base  # before (that checkout's rewards/) and after

Each solution runs through the candidate sandbox (rewards/triton/kernel.py's _sandbox, the task's cached reference
stdin) with copies of rewards/triton/harness.py: as shipped, without the compile, without the record and checks,
without both (the harness itself has no switch: the copies replace rewards/triton/gpu.py's GpuCompiler /
hook_programs); with --base, instead, the harness and gpu.py of another checkout ("before") and these
("after"), alternated task by task in this one process. Every copy also times, inside the sandbox, the candidate's
run (_Candidate.run), the calls of GpuCompiler.problem (the process waiting on the compiling process) and of
Programs.record / finish ("race": the record and every check on it), and writes them to stderr. Per task: the
median sandbox wall and candidate-run time of each variant over --reps, and each variant's compile and race
seconds; with --base the JSON line also has the after / before ratio of the medians. Every run must score ok.
"""
import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402

from data.triton_tasks import load_tasks  # noqa: E402
from rewards.triton import kernel as triton_kernel  # noqa: E402

TIMED = '''
import time as _time
import triton_gpu
import triton_memory
_SPENT = {"compile": 0.0, "race": 0.0}
_MEMORY = triton_gpu if hasattr(triton_gpu, "Programs") else triton_memory   # a --base checkout before the split


def _timed(cls, name, key):
    original = getattr(cls, name)

    def run(self, *args):
        t0 = _time.perf_counter()
        try:
            return original(self, *args)
        finally:
            _SPENT[key] += _time.perf_counter() - t0
    setattr(cls, name, run)


_timed(triton_gpu.GpuCompiler, "problem", "compile")
_timed(_MEMORY.Programs, "record", "race")
_timed(_MEMORY.Programs, "finish", "race")
_timed(_Candidate, "run", "run")
_run = _Candidate.run


def _report(self):
    _SPENT["run"] = 0.0
    _run(self)
    sys.stderr.write("SPENT " + json.dumps(_SPENT) + "\\n")


_Candidate.run = _report
'''
NO_COMPILE = "\nimport triton_gpu\ntriton_gpu.GpuCompiler.__init__ = lambda self, text, load: None\n" \
    "triton_gpu.GpuCompiler.problem = lambda self, *args: None\n"
NO_RACE = "\nimport triton_memory\ntriton_memory.hook_programs = lambda programs: None\n"
VARIANTS = {"shipped": "", "no_compile": NO_COMPILE, "no_race": NO_RACE, "neither": NO_COMPILE + NO_RACE}


def run_once(paths: tuple, task: dict, ref: dict, parent=triton_kernel) -> tuple:
    """(sandbox wall s, {run, compile, race} s) of one candidate run (the checked run) with the harness, gpu.py,
    schedule.py and memory.py at paths; parent: the triton_kernel module whose result format that harness writes (the
    base checkout's for "before")."""
    (triton_kernel._HARNESS_PATH, triton_kernel._GPU_PATH, triton_kernel._SCHEDULE_PATH,
     triton_kernel._MEMORY_PATH) = paths
    t0 = time.perf_counter()
    res, blob = triton_kernel._sandbox({"candidate.py": task["solution"]}, {"role": "candidate", "device": "cpu",
                                       "checked": True, "time": False}, 120, "result.bin", stdin=ref["stdin"],
                                       fsize_mb=triton_kernel._result_mb(ref["cases"]))
    wall = time.perf_counter() - t0
    reason = parent._compare(ref["cases"], parent._parse_result(blob, ref["cases"]))[0]
    assert reason == "ok", (task["name"], paths, reason, res.stderr[-500:])
    spent = json.loads(next(line for line in reversed(res.stderr.splitlines()) if line.startswith("SPENT "))[6:])
    return wall, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="*", help="task names (default: all)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--base", help="a checkout whose rewards/ is 'before' (e.g. git worktree add /tmp/base <commit>)")
    args = ap.parse_args()
    shipped = (triton_kernel._HARNESS_PATH, triton_kernel._GPU_PATH, triton_kernel._SCHEDULE_PATH,
               triton_kernel._MEMORY_PATH)
    tasks = {t["name"]: t for t in load_tasks()}
    names = args.tasks or list(tasks)
    parents = {}
    if args.base:
        base = os.path.join(args.base, "rewards", "triton")   # since the package; before it rewards/triton_*.py
        prefix = "" if os.path.isdir(base) else "triton_"
        base = base if not prefix else os.path.dirname(base)
        spec = importlib.util.spec_from_file_location("base_triton_kernel", os.path.join(base, prefix + "kernel.py"))
        parents["before"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parents["before"])
        memory = os.path.join(base, "memory.py")      # since 4d21886; before it the record lived in gpu.py
        sources = {"before": (os.path.join(base, prefix + "harness.py"), "", os.path.join(base, prefix + "gpu.py"),
                              os.path.join(base, prefix + "schedule.py"),
                              memory if os.path.exists(memory) else shipped[3]),
                   "after": (shipped[0], "", *shipped[1:])}
    else:
        sources = {variant: (shipped[0], change, *shipped[1:]) for variant, change in VARIANTS.items()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for variant, (harness, change, *modules) in sources.items():
            paths[variant] = os.path.join(tmp, f"harness_{variant}.py"), *modules
            with open(harness) as f, open(paths[variant][0], "w") as out:
                out.write(f.read() + change + TIMED)
        print(f"{'task':22s} " + " ".join(f"{v + ' wall/run/race':>26s}" for v in sources) + f" {'compile':>8s}")
        for name in names:
            ref, problem = triton_kernel._reference(tasks[name]["reference_code"], "cpu")
            assert problem is None, problem
            runs = {v: [] for v in sources}
            for _ in range(args.reps):
                for v in sources:
                    runs[v].append(run_once(paths[v], tasks[name], ref, parents.get(v, triton_kernel)))
            row = {"task": name}
            for v, r in runs.items():
                row.update({f"{v}_wall_s": statistics.median(w for w, _ in r),
                            f"{v}_run_s": statistics.median(s["run"] for _, s in r),
                            f"{v}_compile_s": statistics.median(s["compile"] for _, s in r),
                            f"{v}_race_s": statistics.median(s["race"] for _, s in r)})
            rows.append(row)
            print(f"{name:22s} " + " ".join(f"{row[v + '_wall_s']:9.2f}/{row[v + '_run_s']:<6.2f}/"
                                            f"{row[v + '_race_s']:<9.4f}" for v in sources) +
                  f" {row[next(iter(sources)) + '_compile_s']:8.2f}", flush=True)
    (triton_kernel._HARNESS_PATH, triton_kernel._GPU_PATH, triton_kernel._SCHEDULE_PATH,
     triton_kernel._MEMORY_PATH) = shipped
    figures = {key: {"median": statistics.median(r[key] for r in rows), "max": max(r[key] for r in rows)}
               for key in rows[0] if key != "task"}
    if args.base:
        figures["ratio_after_before"] = {what: figures[f"after_{what}"]["median"] / figures[f"before_{what}"]["median"]
                                         for what in ("wall_s", "run_s", "race_s")}
    print(json.dumps({"device": "cpu", "python": platform.python_version(), "triton": triton.__version__,
                      "load_avg": os.getloadavg()[0], "tasks": len(rows), "reps": args.reps, **figures}))


if __name__ == "__main__":
    main()

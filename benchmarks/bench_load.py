"""One process against 2 ranks, on a quiet machine and beside CPU-bound processes: the demo job's RL step
(benchmarks/bench_step.py: configs/demo.yaml, 64 completions per step) each way, and the ratio docs/speed.md's advice
rests on. A table, then one JSON line.

    python benchmarks/bench_load.py                          # 1 process and 2 ranks, quiet and with 2 busy loops
    python benchmarks/bench_load.py --load busy --env OMP_WAIT_POLICY=ACTIVE   # under load only, with an env variant
    python benchmarks/bench_load.py --load busy --busy_session same  # the busy loops in this script's session

Each run is `bench_step.py [--nproc 2] --warmup W --steps S` (its median step over the timed steps, and its
rollout and update phases); "busy" runs start `--busy` processes running `while True: pass` first (each in a session
of its own, as other users' jobs are; --busy_session same: in this script's session, with the one-process run, like
jobs started from the same shell) and stop them after. The figure to read:
one_vs_ranks_busy = one process's step / 2 ranks' step, both beside the busy loops (goal <= 1.5). Timings on a
shared machine are noise: run it alone (the busy loops are the only other load).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_step(nproc: int, args, env: dict) -> dict:
    """One bench_step.py run -> its JSON line's step, rollout and update medians (s)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--nproc", str(nproc), "--warmup",
           str(args.warmup), "--steps", str(args.steps), "--cache", args.cache]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith('{"bench": "step"')]
    if p.returncode or not lines:
        raise SystemExit(f"bench_load: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(lines[-1])
    return {k: round(out[f"{k}_s"], 3) for k in ("step", "rollout", "update")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the busy runs")
    ap.add_argument("--busy_session", choices=["same", "own"], default="own",
                    help="the busy processes in this script's session (with the one-process run's parent) or each "
                         "in a session of its own (as another user's jobs)")
    ap.add_argument("--load", choices=["both", "quiet", "busy"], default="both")
    ap.add_argument("--nprocs", default="1,2", help="ways to run: ranks per run, comma-separated")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per bench_step run")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "bench_step"), help="bench_step.py's built demo job")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for every run")
    args = ap.parse_args()
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.env)}
    rows = []
    for load in (["quiet", "busy"] if args.load == "both" else [args.load]):
        for nproc in map(int, args.nprocs.split(",")):
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     start_new_session=args.busy_session == "own")
                    for _ in range(args.busy if load == "busy" else 0)]
            try:
                rows.append({"ranks": nproc, "load": load, **bench_step(nproc, args, env)})
            finally:
                for b in busy:
                    b.kill()
                    b.wait()
            print(f"{rows[-1]['ranks']:>5} {rows[-1]['load']:>6} step {rows[-1]['step']:7.3f} s  rollout "
                  f"{rows[-1]['rollout']:7.3f} s  update {rows[-1]['update']:7.3f} s", flush=True)
    step = {(r["ranks"], r["load"]): r["step"] for r in rows}
    ratios = {f"one_vs_ranks_{load}": round(step[1, load] / step[2, load], 2) for load in ("quiet", "busy")
              if (1, load) in step and (2, load) in step}
    print(json.dumps({"bench": "load", "busy": args.busy, "busy_session": args.busy_session, "env": args.env,
                      "runs": rows, **ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

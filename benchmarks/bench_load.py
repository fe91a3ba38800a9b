"""One process against 2 ranks, on a quiet machine and beside CPU-bound processes: the demo job's RL step
(benchmarks/bench_step.py: configs/demo.yaml, 64 completions per step) each way, and the ratio docs/speed.md's advice
rests on; with --way or --base, other ways (environment variants, another checkout) alternated with this one, back
to back, round after round. A table, then one JSON line.

    python benchmarks/bench_load.py                          # 1 process and 2 ranks, quiet and with 2 busy loops
    python benchmarks/bench_load.py --load busy --env OMP_WAIT_POLICY=ACTIVE   # under load only, with an env variant
    python benchmarks/bench_load.py --load quiet --nprocs 1 --rounds 3 --base /tmp/a874cb6   # this vs that checkout
    python benchmarks/bench_load.py --nprocs 1 --rounds 3 --way spin=GOMP_SPINCOUNT=30000   # this vs a variant

Each run is `bench_step.py [--nproc 2] --warmup W --steps S` (its median step over the timed steps, and its
rollout and update phases), all ways sharing one --cache (the built demo job); "busy" runs start `--busy` processes
running `while True: pass` first (each in a session of its own, as other users' jobs are; --busy_session same: in
this script's session, like jobs started from the same shell) and stop them after. A round runs every (load, ranks)
cell once per way, the ways in turn; figures are medians over rounds. The figures to read: one_vs_ranks_<load> =
one process's step / 2 ranks' step, both beside the same load (goal for busy <= 1.5); <way>_vs_this_<load>_<ranks> =
that way's step / this checkout's. Timings on a shared machine are noise: run it alone (the busy loops are the only
other load).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_step(root: Path, nproc: int, args, env: dict) -> dict:
    """One bench_step.py run of the checkout at root -> its JSON line's step, rollout and update medians (s)."""
    cmd = [sys.executable, str(root / "benchmarks" / "bench_step.py"), "--nproc", str(nproc), "--warmup",
           str(args.warmup), "--steps", str(args.steps), "--cache", args.cache]
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith('{"bench": "step"')]
    if p.returncode or not lines:
        raise SystemExit(f"bench_load: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(lines[-1])
    return {**{k: round(out[f"{k}_s"], 3) for k in ("step", "rollout", "update")},
            "openmp_wait": out["shapes"].get("openmp_wait")}


def ways(args) -> dict:
    """{name: (checkout root, environment, what differs)}: "this" (this checkout, --env), "base" (--base, the same
    --env), and each --way NAME=KEY=VALUE[,KEY=VALUE] (this checkout, --env plus those)."""
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.env)}
    out = {"this": (ROOT, env, "")}
    if args.base:
        out["base"] = (Path(args.base).resolve(), env, str(Path(args.base).resolve()))
    for spec in args.way:
        name, _, kvs = spec.partition("=")
        if not name or "=" not in kvs:
            raise SystemExit(f"bench_load: --way {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE]")
        out[name] = (ROOT, {**env, **dict(kv.split("=", 1) for kv in kvs.split(","))}, kvs)
    return out


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
    ap.add_argument("--rounds", type=int, default=1, help="every cell of every way once per round, alternated")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per bench_step run")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "bench_step"), help="bench_step.py's built demo job")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for every run")
    ap.add_argument("--way", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                    help="another way: this checkout with these environment variables too")
    ap.add_argument("--base", default=None, help="another checkout of this project, run the same way (name: base)")
    args = ap.parse_args()
    runs = ways(args)
    cells = [(load, nproc) for load in (["quiet", "busy"] if args.load == "both" else [args.load])
             for nproc in map(int, args.nprocs.split(","))]
    rows = []
    for rnd in range(args.rounds):
        for load, nproc in cells:
            for name, (root, env, _) in runs.items():
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                         start_new_session=args.busy_session == "own")
                        for _ in range(args.busy if load == "busy" else 0)]
                try:
                    rows.append({"way": name, "round": rnd, "ranks": nproc, "load": load,
                                 **bench_step(root, nproc, args, env)})
                finally:
                    for b in busy:
                        b.kill()
                        b.wait()
                r = rows[-1]
                print(f"{name:>8} {rnd:>2} {nproc:>5} {load:>6} step {r['step']:7.3f} s  rollout {r['rollout']:7.3f} s"
                      f"  update {r['update']:7.3f} s  {r['openmp_wait']}", flush=True)
    med = {(r["way"], r["load"], r["ranks"]): statistics.median(x["step"] for x in rows if
                                                                 (x["way"], x["load"], x["ranks"]) ==
                                                                 (r["way"], r["load"], r["ranks"])) for r in rows}
    ratios = {(f"one_vs_ranks_{load}" if name == "this" else f"{name}_one_vs_ranks_{load}"):
              round(med[name, load, 1] / med[name, load, 2], 2)
              for name in runs for load in ("quiet", "busy") if (name, load, 1) in med and (name, load, 2) in med}
    ratios.update({f"{name}_vs_this_{load}_{nproc}": round(med[name, load, nproc] / med["this", load, nproc], 2)
                   for name in runs if name != "this" for load, nproc in cells})
    print(json.dumps({"bench": "load", "busy": args.busy, "busy_session": args.busy_session, "env": args.env,
                      "ways": {n: what for n, (_, _, what) in runs.items() if n != "this"},
                      "medians": {f"{w}_{load}_{n}": v for (w, load, n), v in med.items()}, "runs": rows, **ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

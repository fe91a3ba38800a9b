"""What issue 44's schedules and autotune cost per Triton candidate (CPU, the interpreter): the wall time of
rewards.triton.kernel.execute for the honest kernels of tests/triton_corpus/schedules.py (4 runs of each case) and a
few shipped solutions (one run), median of --reps, with the rewards/ of --root (another checkout: its before).

    python benchmarks/bench_triton_schedules.py                     # this checkout
    python benchmarks/bench_triton_schedules.py --root /path/to/main-checkout --reps 3
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("relu", "matmul", "cumsum", "total_sum", "softmax_rows", "layer_norm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=HERE, help="the checkout whose rewards/ scores (default: this one)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sys.path[:0] = [os.path.join(HERE, "tests"), args.root]
    from data.triton_tasks import load_tasks
    from rewards.triton.kernel import _reference, execute
    from triton_corpus.schedules import CASES, HONEST
    tasks = {t["name"]: t for t in load_tasks()}
    items = [(cid + "/honest", task, honest) for cid, task, _, _, honest in CASES] + list(HONEST) + \
        [(name + "/shipped", name, tasks[name]["solution"]) for name in SHIPPED]
    for _, task, _ in items:
        _reference(tasks[task]["reference_code"], "cpu")
    for cid, task, code in items:
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            score, info = execute(code, tasks[task])
            times.append(time.perf_counter() - t0)
        print(f"{cid:45s} {score} {info['reason']:12s} {statistics.median(times):.2f}", flush=True)


if __name__ == "__main__":
    main()

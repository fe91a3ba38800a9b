"""Rollout throughput with the vLLM engine sharded over t ranks (tensor parallel) vs one engine per rank, for the
same total work: every step generates B groups of n samples over all ranks.

    torchrun --nproc_per_node 2 benchmarks/bench_rollout_tp.py --tp 1    # 2 engines, B/2 groups each
    torchrun --nproc_per_node 2 benchmarks/bench_rollout_tp.py --tp 2    # 1 engine over both ranks, B groups

Synchronous rollout (every request of the step in flight at once, so both settings keep the same B*n requests in
flight over the machine; the long tail leaves engines idle) or, with --copris, CoPRIS partial rollout with
--concurrency requests in flight over the machine (split over the engines), through CoprisScheduler; response
lengths forced (eos ignored) from bench_rollout's long-tailed lognormal, so both settings generate the same tokens
(sync) or the same length mix (copris). A random-init Qwen2 (head_dim 64) is built in
a temporary folder. The first --warmup steps are not timed; a step is timed from a barrier to a barrier.
Reported: generated tokens/s over all engines, seconds per step (median, min, max over the timed steps) and
CPU seconds per 1000 generated tokens (all ranks' process time: on a shared machine less load-dependent than
wall time).
A table, then one JSON line last.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout import lognormal_len  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2, help="t: ranks per engine (divides the world size)")
    ap.add_argument("--groups", type=int, default=8, help="B groups per step over all ranks")
    ap.add_argument("--n", type=int, default=4, help="samples per group")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--median", type=int, default=48)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--cap", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=128, help="model width (heads = hidden / 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copris", action="store_true", help="CoPRIS partial rollout instead of synchronous")
    ap.add_argument("--concurrency", type=int, default=32, help="with --copris: requests in flight over all engines")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    import torch.distributed as dist
    from data.arithmetic import make_split
    from data.tiny_model import build_model_folder
    from model import all_sum, engine_group, init_distributed
    from rollout.copris import CoprisScheduler
    from rollout.vllm_engine import EngineConfig, RolloutEngine
    rank, world, device = init_distributed()
    eg = engine_group(a.tp)
    with tempfile.TemporaryDirectory() as d:
        folder = [d if rank == 0 else None]
        if rank == 0:
            rows = make_split(2000, seed=0)
            build_model_folder(Path(d), [r["prompt"] + r["solution"] for r in rows], vocab_size=512,
                               hidden=a.hidden, layers=a.layers, heads=a.hidden // 64, max_len=a.cap + 64)
        dist.broadcast_object_list(folder)
        groups, P = a.groups // eg.count, a.concurrency // eg.count if a.copris else a.groups * a.n // eg.count
        engine = RolloutEngine(EngineConfig(folder[0], max_model_len=a.cap + 64, seed=a.seed, max_num_seqs=P,
                                            tensor_parallel_size=a.tp), distributed=True)
        sched = CoprisScheduler(a.n, groups, P, a.cap, 1.0, 1.0, [], seed=a.seed, enabled=a.copris,
                                forced_len=lognormal_len(a.median, a.sigma, a.cap, a.seed))
        drawn = [0]

        def draw():  # the same prompt ids on a group's ranks; over all groups 0, 1, 2.. whatever t (same lengths)
            drawn[0] += 1
            return (drawn[0] - 1) * eg.count + eg.index, list(range(5, 37)), {}
        secs, tokens, cpu = [], 0.0, 0.0
        for step in range(a.warmup + a.steps):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            _, st = sched.collect(engine, draw, version=step)
            dist.barrier()
            if step >= a.warmup:
                secs.append(time.perf_counter() - t0)
                got, used = all_sum([st.new_tokens / eg.size, time.process_time() - c0], device)  # once per engine
                tokens, cpu = tokens + got, cpu + used
        engine.shutdown()  # (vLLM's teardown also ends the process group: no collectives after it)
    out = {"tp": a.tp, "engines": eg.count, "world": world, "tok_s": tokens / sum(secs),
           "s_per_step_median": statistics.median(secs), "s_per_step_min": min(secs), "s_per_step_max": max(secs),
           "tokens_per_step": tokens / a.steps, "cpu_s_per_1k_tokens": 1000 * cpu / tokens}
    if rank == 0:
        print(f"{'t':>2} {'engines':>7} {'tok/s':>8} {'s/step median (min, max)':>26} {'tokens/step':>12} "
              f"{'CPU s/1k tok':>13}")
        print(f"{a.tp:2d} {eg.count:7d} {out['tok_s']:8.0f} {out['s_per_step_median']:10.2f} "
              f"({out['s_per_step_min']:.2f}, {out['s_per_step_max']:.2f}) {out['tokens_per_step']:12.0f} "
              f"{out['cpu_s_per_1k_tokens']:13.2f}")
        out.update(device=platform.processor() or platform.machine(), torch=torch.__version__, cpus=os.cpu_count(),
                   load_avg=os.getloadavg(), config=vars(a))
        print(json.dumps(out))


if __name__ == "__main__":
    main()
    import launch
    launch.exit_process(0)  # a rank that finished must not abort in interpreter teardown (see its docstring)

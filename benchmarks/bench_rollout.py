"""Rollout benchmark: synchronous vs CoPRIS partial rollout on the same engine, model and seeds.

Response lengths are forced (eos ignored) from a long-tailed lognormal: median 48 tokens, sigma 1.0,
capped at 768 by default, per (prompt, sample) seed, so both arms see the same lengths. Each step
collects B groups of n samples; the first `--warmup` steps are not timed (CoPRIS's buffer must
reach steady state: a 768-token sample spans about a dozen steps). Reported per arm: rollout
seconds per trained batch, useful tokens/s (tokens of the samples that finished and are trained on), tokens still in the buffer at the end, engine idle share
(1 - requests in flight / slots, averaged over engine steps), and the speedup; plus two ceilings,
the engine's saturated throughput with P requests always in flight and no tail: requests of the
median length (the issue's definition) and requests with the same long-tailed length mix (long
contexts cost more attention per token, so this is the ceiling a long-tail workload can reach).

    python benchmarks/bench_rollout.py                 # real vLLM engine (CPU build here), tiny model
    python benchmarks/bench_rollout.py --simulate      # discrete-event model at GPU-scale lengths

--simulate runs the same scheduling policy in a discrete-event model: an engine step advances every
request in flight by one token and takes a + c * batch seconds (a throughput-vs-batch curve; defaults
are assumptions for a 7B model on one H100/H200-class GPU, not measurements: change them), and shows
how the rollout speedup grows with the max response length (natural lengths lognormal, median 3000,
sigma 1.0, truncated at the cap: a longer cap lets the tail run longer, which stalls synchronous
rollout and not CoPRIS). Not modelled: the prefill of resumed requests, training time.
A table, then one JSON line last.
"""
import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollout.copris import CoprisScheduler, request_seed  # noqa: E402


def lognormal_len(median: float, sigma: float, cap: int, seed: int):
    """(prompt_id, sample) -> forced response length, the same in every arm."""
    def f(prompt_id: int, sample: int) -> int:
        r = random.Random(request_seed(seed, prompt_id, sample, -1))
        return max(1, min(cap, round(median * math.exp(sigma * r.gauss(0.0, 1.0)))))
    return f


def run_arm(engine, enabled: bool, a, lengths, prompt) -> dict:
    sched = CoprisScheduler(a.n, a.groups, a.concurrency, a.cap, 1.0, 1.0, [], seed=a.seed, enabled=enabled,
                            forced_len=lengths)
    drawn = [0]

    def draw():
        drawn[0] += 1
        return drawn[0], prompt, {}
    secs, useful, generated, slot_steps, busy = 0.0, 0, 0, 0, 0
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        groups, st = sched.collect(engine, draw, version=step)
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            secs += dt
            useful += sum(len(t.tokens) for g in groups for t in g.samples)
            generated += st.new_tokens
            slot_steps += st.engine_steps * sched.P
            busy += st.busy_slot_steps
    buffered = sum(len(t.tokens) for g in sched.buffer for t in g.samples)
    engine.abort([])
    return {"arm": "copris" if enabled else "sync", "P": sched.P, "s_per_batch": secs / a.steps,
            "useful_tok_s": useful / secs, "generated_tok_s": generated / secs, "buffer_tokens_end": buffered, "idle_share": 1 - busy / slot_steps}


def saturated(engine, a, prompt, lengths) -> float:
    """Tokens/s with P requests always in flight and no groups, hence no tail: each request is its
    own group of one and the run stops (aborting the rest) after enough of them finish.
    lengths: (prompt, sample) -> forced length."""
    sched = CoprisScheduler(1, 4 * a.groups * a.n, a.concurrency, a.cap, 1.0, 1.0, [], seed=a.seed + 1,
                            forced_len=lengths)
    drawn = [0]

    def draw():
        drawn[0] += 1
        return drawn[0], prompt, {}
    sched.collect(engine, draw, version=0)  # warm
    t0, tokens = time.perf_counter(), 0
    for step in range(max(2, a.steps // 2)):
        tokens += sched.collect(engine, draw, version=step)[1].new_tokens
    return tokens / (time.perf_counter() - t0)


def real(a) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from data.arithmetic import make_split
    from data.tiny_model import build_model_folder
    from rollout.vllm_engine import EngineConfig, RolloutEngine
    with tempfile.TemporaryDirectory() as d:
        rows = make_split(2000, seed=0)
        build_model_folder(Path(d), [r["prompt"] + r["solution"] for r in rows], vocab_size=512, hidden=128, layers=4,
                           max_len=a.cap + 64)
        engine = RolloutEngine(EngineConfig(d, max_model_len=a.cap + 64, seed=a.seed,
                                            max_num_seqs=max(a.concurrency, a.groups * a.n)), distributed=False)
        prompt = list(range(5, 37))  # 32 prompt tokens
        lengths = lognormal_len(a.median, a.sigma, a.cap, a.seed)
        arms = [run_arm(engine, False, a, lengths, prompt), run_arm(engine, True, a, lengths, prompt)]
        ceiling = saturated(engine, a, prompt, lambda p, s: a.median)
        ceiling_mix = saturated(engine, a, prompt, lengths)
        engine.shutdown()
    sync, cop = arms
    print(f"{'arm':8} {'P':>4} {'s/batch':>9} {'useful tok/s':>13} {'generated tok/s':>16} {'buffer tok':>11} {'idle':>6}")
    for r in arms:
        print(f"{r['arm']:8} {r['P']:4d} {r['s_per_batch']:9.3f} {r['useful_tok_s']:13.0f} {r['generated_tok_s']:16.0f} "
              f"{r['buffer_tokens_end']:11d} {r['idle_share']:6.1%}")
    print(f"ceiling: {ceiling:.0f} tok/s with P={a.concurrency} fixed-length ({a.median}) requests in flight; "
          f"{ceiling_mix:.0f} tok/s with the same long-tailed length mix in flight (no groups, no tail)")
    speedup = sync["s_per_batch"] / cop["s_per_batch"]
    print(f"CoPRIS rollout speedup {speedup:.2f}x; useful throughput {cop['useful_tok_s'] / ceiling:.1%} of the "
          f"fixed-length ceiling, {cop['useful_tok_s'] / ceiling_mix:.1%} of the same-mix ceiling")
    return {"mode": "real", "arms": arms, "ceiling_tok_s": ceiling, "ceiling_same_mix_tok_s": ceiling_mix,
            "speedup": speedup, "copris_vs_ceiling": cop["useful_tok_s"] / ceiling,
            "copris_vs_same_mix_ceiling": cop["useful_tok_s"] / ceiling_mix}


class SimEngine:
    """Discrete-event engine: a decode step advances every request in flight by one token and takes
    a + c * batch seconds. step() jumps to the next completion: k = min remaining tokens steps at once."""

    def __init__(self, a_s: float, c_s: float, cap: int):
        self.a, self.c, self.cap, self.clock, self.reqs = a_s, c_s, cap, 0.0, {}

    def sampling(self, max_tokens, temperature, top_p, seed, stop_token_ids, ignore_eos=False):
        return max_tokens

    def add(self, req_id, prompt_ids, max_tokens):
        self.reqs[req_id] = max_tokens

    def step(self):
        from rollout.vllm_engine import Delta
        k = min(self.reqs.values())
        self.clock += k * (self.a + self.c * len(self.reqs))
        out = []
        for rid in list(self.reqs):
            self.reqs[rid] -= k
            done = self.reqs[rid] <= 0
            out.append(Delta(rid, [0] * k, [0.0] * k, done, "length" if done else None))
            if done:
                del self.reqs[rid]
        return out

    def abort(self, req_ids):
        for r in req_ids:
            self.reqs.pop(r, None)


def simulate(a) -> dict:
    rows = []
    print(f"{'max len':>8} {'mean len':>9} {'sync s/batch':>13} {'copris s/batch':>15} {'speedup':>8}")
    for cap in a.sim_caps:
        lengths = lognormal_len(a.sim_median, a.sim_sigma, cap, a.seed)
        res = {}
        for enabled in (False, True):
            eng = SimEngine(a.sim_a, a.sim_c, cap)
            sched = CoprisScheduler(a.sim_n, a.sim_groups, a.sim_concurrency, cap, 1.0, 1.0, [], a.seed,
                                    enabled=enabled, forced_len=lengths)
            drawn = [0]

            def draw():
                drawn[0] += 1
                return drawn[0], [0], {}
            for step in range(a.warmup + a.sim_steps):
                if step == a.warmup:
                    t0 = eng.clock
                sched.collect(eng, draw, version=step)
            res[enabled] = (eng.clock - t0) / a.sim_steps
        sample = [lengths(p, s) for p in range(500) for s in range(8)]
        mean_len = sum(sample) / len(sample)
        rows.append({"max_len": cap, "mean_len": mean_len, "sync_s": res[False], "copris_s": res[True],
                     "speedup": res[False] / res[True]})
        print(f"{cap:8d} {mean_len:9.0f} {res[False]:13.1f} {res[True]:15.1f} {res[False] / res[True]:8.2f}x")
    return {"mode": "simulate", "a_s": a.sim_a, "c_s": a.sim_c, "P": a.sim_concurrency, "groups": a.sim_groups,
            "n": a.sim_n, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first: CoPRIS's buffer needs about "
                    "cap / (tokens per step) steps to reach steady state")
    ap.add_argument("--groups", type=int, default=8, help="B groups per step")
    ap.add_argument("--n", type=int, default=4, help="samples per group")
    ap.add_argument("--concurrency", type=int, default=64, help="P")
    ap.add_argument("--median", type=int, default=48)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--cap", type=int, default=768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--sim-caps", type=int, nargs="+", default=[8192, 16384, 24576, 32768, 40960],
                    help="max response lengths (the paper: 8K..40K)")
    ap.add_argument("--sim-median", type=int, default=3000, help="median natural response length")
    ap.add_argument("--sim-sigma", type=float, default=1.0)
    ap.add_argument("--sim-a", type=float, default=0.015, help="engine step time at batch 0 (s)")
    ap.add_argument("--sim-c", type=float, default=5e-5, help="extra step time per request in flight (s)")
    ap.add_argument("--sim-groups", type=int, default=64)
    ap.add_argument("--sim-n", type=int, default=8)
    ap.add_argument("--sim-concurrency", type=int, default=1024)
    ap.add_argument("--sim-steps", type=int, default=4)
    a = ap.parse_args()
    out = simulate(a) if a.simulate else real(a)
    import torch
    out.update(device=platform.processor() or platform.machine(), torch=torch.__version__,
               config={k: v for k, v in vars(a).items() if not k.startswith("sim") or a.simulate})
    print(json.dumps(out))


if __name__ == "__main__":
    main()

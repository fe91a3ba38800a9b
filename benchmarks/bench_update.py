"""The update at a real shape, three ways back to back in one process: ours (trainer.policy_update: the policy
model.build_model gives a world of one, the packed forward, the fused lm_head loss, clip and AdamW), plain
transformers on the same rows (forward with logits, log_softmax, PPO-clip loss, backward, clip, torch AdamW), and
the floor of this machine (the GEMMs of the model's own shapes at the step's token count, timed one by one, plus
AdamW's bytes at a measured memory bandwidth). A table, then one JSON line last.

    python benchmarks/bench_update.py                                  # Qwen2.5-0.5B's shape, 2 groups x 4, 32 tokens
    python benchmarks/bench_update.py --set precision=fp32 --set precision=bf16   # ours once per setting, in turn
    python benchmarks/bench_update.py --size tiny --steps 1 --warmup 1 # the CPU smoke size (the test)

Rows: --groups prompts of --prompt_len random tokens, --n_samples responses of exactly --response_len random tokens
each, GRPO advantages of random 0/1 rewards; old log-probs nan (the update's own forward supplies them: the
synchronous job with trainer old log-probs and one mini-batch). Model: bench_step.SIZES' architecture with random
weights (the same seed for every way). Each way runs --warmup untimed then --steps timed updates on the same rows;
figures are medians.

ours: each --set (KEY=VALUE[,KEY=VALUE...], trainer config keys) is one variant, built, timed and freed in turn;
fwd_bwd = the update less optimizer_step (clip + AdamW), timed by wrapping trainer.optimizer_step. plain: the model
without FSDP or hooks (attn sdpa), one (b, L) batch of equal-length rows per token_budget, fp32 and with CPU bf16
autocast (torch.autocast("cpu")), torch AdamW (fused: the fastest of torch's three on CPU), the trainer's lr and
clip. floor: for each linear of the
model (every decoder layer's q, k, v, o, gate, up, down and the lm_head) the three GEMMs of its forward and backward
at N = the step's laid-out tokens (X W^T, dY W, dY^T X), timed in fp32 and in bf16 (bf16 in and out); plus AdamW's
28 bytes per parameter (read param, grad, m, v; write param, m, v in fp32) at the bandwidth of a large fp32
a.add_(b) (3 x 4 bytes per element moved). Attention's score matmuls, norms and the softmax over V are left out:
the floor is a bound, not a model of the step.
"""
import argparse
import contextlib
import functools
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import config  # noqa: E402
config.openmp_wait()  # as trainer.py does, before torch loads OpenMP
import torch  # noqa: E402

import config  # noqa: E402
import launch  # noqa: E402
import model  # noqa: E402
import trainer  # noqa: E402
from bench_kernels import print_table  # noqa: E402
from kernels import fused_linear  # noqa: E402
from bench_step import SIZES, PlainStep, arch_config, device_name, random_model, random_policy, versions  # noqa: E402
from host_memory import PeakRSS  # noqa: E402
from model import Row, init_distributed  # noqa: E402
from rewards.advantages import grpo_advantages  # noqa: E402


def make_rows(args, vocab: int) -> list[Row]:
    rng = random.Random(0)
    rows = []
    for _ in range(args.groups):
        prompt = [rng.randrange(vocab) for _ in range(args.prompt_len)]
        rows += [Row(prompt, [rng.randrange(vocab) for _ in range(args.response_len)]) for _ in range(args.n_samples)]
    rewards = torch.tensor([float(rng.random() < 0.5) for _ in rows])
    adv = grpo_advantages(rewards, args.n_samples, "group")
    for r, a in zip(rows, adv):
        r.adv = torch.full((len(r.response),), float(a))
    return rows


def fresh_copies(rows: list[Row]) -> list[Row]:
    """The rows with old log-probs nan: the update's forward supplies them (policy_update writes them back)."""
    return [Row(r.prompt_ids, r.response, torch.full((len(r.response),), float("nan")), r.adv) for r in rows]


def median_of(steps: list[dict]) -> dict:
    return {k: statistics.median(s[k] for s in steps) for k in steps[0]}


def ours(args, qcfg, rows, device, overrides: list[str]) -> dict:
    """trainer.policy_update on a fresh policy built with the overrides; -> median seconds and peak RSS."""
    cfg = trainer.Config(n_samples=args.n_samples, batch_groups=args.groups, lr=1e-6, save_every=0,
                         max_prompt_len=args.prompt_len, max_response_len=args.response_len)
    patches = contextlib.ExitStack()
    for kv in overrides:  # config.py's parsing of one --key=value (no model folder to validate against)
        k, v = kv.split("=", 1)
        if k == "patch":
            patches.enter_context(PATCHES[v]())
        else:
            config._apply(cfg, k, v, from_cli=True)
    with patches:
        return timed_updates(args, qcfg, rows, device, cfg)


def timed_updates(args, qcfg, rows, device, cfg) -> dict:
    peak = PeakRSS()
    run = trainer.Run(cfg, 0, 1, device, Path(tempfile.gettempdir()), tok=None,
                      policy=random_policy(qcfg, device, args.size, cfg.precision))
    run.optim, run.sched = trainer.make_optimizer(cfg, run.policy, args.warmup + args.steps + 1)
    optimizer_step, steps = trainer.optimizer_step, []

    def timed_optimizer_step(r):
        t0 = time.perf_counter()
        try:
            return optimizer_step(r)
        finally:
            cur["optim"] += time.perf_counter() - t0
    trainer.optimizer_step = timed_optimizer_step
    try:
        for _ in range(args.warmup + args.steps):
            cur = {"optim": 0.0}
            t0 = time.perf_counter()
            m = trainer.policy_update(run, fresh_copies(rows))
            cur["update"] = time.perf_counter() - t0
            cur["fwd_bwd"] = cur["update"] - cur["optim"]
            steps.append(cur)
    finally:
        trainer.optimizer_step = optimizer_step
    out = {**median_of(steps[args.warmup:]), "peak_rss_gib": (peak.bytes() or 0) / 2**30, "loss": m["loss"],
           "grad_norm": m["grad_norm"]}
    run.policy = run.optim = run.sched = None
    gc.collect()
    return out


def adamw_foreach():
    """make_optimizer's AdamW as before (foreach, not fused)."""
    real = torch.optim.AdamW
    return mock.patch("torch.optim.AdamW", lambda *a, **kw: real(*a, **{**kw, "fused": None, "foreach": True}))


def chunk_logits(n: int):
    return lambda: mock.patch.object(fused_linear, "_CHUNK_LOGITS", n)


def reshard_after_forward(value: bool):
    """model.build_model's fully_shard with reshard_after_forward forced."""
    real = model.fully_shard
    return lambda: mock.patch.object(model, "fully_shard", lambda m, **kw: real(m, **{
        **kw, "reshard_after_forward": value}))


def build_with(**kw):
    """model.build_model with keyword arguments forced: shard=True (FSDP2 on a CPU world of one, as before),
    checkpoint=True (activation checkpointing, off on CPU)."""
    return lambda: mock.patch.object(model, "build_model", functools.partial(model.build_model, **kw))


# --set patch=NAME: the changes of docs/speed.md's "The update at the 0.5B shape" undone (or alternatives), one by one
PATCHES = {"adamw_foreach": adamw_foreach, "fsdp": build_with(shard=True), "checkpoint": build_with(checkpoint=True),
           "chunk_55": chunk_logits(1 << 23), "chunk_220": chunk_logits(1 << 25),
           "chunk_441": chunk_logits(1 << 26), "chunk_883": chunk_logits(1 << 27),
           "reshard": reshard_after_forward(True), "no_reshard": reshard_after_forward(False)}


def plain(args, qcfg, rows, device, autocast: bool) -> dict:
    """PlainStep's model, loss and AdamW on one batch per token_budget of the equal-length rows."""
    peak = PeakRSS()
    cfg = trainer.Config(lr=1e-6)
    step = PlainStep(random_model(qcfg, device, torch.float32, "sdpa"), cfg, device)
    step.optim = torch.optim.AdamW(step.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    n_tokens, steps = sum(len(r.response) for r in rows), []
    batches = step.exact_batches(rows)
    for _ in range(args.warmup + args.steps):
        cur = {}
        t0 = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            for batch in batches:
                step.loss([Row(r.prompt_ids, r.response, torch.zeros(len(r.response)), r.adv) for r in batch],
                          n_tokens).backward()
        cur["fwd_bwd"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(step.model.parameters(), cfg.grad_clip)
        step.optim.step()
        step.optim.zero_grad(set_to_none=True)
        cur["optim"] = time.perf_counter() - t0
        cur["update"] = cur["fwd_bwd"] + cur["optim"]
        steps.append(cur)
    out = {**median_of(steps[args.warmup:]), "peak_rss_gib": (peak.bytes() or 0) / 2**30}
    del step
    gc.collect()
    return out


def linear_shapes(qcfg) -> list[tuple[int, int, int]]:
    """(out, in, count) of every linear of the model (the lm_head once, tied or not)."""
    H, I, L = qcfg.hidden_size, qcfg.intermediate_size, qcfg.num_hidden_layers
    kv = qcfg.num_key_value_heads * (H // qcfg.num_attention_heads)
    return [(H, H, 2 * L), (kv, H, 2 * L), (I, H, 2 * L), (H, I, L), (qcfg.vocab_size, H, 1)]


def best_of(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def floor(qcfg, n_tokens: int, n_params: int, reps: int) -> dict:
    """Seconds of the model's GEMMs (forward and backward, fp32 and bf16) at n_tokens, the GFLOP/s they ran at,
    the memory bandwidth and AdamW's bytes at it."""
    out = {}
    flops = sum(6 * n_tokens * o * i * c for o, i, c in linear_shapes(qcfg))
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        total = 0.0
        for o, i, c in linear_shapes(qcfg):
            x, w, dy = torch.randn(n_tokens, i, dtype=dt), torch.randn(o, i, dtype=dt), torch.randn(n_tokens, o, dtype=dt)
            total += c * sum(best_of(f, reps) for f in (lambda: x @ w.T, lambda: dy @ w, lambda: dy.T @ x))
        out[f"gemm_{name}_s"], out[f"gemm_{name}_gflops"] = total, flops / total / 1e9
    a, b = torch.ones(1 << 28), torch.ones(1 << 28)  # 1 GiB each
    out["bandwidth_gbs"] = 3 * a.nbytes / best_of(lambda: a.add_(b), reps) / 1e9
    out["adamw_s"] = 28 * n_params / (out["bandwidth_gbs"] * 1e9)
    out["floor_fp32_s"] = out["gemm_fp32_s"] + out["adamw_s"]
    out["floor_bf16_s"] = out["gemm_bf16_s"] + out["adamw_s"]
    out["model_gflop"] = flops / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0.5b", choices=SIZES)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--n_samples", type=int, default=4)
    ap.add_argument("--prompt_len", type=int, default=40)
    ap.add_argument("--response_len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed updates per way (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--set", action="append", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                    help="ours: one variant of trainer config overrides per --set (default: one, the defaults)")
    ap.add_argument("--ways", nargs="+", default=["ours", "plain", "plain_bf16", "floor"],
                    choices=["ours", "plain", "plain_bf16", "floor"])
    ap.add_argument("--floor_reps", type=int, default=3, help="floor: each GEMM's best of this many")
    args = ap.parse_args()
    _, _, device = init_distributed()
    qcfg = arch_config(args.size)
    rows = make_rows(args, qcfg.vocab_size)
    laid = args.groups * args.prompt_len + len(rows) * args.response_len  # each group's prompt laid out once
    trained = len(rows) * args.response_len
    n_params = sum(p.numel() for p in random_model(qcfg, "meta", torch.float32, "sdpa").parameters())
    res, table = {}, []
    variants = [[kv for kv in s.split(",") if kv] for s in (args.set or [""])]
    for way in args.ways:
        if way == "ours":
            for v in variants:  # a variant given twice (alternated runs) is reported twice: "... (2)"
                name = "ours" + "".join(f" {kv}" for kv in v)
                name += f" ({sum(k.split(' (')[0] == name for k in res) + 1})" if name in res else ""
                res[name] = ours(args, qcfg, rows, device, v)
        elif way.startswith("plain"):
            res[way] = plain(args, qcfg, rows, device, autocast=way == "plain_bf16")
        else:
            res["floor"] = floor(qcfg, laid, n_params, args.floor_reps)
        print(f"bench_update: {way} done", file=sys.stderr, flush=True)
    base = res.get("plain", {}).get("update")
    for name, r in res.items():
        if name != "floor":
            table.append(dict(way=name, update_s=round(r["update"], 3), fwd_bwd_s=round(r["fwd_bwd"], 3),
                              optim_s=round(r["optim"], 3), peak_rss_gib=round(r["peak_rss_gib"], 2),
                              vs_plain=round(r["update"] / base, 3) if base else None,
                              vs_floor_bf16=round(r["update"] / res["floor"]["floor_bf16_s"], 2)
                              if "floor" in res else None))
    print_table(table, ["way", "update_s", "fwd_bwd_s", "optim_s", "peak_rss_gib", "vs_plain", "vs_floor_bf16"])
    if "floor" in res:
        f = res["floor"]
        print(f"floor at {laid} tokens ({f['model_gflop']:.0f} GFLOP of linears): GEMMs fp32 {f['gemm_fp32_s']:.2f} s "
              f"({f['gemm_fp32_gflops']:.0f} GFLOP/s), bf16 {f['gemm_bf16_s']:.2f} s ({f['gemm_bf16_gflops']:.0f} "
              f"GFLOP/s); bandwidth {f['bandwidth_gbs']:.1f} GB/s, AdamW {f['adamw_s']:.2f} s; floor fp32 "
              f"{f['floor_fp32_s']:.2f} s, bf16 {f['floor_bf16_s']:.2f} s")
    print(json.dumps(dict(bench="update", device=device_name(device), versions=versions(), size=args.size,
                          groups=args.groups, n_samples=args.n_samples, prompt_len=args.prompt_len,
                          response_len=args.response_len, laid_tokens=laid, trained_tokens=trained, params=n_params,
                          threads=torch.get_num_threads(), steps=args.steps, warmup=args.warmup, results=res)))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    launch.exit_process(main())

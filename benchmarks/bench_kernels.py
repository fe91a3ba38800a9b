"""Kernel microbenchmarks: a table, then one JSON line last (device, versions, shapes, figures).

    python benchmarks/bench_kernels.py                    # CPU: torch path vs naive log_softmax + gather
    python benchmarks/bench_kernels.py --quick            # CUDA: T=16384, V=151936 bf16 only
    python benchmarks/bench_kernels.py --budget-s 300     # CUDA: full grid, stop starting cases after 300 s
    python benchmarks/bench_kernels.py --only fused-linear  # CPU: only the fused lm_head -> PPO loss case
    python benchmarks/bench_kernels.py --only fused-head  # CUDA (or CPU at --head-* sizes): the chunk sweep

CPU (no CUDA): token_logprobs' chunked torch path against the naive path at N x V (default 4096 x 32000 fp32):
forward (logp), forward+backward (logp) and forward+backward (logp + entropy). Time: median (p20, p80) over
rounds that alternate the two paths, so both see the same load on a shared machine. Peak extra memory: each case
in a fresh subprocess, peak RSS during the call (VmHWM reset just before) minus RSS before it (inputs allocated);
the fwd+bwd figure includes the dlogits both paths must return, and "beyond dlogits" subtracts its N*V*elt bytes.
CPU, fused lm_head -> PPO loss: fused_linear_ppo_loss against the unfused path (logits = h @ W.T, then
fused_logits_ppo_loss's CPU path, token_logprobs + ppo_loss; the trainer itself runs the fused op), forward+backward
into fp32 leaves h (T, H) and W (V, H) at T=4096, H=896, V=151936 (Qwen2.5-0.5B's head: logits are 2.5 GB in fp32),
and the fused op with objective gspo (sequences of 256 tokens, every token off-policy: its no-grad first pass
covers them all, the worst case). Each path runs once in a fresh subprocess: peak RSS growth during the call as above, its wall time and its CPU time.
CUDA: triton.testing.do_bench median (p20, p80) for T x V x dtype, forward-only and forward+backward, in this
order: the project's kernels (token_logprobs, with entropy, two-kernel token_logprobs + ppo_loss, fused logits ->
PPO loss), Liger-Kernel (selective log-softmax forward, triton_grpo_loss forward+backward) when it is importable (a
Liger whose signature differs is a skipped row, not a crash), torch eager of the naive code and, except with
--quick, torch.compile of it (its compilation can take tens of seconds: last). GB: the bytes the project's kernel
for that mode moves, PASSES x the logits (forward: one read; forward+backward: the forward's read, the backward's
re-read, since only per-row lse is kept, and the dlogits write); GB/s: those bytes over the time (for other
implementations an effective rate on the same bytes), against a device-to-device copy measured in the same run
(pct_copy_bw) and H200's 4.8 TB/s (pct_4p8TBps). Each row is printed as it is measured. Peak extra memory:
torch.cuda.max_memory_allocated during one call minus the allocation before it.
Fused head (--only fused-head): the trainer's loss from hidden states (fused_linear_ppo_loss, bf16 on CUDA) at
T=16384, V=151936 for H in 896, 3584, 5120 (Qwen2.5-0.5B, 7B, 32B) and chunks of 128, 441 (the CUDA default) and
1024 tokens, and the unfused path (h @ W.T, then fused_logits_ppo_loss) at H=896: time, TFLOP/s of the three GEMMs
(6 T V H), peak extra memory with the gradients; the fastest chunk per H and the default's time over it.
"""
import argparse
import json
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import fused_linear_ppo_loss, fused_logits_ppo_loss, ppo_loss, token_logprobs  # noqa: E402
from kernels.fused_linear import default_chunk  # noqa: E402
from host_memory import status_bytes as rss_bytes  # noqa: E402  (CPU mode only: Linux's /proc, not gVisor's)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_CASES = {  # name: (backward, with_entropy)
    "fwd": (False, False),
    "fwd+bwd": (True, False),
    "fwd+bwd+ent": (True, True),
}


def naive_token_logprobs(x, tgt, with_entropy=False):
    """The textbook path: an (N, V) fp32 log_softmax, then gather (and entropy from it)."""
    lsm = torch.log_softmax(x.float(), -1)  # (N, V)
    logp = lsm.gather(-1, tgt[..., None]).squeeze(-1)
    return logp, (-(lsm.exp() * lsm).sum(-1) if with_entropy else None)


def kernels_token_logprobs(x, tgt, with_entropy=False):
    return token_logprobs(x, tgt, with_entropy=with_entropy)


compiled_naive_token_logprobs = torch.compile(naive_token_logprobs, dynamic=True)  # compiles on first CUDA call


def step_fn(fn, x, tgt, backward, with_entropy):
    """One call of fn on (x, tgt): forward, or forward + backward of sum(g * logp) (+ sum(g * ent)) into the
    leaf x, whose grad is dropped again (nothing stays allocated between calls)."""
    g = torch.randn(tgt.shape, device=x.device)

    def step():
        if not backward:
            with torch.no_grad():
                return fn(x, tgt, with_entropy)
        logp, ent = fn(x, tgt, with_entropy)
        out = (logp * g).sum() + ((ent * g).sum() if with_entropy else 0.0)
        out.backward()
        x.grad = None

    return step


# ---------------------------------------------------------------- CPU
def cpu_memory_worker(args) -> None:
    """Subprocess: peak RSS growth of one call (first call, inputs already allocated); prints bytes."""
    backward, with_entropy = CPU_CASES[args.case]
    x = torch.randn(args.n, args.v, dtype=DTYPES[args.dtype], requires_grad=backward)
    tgt = torch.randint(0, args.v, (args.n,))
    step = step_fn(naive_token_logprobs if args.impl == "naive" else kernels_token_logprobs, x, tgt, backward,
                   with_entropy)
    print(peak_extra(step, x.device))


def cpu_peak_extra(args, impl, case) -> int:
    cmd = [sys.executable, __file__, "--memory-worker", impl, "--case", case, "--n", str(args.n), "--v",
           str(args.v), "--dtype", args.dtype, "--threads", str(args.threads)]
    return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])


def quantiles_ms(seconds) -> tuple:
    """(median, p20, p80) in ms."""
    q = torch.tensor(seconds, dtype=torch.float64).quantile(torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return tuple(round(v * 1e3, 2) for v in q.tolist())


def peak_extra(step, device) -> int:
    """Bytes one call of step() adds at its peak over what was allocated before it: CUDA, torch's allocator; CPU,
    this process's RSS (VmHWM reset just before)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = rss_bytes("VmRSS")
    step()
    return rss_bytes("VmHWM") - before


def bench_ms(step, device, rounds: int) -> tuple:
    """(median, p20, p80) ms of step(): triton.testing.do_bench on CUDA, `rounds` timed calls after one on CPU."""
    if device.type == "cuda":
        return tuple(triton.testing.do_bench(step, quantiles=[0.5, 0.2, 0.8]))
    step()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return quantiles_ms(times)


def run_cpu(args) -> dict:
    dt = DTYPES[args.dtype]
    x = torch.randn(args.n, args.v, dtype=dt)
    tgt = torch.randint(0, args.v, (args.n,))
    rows, figures = [], {}
    for case, (backward, with_entropy) in CPU_CASES.items():
        xc = x.detach().requires_grad_(backward)
        steps = {impl: step_fn(fn, xc, tgt, backward, with_entropy)
                 for impl, fn in (("naive", naive_token_logprobs), ("torch-chunked", kernels_token_logprobs))}
        times = {impl: [] for impl in steps}
        for r in range(args.rounds + 1):  # round 0 warms up
            for impl, step in steps.items():
                t0 = time.perf_counter()
                step()
                if r:
                    times[impl].append(time.perf_counter() - t0)
        dlogits_bytes = x.numel() * x.element_size() if backward else 0
        for impl in steps:
            ms = quantiles_ms(times[impl])
            peak = cpu_peak_extra(args, impl, case)
            figures[(case, impl)] = (ms[0], peak - dlogits_bytes)
            rows.append(dict(case=case, impl=impl, ms=ms[0], p20=ms[1], p80=ms[2], peak_extra_MB=round(peak / 2**20, 1),
                             beyond_dlogits_MB=round((peak - dlogits_bytes) / 2**20, 1)))
    for row in rows:
        naive_ms, naive_mem = figures[(row["case"], "naive")]
        ms, mem = figures[(row["case"], row["impl"])]
        row["time_vs_naive"] = round(ms / naive_ms, 3)
        row["mem_vs_naive"] = round(mem / naive_mem, 3)
    print_table(rows, ["case", "impl", "ms", "p20", "p80", "peak_extra_MB", "beyond_dlogits_MB", "time_vs_naive",
                       "mem_vs_naive"])
    goal = {f"{r['case']} {k}": r[k] for r in rows if r["impl"] == "torch-chunked"
            for k in ("time_vs_naive", "mem_vs_naive")}  # the kernels' goal: mem <= 0.25 at time <= 1.2
    return dict(shapes=dict(N=args.n, V=args.v, dtype=args.dtype), goals=goal, results=rows)


# ---------------------------------------------------------------- CPU: fused lm_head -> PPO loss
def linear_ppo_step(impl: str, T: int, H: int, V: int, device="cpu", dtype=torch.float32, chunk=None):
    """Forward + backward of the PPO loss (dual clip 10, entropy bonus 0.01, token mean) from leaves h (T, H)
    and W (V, H) (fp32 on CPU; on CUDA the trainer's bf16), made on the device: impl "fused"
    (fused_linear_ppo_loss in chunks of `chunk` tokens, None: its default) or "unfused" (h @ W.T, then
    fused_logits_ppo_loss), or "fused-gspo" (objective gspo, sequences of 256 tokens, no dual clip) -> step()
    returning the loss; the gradients are dropped after each call."""
    g = torch.Generator(device).manual_seed(0)
    h = torch.randn(T, H, generator=g, device=device).to(dtype).requires_grad_(True)
    W = (torch.randn(V, H, generator=g, device=device) / H ** 0.5).to(dtype).requires_grad_(True)
    tgt = torch.randint(0, V, (T,), generator=g, device=device)
    old = -12 + 0.3 * torch.randn(T, generator=g, device=device)  # near log(1 / V): ratios around 1, some clipped
    adv = torch.randn(T, generator=g, device=device)
    w = torch.full((T,), 1 / T, device=device)

    def step() -> float:
        if impl == "fused":
            loss, *_ = fused_linear_ppo_loss(h, W, tgt, old, adv, w, dual_clip=10.0, entropy_coef=0.01, chunk=chunk)
        elif impl == "fused-gspo":
            lens = torch.tensor([min(256, T - s) for s in range(0, T, 256)], device=device)  # (S,)
            loss, *_ = fused_linear_ppo_loss(h, W, tgt, old, adv, w, entropy_coef=0.01, objective="gspo",
                                             seq_lens=lens, chunk=chunk)
        else:
            logits = h @ W.T  # (T, V)
            loss, _ = fused_logits_ppo_loss(logits[None], tgt[None], old[None], adv[None], torch.ones(1, T, device=device),
                                            dual_clip=10.0, entropy_coef=0.01)
        loss.backward()
        h.grad = W.grad = None
        return loss.item()

    return step


def linear_worker(args) -> None:
    """Subprocess: one call of linear_ppo_step (inputs already allocated); prints peak RSS growth, wall and CPU
    seconds (the CPU time of this process: robust to other jobs on a shared machine), loss."""
    step = linear_ppo_step(args.linear_worker, *args.linear_shape)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = rss_bytes("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step()
    print(json.dumps(dict(s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
                          peak=rss_bytes("VmHWM") - before, loss=loss)))


def run_fused_linear(args) -> dict:
    """Both paths at args.linear_shape, each in its own subprocess -> table rows and the issue's ratio."""
    rows, raw = [], []
    for impl in ("unfused", "fused", "fused-gspo"):
        cmd = [sys.executable, __file__, "--linear-worker", impl, "--threads", str(args.threads), "--linear-shape",
               ",".join(map(str, args.linear_shape))]
        raw.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split("\n")[-2]))
        rows.append(dict(case="linear fwd+bwd", impl=impl, s=round(raw[-1]["s"], 2), cpu_s=round(raw[-1]["cpu_s"], 2),
                         peak_extra_MB=round(raw[-1]["peak"] / 2**20, 1), loss=raw[-1]["loss"]))
    print_table(rows, ["case", "impl", "s", "cpu_s", "peak_extra_MB", "loss"])
    (unfused, fused, gspo), ratio = raw, {}  # ratios of the unrounded figures (a tiny shape rounds its seconds to 0)
    for key in ("peak", "s", "cpu_s"):
        ratio[key] = fused[key] / unfused[key] if unfused[key] else None
    return dict(shapes=dict(zip("THV", args.linear_shape), dtype="fp32"), results=rows,
                fused_linear_mem_ratio=ratio["peak"] and round(ratio["peak"], 4),  # goal <= 1/8
                fused_linear_time_ratio=ratio["s"] and round(ratio["s"], 3),
                fused_linear_cpu_time_ratio=ratio["cpu_s"] and round(ratio["cpu_s"], 3),
                gspo_vs_ppo_cpu=round(gspo["cpu_s"] / fused["cpu_s"], 3) if fused["cpu_s"] else None,
                loss_rel_diff=abs(fused["loss"] - unfused["loss"]) / abs(unfused["loss"]))


# ---------------------------------------------------------------- CUDA
H200_HBM_GBPS = 4800.0  # H200's datasheet memory bandwidth; the measured copy bandwidth is the working ceiling
PASSES = {"fwd": 1, "fwd+bwd": 3}  # passes over the logits: a forward reads; forward+backward reads, re-reads, writes


def copy_bandwidth_GBps() -> float:
    """Device-to-device copy of 4 GiB: bytes read + written per second."""
    src = torch.empty(2**30, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), quantiles=[0.5])
    return 2 * src.numel() * 4 / ms / 1e6


def ppo_step(x, tgt, fused):
    """Forward + backward of the PPO loss from logits (B, T, V): fused kernel or two kernels."""
    B, T, _ = x.shape
    old = -torch.rand(B, T, device=x.device)
    adv = torch.randn(B, device=x.device)
    mask = torch.ones(B, T, device=x.device)

    def step():
        if fused:
            loss, _ = fused_logits_ppo_loss(x, tgt, old, adv, mask, dual_clip=10.0)
        else:
            logp, _ = token_logprobs(x, tgt)
            loss, _ = ppo_loss(logp, old, adv, mask, dual_clip=10.0)
        loss.backward()
        x.grad = None

    return step


def liger_steps(x, tgt):
    """Liger-Kernel's selective log-softmax (forward) and triton_grpo_loss (forward + backward, in place), or {}."""
    try:
        from liger_kernel.ops.grpo_loss import fused_selective_log_softmax
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss
    except ImportError:
        return {}
    B, T, _ = x.shape
    ids = tgt[:, : T - 1].contiguous()  # Liger takes (B, L + 1, V) logits for L tokens
    old = -torch.rand(B, T - 1, device=x.device)
    adv = torch.randn(B, device=x.device)

    def fwd():
        with torch.no_grad():
            fused_selective_log_softmax(x, ids, 1.0)

    def fwd_bwd():
        loss, _ = triton_grpo_loss(x, old, None, ids, adv, temperature=1.0, beta=0.0, eps_high=0.28, reduce=True)
        loss.backward()
        x.grad = None

    return {("liger", "fwd"): fwd, ("liger-grpo", "fwd+bwd"): fwd_bwd}


def cuda_cases(x, tgt, with_compile: bool):
    """{(impl, mode): step} for one (T, V, dtype), in the order they run: the project's kernels, Liger, torch eager,
    and torch.compile last if with_compile (its first call compiles for tens of seconds); x (1, T, V) leaf."""
    x2, t2 = x.detach()[0].requires_grad_(True), tgt[0]  # (T, V) leaf on the same storage, (T,)
    cases = {("kernels", "fwd"): step_fn(kernels_token_logprobs, x2, t2, False, False),
             ("kernels", "fwd+bwd"): step_fn(kernels_token_logprobs, x2, t2, True, False),
             ("kernels+ent", "fwd+bwd"): step_fn(kernels_token_logprobs, x2, t2, True, True),
             ("kernels-2k-ppo", "fwd+bwd"): ppo_step(x, tgt, fused=False),
             ("kernels-fused-ppo", "fwd+bwd"): ppo_step(x, tgt, fused=True)}
    cases.update(liger_steps(x, tgt))
    naive = (("torch-eager", naive_token_logprobs),) + \
        ((("torch-compile", compiled_naive_token_logprobs),) if with_compile else ())
    for impl, fn in naive:
        cases[(impl, "fwd")] = step_fn(fn, x2, t2, False, False)
        cases[(impl, "fwd+bwd")] = step_fn(fn, x2, t2, True, False)
    return cases


def run_cuda(args) -> dict:
    bw = copy_bandwidth_GBps()
    print(f"device-to-device copy: {bw:.0f} GB/s (read + written), {100 * bw / H200_HBM_GBPS:.1f}% of 4.8 TB/s",
          flush=True)
    head = (16384, 151936, "bf16")  # the shape of the goals goes first
    grid = [head] if args.quick else [head] + [
        (T, V, d) for d in ("bf16", "fp32") for T in (4096, 16384, 32768) for V in (32000, 128256, 151936)
        if (T, V, d) != head]
    rows, t_start = [], time.time()
    for T, V, dname in grid:
        x = torch.randn(1, T, V, device="cuda", dtype=DTYPES[dname], requires_grad=True)
        tgt = torch.randint(0, V, (1, T), device="cuda")
        elt_bytes = T * V * x.element_size()
        for (impl, mode), step in cuda_cases(x, tgt, with_compile=not args.quick).items():
            row = dict(dtype=dname, T=T, V=V, impl=impl, mode=mode, GB=round(PASSES[mode] * elt_bytes / 1e9, 2))
            rows.append(row)
            if time.time() - t_start > args.budget_s:
                row["status"] = "skipped (time budget)"
                continue
            try:
                row["peak_extra_MB"] = round(peak_extra(step, x.device) / 2**20, 1)
                ms, p20, p80 = bench_ms(step, x.device, args.rounds)
            except torch.OutOfMemoryError:
                row["status"] = "oom"
                continue
            except TypeError as e:  # an installed Liger whose signature differs from the one written here
                if not impl.startswith("liger"):
                    raise
                row["status"] = f"skipped (Liger's API: {e})"[:100]
                continue
            finally:
                torch.cuda.empty_cache()
            gbps = PASSES[mode] * elt_bytes / ms / 1e6
            row.update(ms=round(ms, 3), p20=round(p20, 3), p80=round(p80, 3), GBps=round(gbps, 1),
                       pct_copy_bw=round(100 * gbps / bw, 1), pct_4p8TBps=round(100 * gbps / H200_HBM_GBPS, 1),
                       status="ok")
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)  # a killed run keeps its rows
        del x, tgt
        torch.cuda.empty_cache()
    print_table(rows, ["dtype", "T", "V", "impl", "mode", "GB", "ms", "p20", "p80", "GBps", "pct_copy_bw",
                       "pct_4p8TBps", "peak_extra_MB", "status"])
    goals = cuda_goals(rows, head, bw)
    found = "; ".join(f"{k} {v}" for k, v in goals.items())
    return dict(device=torch.cuda.get_device_name(), copy_GBps=round(bw, 1), goals=goals, found=found, results=rows)


def cuda_goals(rows, head, bw) -> dict:
    """The kernels' GPU goals at the head shape, from the measured rows (None where a case did not run). The bound
    of a forward+backward is 3 passes over the logits at the copy bandwidth: the forward keeps only per-row lse, so
    the backward reads the logits again before writing dlogits, and a row (V=151936 bf16: 297 KiB) does not fit
    on chip to save the re-read."""
    T, V, dname = head
    at = {(r["impl"], r["mode"]): r for r in rows if (r["T"], r["V"], r["dtype"]) == (T, V, dname)
          and r.get("status") == "ok"}

    def get(impl, mode, key):
        return at.get((impl, mode), {}).get(key)

    def ratio(a, b):
        return None if a is None or b is None else round(a / b, 3)

    logits_bytes = T * V * DTYPES[dname].itemsize
    three_pass_ms = 3 * logits_bytes / bw / 1e6
    peak = get("kernels", "fwd+bwd", "peak_extra_MB")
    return {
        "fwd_pct_copy_bw (>= 85)": get("kernels", "fwd", "pct_copy_bw"),
        "fwd_bwd_vs_3_pass_bound (<= 1.3)": ratio(get("kernels", "fwd+bwd", "ms"), three_pass_ms),
        "fused_ppo_vs_3_pass_bound (<= 1.3)": ratio(get("kernels-fused-ppo", "fwd+bwd", "ms"), three_pass_ms),
        "liger_grpo_over_kernels_fwd_bwd (>= 1.5)": ratio(get("liger-grpo", "fwd+bwd", "ms"),
                                                          get("kernels", "fwd+bwd", "ms")),
        "liger_grpo_over_fused_ppo (>= 1.5)": ratio(get("liger-grpo", "fwd+bwd", "ms"),
                                                    get("kernels-fused-ppo", "fwd+bwd", "ms")),
        "extra_bytes_per_token_beyond_dlogits (<= 16)": None if peak is None else
        round((peak * 2**20 - logits_bytes) / T, 1),
    }


# ---------------------------------------------------------------- fused head (CUDA and CPU)
def run_fused_head(args) -> dict:
    """The trainer's loss from hidden states, forward + backward, at T x V (bf16 on CUDA, fp32 on CPU): the fused
    head (fused_linear_ppo_loss) for each H and chunk, then the unfused path (h @ W.T, then fused_logits_ppo_loss)
    at the first H. Per case: time, TFLOP/s of its three GEMMs (6 T V H FLOPs, as many fused as unfused), peak
    extra memory (the gradients dh, dW included). Per H: the fastest chunk and the default chunk's time over it."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    T, V = args.head_T, args.head_V
    default = default_chunk(V, device.type == "cuda")
    cases = [(H, "fused", c) for H in args.head_H for c in args.head_chunks]
    cases.insert(len(args.head_chunks), (args.head_H[0], "unfused", None))  # right after the first H's chunks
    rows, t_start = [], time.time()
    for H, impl, chunk in cases:
        row = dict(T=T, V=V, H=H, impl=impl, chunk=chunk or "")
        rows.append(row)
        if time.time() - t_start > args.budget_s:
            row["status"] = "skipped (time budget)"
            continue
        step = linear_ppo_step(impl, T, H, V, device, dtype, chunk)
        try:
            row["peak_extra_MB"] = round(peak_extra(step, device) / 2**20, 1)
            ms, p20, p80 = bench_ms(step, device, args.rounds)
        except torch.OutOfMemoryError:
            row["status"] = "oom"
            continue
        finally:
            del step
            if device.type == "cuda":
                torch.cuda.empty_cache()
        row.update(ms=round(ms, 3), p20=round(p20, 3), p80=round(p80, 3),
                   TFLOPs=round(6 * T * V * H / ms / 1e9, 2), status="ok")
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)  # a killed run keeps its rows
    print_table(rows, ["T", "V", "H", "impl", "chunk", "ms", "p20", "p80", "TFLOPs", "peak_extra_MB", "status"])
    ok = [r for r in rows if r.get("status") == "ok"]
    best, best_row, default_over_best = {}, {}, {}
    for H in args.head_H:
        fused = {r["chunk"]: r for r in ok if r["H"] == H and r["impl"] == "fused"}
        if fused:
            best_row[H] = min(fused.values(), key=lambda r: r["ms"])
            best[H] = best_row[H]["chunk"]
            default_over_best[H] = round(fused[default]["ms"] / best_row[H]["ms"], 3) if default in fused else None
    at = {(r["impl"], r["chunk"]): r for r in ok if r["H"] == args.head_H[0]}
    fused0, unfused0 = at.get(("fused", default)), at.get(("unfused", ""))  # the trainer's chunk
    vs_unfused = None if fused0 is None or unfused0 is None else dict(
        time=round(fused0["ms"] / unfused0["ms"], 3),
        memory=round(fused0["peak_extra_MB"] / unfused0["peak_extra_MB"], 3))
    found = "; ".join([f"H={H}: fastest chunk {c} ({best_row[H]['TFLOPs']} TFLOP/s), the default {default} "
                       f"{default_over_best[H]}x its time" for H, c in best.items()] +
                      [f"fused (chunk {default}) / unfused at H={args.head_H[0]}: "
                       + (f"{vs_unfused['time']}x time, {vs_unfused['memory']}x memory" if vs_unfused else "not run")])
    return dict(device=torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({platform.machine()})",
                shapes=dict(T=T, V=V, H=args.head_H, chunks=args.head_chunks, dtype=str(dtype).removeprefix("torch.")),
                default_chunk=default, best_chunk=best, default_over_best=default_over_best,
                fused_over_unfused=vs_unfused, found=found, results=rows)


def print_table(rows, cols) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")).rjust(widths[c]) for c in cols))


def versions() -> dict:
    out = dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__)
    try:
        out["liger_kernel"] = version("liger-kernel")
    except PackageNotFoundError:
        out["liger_kernel"] = None
    return out


def ints(text: str) -> tuple:
    """"1,2,3" -> (1, 2, 3)"""
    return tuple(map(int, text.split(",")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="CPU: tokens")
    ap.add_argument("--v", type=int, default=32000, help="CPU: vocabulary")
    ap.add_argument("--dtype", default="fp32", choices=DTYPES, help="CPU: logits dtype")
    ap.add_argument("--rounds", type=int, default=7, help="CPU: timed rounds (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU: torch threads (1: reproducible on a shared machine; 0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="CUDA: only T=16384, V=151936, bf16")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="CUDA and fused-head: start no case after this many seconds")
    ap.add_argument("--only", choices=["logprobs", "fused-linear", "fused-head"],
                    help="CPU: only token_logprobs vs naive, or only the fused lm_head -> PPO loss case; "
                         "fused-head (CUDA or CPU): only the fused head's chunk sweep (--head-*)")
    ap.add_argument("--linear-shape", type=ints, default=(4096, 896, 151936),
                    help="CPU: T,H,V of the fused lm_head case (default: Qwen2.5-0.5B's head)")
    ap.add_argument("--head-T", type=int, default=16384, help="fused-head: tokens")
    ap.add_argument("--head-V", type=int, default=151936, help="fused-head: vocabulary")
    ap.add_argument("--head-H", type=ints, default=(896, 3584, 5120),
                    help="fused-head: hidden sizes (Qwen2.5-0.5B, 7B, 32B); the unfused path runs at the first")
    ap.add_argument("--head-chunks", type=ints, default=(128, 441, 1024), help="fused-head: tokens per chunk")
    ap.add_argument("--memory-worker", choices=["naive", "torch-chunked"], help=argparse.SUPPRESS)
    ap.add_argument("--linear-worker", choices=["unfused", "fused", "fused-gspo"], help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=CPU_CASES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_worker:
        args.impl = args.memory_worker
        return cpu_memory_worker(args)
    if args.linear_worker:
        return linear_worker(args)
    if args.only == "fused-head":
        result = run_fused_head(args)
    elif torch.cuda.is_available():
        result = run_cuda(args)
    else:
        result = dict(device=f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
        if args.only != "fused-linear":
            result.update(run_cpu(args))
        if args.only != "logprobs":
            fl = run_fused_linear(args)
            result.update(fused_linear_mem_ratio=fl.pop("fused_linear_mem_ratio"), fused_linear=fl)
        goals = {**result.get("goals", {}), "fused_linear_mem_ratio (<= 0.125)": result.get("fused_linear_mem_ratio")}
        result["found"] = "; ".join(f"{k} {v}" for k, v in goals.items())
    print(json.dumps(dict(bench="fused-head" if args.only == "fused-head" else "kernels", versions=versions(),
                          **result)))


if __name__ == "__main__":
    main()

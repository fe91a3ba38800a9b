"""A real model's shape end to end on CPU: a random-init model of a named shape (data/tiny_model.py's SHAPES, default
Qwen2.5-0.5B: 494M parameters, V = 151936, tied) through SFT, GRPO with CoPRIS and the real vLLM CPU engine on
1 process and on 2 torchrun ranks (FSDP2), a resume from a mid-run checkpoint that must continue identically, the
HF export, and one request to vLLM's OpenAI server serving that export. Per phase, per process: seconds and peak
resident memory. A table, then one JSON line last.

    python benchmarks/real_shape.py                       # every piece, in order (make real-shape)
    python benchmarks/real_shape.py --pieces build sft    # some pieces (each under 10 min here); report reads all
    python benchmarks/real_shape.py --pieces report       # the table from the pieces run so far
    python benchmarks/real_shape.py --shape 43m --out runs/real_shape/scale_43m --pieces build sft rl1 --sft_steps 1
    python benchmarks/real_shape.py --pieces scaling      # OUT and OUT/scale_*: the scaling table and its plot

Pieces (each writes OUT/<piece>/): build (arithmetic data, BPE of 1024 tokens, the random model), sft (1 process,
--sft_steps steps of --sft_rows rows), rl2 (2 ranks from the SFT export: --rl_steps GRPO steps, a checkpoint after
each), resume (2 ranks from rl2's checkpoint of step rl_steps - 1: its last step must equal rl2's, every metric but
wall-clock ones; grad_norm > 0 there shows the weights moved), rl1 (1 process, 2 steps), serve (vLLM's OpenAI server
on rl2's export, one completion). Sizes: 2 groups of 2 samples per step (one group per rank), responses up to 24
tokens, CoPRIS concurrency 3 per engine (a partial rollout is buffered every step), prompts up to 96 tokens.

How a phase is measured: the trainer runs in this script's process (worker mode, one per rank), with these trainer
functions wrapped (PHASES): each call's wall seconds and its peak RSS (VmHWM reset to the current RSS at entry
through /proc/self/clear_refs, read at exit). "process" = the process's peak over its whole life. The engine's
memory is the process's own (vLLM's CPU engine runs in-process). Figures from a 2-core machine shared with other
jobs: wall times depend on the load (the report prints the load average at each piece's start).
"""
import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from data.tiny_model import SHAPES  # noqa: E402

# trainer function -> phase (rollout: CoprisScheduler.collect). None of them calls another.
PHASES = {"build_model": "build", "start_engine": "engine_start", "push_weights_if_stale": "push",
          "score_groups": "reward", "fill_old_logprobs": "old_logprobs", "policy_update": "update",
          "sft_step": "sft_step", "save_checkpoint": "checkpoint_save", "load_checkpoint": "checkpoint_load",
          "export": "export"}
ORDER = ["build", "engine_start", "push", "rollout", "reward", "old_logprobs", "update", "sft_step",
         "checkpoint_save", "checkpoint_load", "export"]
PIECES = ["build", "sft", "rl2", "resume", "rl1", "serve"]
# The scaling table's smaller models (docs/speed.md): make demo's stand-in (its vocabulary: the BPE's 1024), then two
# of Qwen2.5's vocabulary, tied, head_dim 64, where the vocabulary is most of the parameters.
SCALING = {"demo": "demo",
           "43m": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=1024, vocab_size=151936, tie_word_embeddings=True),
           "118m": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                        intermediate_size=2816, vocab_size=151936, tie_word_embeddings=True)}


def rss(field: str = "VmRSS", pid: str = "self") -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of a process, bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class PhaseMeter:
    """Seconds, calls and peak RSS per phase of this process; `peak`: the process's peak over its life."""

    def __init__(self):
        self.phases: dict = {}
        self.peak = rss("VmHWM")

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.peak = max(self.peak, rss("VmHWM"))
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := the current RSS
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                p = self.phases.setdefault(name, {"s": 0.0, "calls": 0, "peak_rss_gb": 0.0})
                p["s"] += time.perf_counter() - t0
                p["calls"] += 1
                hwm = rss("VmHWM")
                p["peak_rss_gb"] = max(p["peak_rss_gb"], hwm / 2**30)
                self.peak = max(self.peak, hwm)
        return timed


def worker(out: Path, argv: list[str]) -> None:
    """One rank: trainer.main(argv) with PHASES wrapped; writes out/phases_rank<r>.json."""
    import launch
    import trainer
    from rollout.copris import CoprisScheduler
    meter = PhaseMeter()
    for attr, name in PHASES.items():
        setattr(trainer, attr, meter.wrap(name, getattr(trainer, attr)))
    CoprisScheduler.collect = meter.wrap("rollout", CoprisScheduler.collect)
    t0, rank = time.time(), int(os.environ.get("RANK", "0"))
    rc = trainer.main(argv)
    meter.peak = max(meter.peak, rss("VmHWM"))
    (out / f"phases_rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "rc": rc, "wall_s": time.time() - t0, "peak_rss_gb": meter.peak / 2**30,
         "phases": meter.phases}))
    launch.exit_process(rc)


def trainer_run(out: Path, nproc: int, args: list[str]) -> None:
    """The worker on nproc torchrun ranks (nproc 1: one plain process), logs in out/; fails loudly."""
    out.mkdir(parents=True, exist_ok=True)
    me = [str(Path(__file__).resolve()), "--worker", str(out), "--"]
    cmd = [sys.executable, *me, *args] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *me, *args]
    with open(out / "stdout.log", "w") as f:
        p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise SystemExit(f"real_shape: {' '.join(cmd)} failed (rc {p.returncode}); log: {out / 'stdout.log'}")


def rl_args(a, out: Path, run_dir: str, steps: int, *extra) -> list[str]:
    return ["--config", str(ROOT / "configs" / "demo.yaml"), f"--model_path={out / 'sft' / 'run' / 'export'}",
            f"--train_data={out / 'build' / 'data' / 'rl_train.jsonl'}", "--eval_data=", f"--run_dir={run_dir}",
            "--overwrite=true", f"--steps={steps}", "--batch_groups=2", "--n_samples=2", "--copris.concurrency=3",
            f"--max_response_len={a.max_response_len}", "--max_prompt_len=96", "--save_every=1",
            "--keep_checkpoints=4", "--lr=1e-5", "--token_budget=4096", "--engine.max_num_seqs=8",
            "--entropy_coef=0.05", *extra]  # the entropy bonus moves the weights every step (a random model earns
    # no reward: GRPO's advantages alone are 0, and a resume that restores nothing would look identical)


def piece_build(a, out: Path) -> dict:
    from data.arithmetic import write_demo_data
    from data.tiny_model import build_model_folder, parameter_count, shape_config
    d = out / "build"
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    write_demo_data(d / "data", n_train=400, n_sft=2000, n_eval=16, seed=0)
    rows = [json.loads(line) for line in open(d / "data" / "sft.jsonl")]
    arch = SCALING.get(a.shape, a.shape)
    build_model_folder(d / "model", [r["prompt"] + r["completion"] for r in rows], vocab_size=1024, shape=arch)
    return {"s": time.perf_counter() - t0, "peak_rss_gb": rss("VmHWM") / 2**30,
            "parameters": parameter_count(shape_config(arch, 1024)),
            "model_bytes": sum(f.stat().st_size for f in (d / "model").iterdir())}


def piece_sft(a, out: Path) -> dict:
    d = out / "sft"
    trainer_run(d, 1, ["--config", str(ROOT / "configs" / "demo_sft.yaml"), f"--model_path={out / 'build' / 'model'}",
                       f"--train_data={out / 'build' / 'data' / 'sft.jsonl'}", f"--run_dir={d / 'run'}",
                       "--overwrite=true", f"--steps={a.sft_steps}", f"--sft_batch_rows={a.sft_rows}",
                       "--warmup_steps=0", "--lr=1e-4", "--save_every=0"])
    return collect(d)


def piece_rl2(a, out: Path) -> dict:
    trainer_run(out / "rl2", 2, rl_args(a, out, str(out / "rl2" / "run"), a.rl_steps))
    return collect(out / "rl2")


def piece_resume(a, out: Path) -> dict:
    ckpt = out / "rl2" / "run" / "checkpoints" / f"step_{a.rl_steps - 1:06d}"
    trainer_run(out / "resume", 2, rl_args(a, out, str(out / "resume" / "run"), a.rl_steps, f"--resume={ckpt}"))
    from helpers import metrics
    want, got = metrics(out / "rl2" / "run")[-1], metrics(out / "resume" / "run")[-1]
    diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    return {**collect(out / "resume"), "identical": not diff, "differs": diff, "step": got["step"],
            "grad_norm": got["grad_norm"]}


def piece_rl1(a, out: Path) -> dict:
    trainer_run(out / "rl1", 1, rl_args(a, out, str(out / "rl1" / "run"), 2))
    return collect(out / "rl1")


def piece_serve(a, out: Path) -> dict:
    """vLLM's OpenAI server (module form, as docs/eval.md serves an export) on rl2's export: start-up, one
    completion, the server tree's peak RSS."""
    from helpers import openai_server, post
    export = out / "rl2" / "run" / "export"
    t0 = time.perf_counter()
    with openai_server([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(export),
                        "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4"], timeout=600) as url:
        up = time.perf_counter() - t0
        t1 = time.perf_counter()
        reply = post(f"{url}/v1/completions", {"model": str(export), "prompt": "What is 12 + 7?", "max_tokens": 16,
                                               "temperature": 0})
        request = time.perf_counter() - t1
        peak = server_peak_rss()
    return {"startup_s": up, "request_s": request, "completion_tokens": reply["usage"]["completion_tokens"],
            "text": reply["choices"][0]["text"], "peak_rss_gb": peak}


def server_peak_rss() -> float:
    """The largest VmHWM among vLLM api_server processes (the server and its engine child), GiB."""
    from helpers import descendants
    best = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if b"vllm.entrypoints.openai.api_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    best = max(best, rss("VmHWM", pid), *(rss("VmHWM", str(c)) for c in descendants(int(pid))))
    return best / 2**30


def collect(d: Path) -> dict:
    ranks = [json.loads(f.read_text()) for f in sorted(d.glob("phases_rank*.json"))]
    m = d / "run" / "metrics.jsonl"
    return {"ranks": ranks, "metrics": [json.loads(line) for line in open(m)] if m.exists() else []}


def report(out: Path, a) -> dict:
    """The table: per piece and rank, seconds (calls) and peak RSS per phase; then the JSON line."""
    from bench_kernels import print_table
    res = {p: json.loads((out / p / "result.json").read_text()) for p in PIECES if (out / p / "result.json").exists()}
    rows = []
    for piece in ("sft", "rl1", "rl2", "resume"):
        for r in res.get(piece, {}).get("ranks", []):
            row = {"piece": piece, "rank": r["rank"], "wall_s": f"{r['wall_s']:.0f}",
                   "peak_gb": f"{r['peak_rss_gb']:.2f}"}
            for ph in ORDER:
                if ph in r["phases"]:
                    p = r["phases"][ph]
                    row[ph] = f"{p['s']:.1f}/{p['calls']} {p['peak_rss_gb']:.2f}"
            rows.append(row)
    print("seconds/calls peak-RSS-GiB per phase (each phase's peak since its own start)")
    print_table(rows, ["piece", "rank", "wall_s", "peak_gb", *[p for p in ORDER if any(p in r for r in rows)]])
    for piece in ("build", "resume", "serve"):
        if piece in res:
            print(piece, {k: v for k, v in res[piece].items() if k not in ("ranks", "metrics")})
    line = {"shape": a.shape, "pieces": {p: {k: v for k, v in r.items() if k != "metrics"} for p, r in res.items()}}
    print(json.dumps(line))
    return line


STEP_PHASES = ("weight_push", "rollout", "reward", "old_logprobs", "update")


def scaling(out: Path, plot: Path) -> list[dict]:
    """The rl1 piece of OUT and of every OUT/scale_*: per model size, step 2's seconds by phase (its time/* figures;
    step 1 holds first-call allocations), the step's seconds (their sum: the checkpoint after it not included) and
    the process's peak RSS; a plot of both."""
    rows = []
    for d in [out, *sorted(out.glob("scale_*"))]:
        if not (d / "rl1" / "result.json").exists():
            continue
        rl1, build = (json.loads((d / p / "result.json").read_text()) for p in ("rl1", "build"))
        m = rl1["metrics"][2]
        row = {"parameters": build["parameters"], "step_s": sum(v for k, v in m.items() if k.startswith("time/")),
               "peak_rss_gb": rl1["ranks"][0]["peak_rss_gb"], **{p: m[f"time/{p}"] for p in STEP_PHASES}}
        rows.append(row)
    rows.sort(key=lambda r: r["parameters"])
    from bench_kernels import print_table
    print_table([{k: f"{v:.3g}" for k, v in r.items()} for r in rows], list(rows[0]))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [f"{r['parameters'] / 1e6:.3g}M" for r in rows]
    bottom = [0.0] * len(rows)
    for p in STEP_PHASES:  # each phase's share of the phases' sum
        share = [r[p] / sum(r[q] for q in STEP_PHASES) for r in rows]
        ax1.bar(x, share, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, share)]
    ax1.set(ylabel="share of the step", title="GRPO step 2 by phase (1 process)")
    ax1.legend(fontsize=7)
    n = [r["parameters"] for r in rows]
    ax2.loglog(n, [r["step_s"] for r in rows], "o-", label="step seconds")
    ax2.loglog(n, [r["peak_rss_gb"] for r in rows], "s-", label="peak RSS, GiB")
    ax2.set(xlabel="parameters", title="step time and memory")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    print(f"plot: {plot}")
    return rows


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:  # python real_shape.py --worker OUT -- TRAINER_ARGS (one rank)
        worker(Path(sys.argv[2]), sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "real_shape")
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(set(SHAPES) - {"demo"} | set(SCALING)),
                    help="a real architecture (data/tiny_model.py's SHAPES) or a smaller one of the scaling table")
    ap.add_argument("--pieces", nargs="+", default=PIECES + ["report"], choices=PIECES + ["report", "scaling"])
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "real_shape_scaling.png", help="scaling's plot")
    ap.add_argument("--sft_steps", type=int, default=3)
    ap.add_argument("--sft_rows", type=int, default=4)
    ap.add_argument("--rl_steps", type=int, default=3)
    ap.add_argument("--max_response_len", type=int, default=24)
    a = ap.parse_args()
    for piece in a.pieces:
        if piece in ("report", "scaling"):
            report(a.out, a) if piece == "report" else scaling(a.out, a.plot)
            continue
        print(f"real_shape: {piece} (load average {os.getloadavg()[0]:.2f})", flush=True)
        t0, load = time.time(), os.getloadavg()[0]
        res = globals()[f"piece_{piece}"](a, a.out)
        res.update(piece_wall_s=time.time() - t0, load_at_start=load)
        (a.out / piece).mkdir(parents=True, exist_ok=True)
        (a.out / piece / "result.json").write_text(json.dumps(res))
        print(f"real_shape: {piece} done in {res['piece_wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

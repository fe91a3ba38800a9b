"""The demo's RL stage per policy objective, several seeds each, with several optimizer passes over every rollout batch
(so most trained tokens are off-policy, where the objectives differ); a table (mean and spread across seeds) and a
plot written into docs/algorithms.md (between its objectives-demo markers) with the date and the commit.

    python benchmarks/compare_objectives.py                       # data, tiny model and SFT once, then every run
    python benchmarks/compare_objectives.py --only ppo gspo --seeds 0 1   # a subset (each finished run is kept)
    python benchmarks/compare_objectives.py --report              # table, plot and doc from the finished runs only

Every arm: configs/demo.yaml from one SFT model, COMMON keys (ppo_epochs 2 x mini_batches 2: four optimizer steps
per batch, three of them on tokens the policy that sampled them no longer is; max_response_len 96, which the demo's
longest responses reach), STEPS steps, held-out evaluation before the first and after the last step only, seeds
SEEDS (data order, sampling seeds; the SFT model is the same). Arms (ARMS): ppo; gspo and cispo with their papers'
values (the objective-aware defaults: gspo clip 3e-4 / 4e-4 and seq-mean-token-mean, cispo no lower bound); Dr.
GRPO (seq-mean-token-sum-norm, no std scaling); ppo with DAPO's overlong shaping (L_cache 32 of 96). Nothing is tuned
per arm. Everything goes under --out (runs/compare): data/, model/, sft/, ARM/seedS/ run folders, each with the date
and commit it ran at (revision.txt). Figures per run: held-out greedy, mean@4, pass@4 after the last step, the mean
clip fraction, the mean overlong penalty and truncated fraction over the steps, the median seconds per step; per arm
the mean and the sample standard deviation across seeds (training variance, evaluation sampling included). Plot:
training reward per step (mean over seeds, band: min..max) and each seed's final held-out mean@4. A table, then one
JSON line last.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS, SEEDS = 24, (0, 1, 2)
COMMON = ["--ppo_epochs=2", "--mini_batches=2", "--max_response_len=96", "--eval_every=0", f"--steps={STEPS}"]
ARMS = {
    "ppo": [],
    "gspo": ["--objective=gspo"],
    "cispo": ["--objective=cispo"],
    "dr_grpo": ["--loss_agg=seq-mean-token-sum-norm", "--scale_std=none"],
    "ppo_overlong": ["--overlong.buffer=32"],
}
BEGIN, END = "<!-- objectives-demo:begin -->", "<!-- objectives-demo:end -->"
DOC, PLOT = ROOT / "docs" / "algorithms.md", ROOT / "docs" / "objectives_demo.png"
KEYS = ("mean@4", "greedy", "pass@4", "clip_frac", "penalty", "truncated", "step_s")


def sh(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run([sys.executable, *cmd], cwd=ROOT, check=True)


def launcher(nproc: int) -> list[str]:
    return ["trainer.py", *([f"--nproc_per_node={nproc}"] if nproc > 1 else [])]


def build(out: Path, nproc: int, sft: str | None) -> Path:
    """make demo's first three commands into out (each skipped when its output exists; model and SFT when an SFT
    export is given) -> the SFT export."""
    if not (out / "data" / "eval.jsonl").is_file():
        sh("-m", "data.arithmetic", "--out", str(out / "data"), "--train", "20000", "--sft", "40000", "--eval", "1000")
    if sft:
        return Path(sft)
    if not (out / "model" / "config.json").is_file():
        sh("-m", "data.tiny_model", "--corpus", str(out / "data" / "sft.jsonl"), "--out", str(out / "model"))
    if not (out / "sft" / "export" / "config.json").is_file():
        sh(*launcher(nproc), "--config", "configs/demo_sft.yaml", f"--model_path={out / 'model'}",
           f"--train_data={out / 'data' / 'sft.jsonl'}", f"--run_dir={out / 'sft'}", "--overwrite=true")
    return out / "sft" / "export"


def revision() -> str:
    """Today's date and HEAD's short hash, with a note when tracked code (anything but docs) differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs", ":!*.md")
    return f"{datetime.date.today()} at commit {git('rev-parse', '--short', 'HEAD')}" + \
        (" with local changes" if dirty else "")


def finished(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and any(json.loads(line).get("step") == STEPS and "eval/greedy_acc" in line
                                  for line in open(path))


def figures(run_dir: Path) -> dict:
    """One run's metrics.jsonl -> its figures (module docstring) and its training-reward curve."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    evals = [r for r in rows if "eval/greedy_acc" in r]
    steps = [r for r in rows if "loss" in r]
    first, last = evals[0], evals[-1]
    return {"greedy": last["eval/greedy_acc"], "mean@4": last["eval/mean@4"], "pass@4": last["eval/pass@4"],
            "start": {k: first[f"eval/{k}"] for k in ("greedy_acc", "mean@4", "pass@4")},
            "clip_frac": statistics.mean(r["clip_frac"] for r in steps),
            "penalty": statistics.mean(r.get("overlong/penalty_mean", 0.0) for r in steps),
            "truncated": statistics.mean(r["truncated_frac"] for r in steps),
            "step_s": statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in steps),
            "curve": [(r["step"], r["reward"]) for r in steps]}


def summary(runs: list[dict]) -> dict:
    """Per figure: (mean, sample std) across seeds."""
    return {k: (statistics.mean(r[k] for r in runs), statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0)
            for k in KEYS}


def plot(results: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    for i, (arm, runs) in enumerate(results.items()):
        steps = [s for s, _ in runs[0]["curve"]]
        per_step = list(zip(*[[v for _, v in r["curve"]] for r in runs]))
        mean = [statistics.mean(v) for v in per_step]
        line, = ax.plot(steps, mean, marker="os^Dx"[i % 5], markersize=3, linestyle="-" if i % 2 == 0 else "--",
                        label=arm)
        ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=line.get_color(),
                        alpha=0.12)
        bx.scatter([i] * len(runs), [r["mean@4"] for r in runs], color=line.get_color())
        bx.errorbar([i + 0.15], [statistics.mean(r["mean@4"] for r in runs)],
                    yerr=[statistics.stdev(r["mean@4"] for r in runs) if len(runs) > 1 else 0], fmt="_",
                    color=line.get_color(), capsize=4)
    start = statistics.mean(r["start"]["mean@4"] for runs in results.values() for r in runs)
    bx.axhline(start, color="grey", linewidth=0.8, linestyle=":", label="before RL")
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (seed mean, min..max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    bx.set_xticks(range(len(results)), list(results), rotation=30, fontsize=8)
    bx.set_ylabel("held-out mean@4 after the last step")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    n = "/".join(sorted({str(len(r)) for r in results.values()}))
    fig.suptitle(f"Objectives on the demo: 2 passes x 2 mini-batches per batch, {n} seeds per arm", fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def table(results: dict) -> list[str]:
    starts = [r["start"] for runs in results.values() for r in runs]  # the SFT model, evaluated at each run's seed
    start = {k: statistics.mean(s[k] for s in starts) for k in starts[0]}

    def pm(s, k, fmt):
        return f"{s[k][0]:{fmt}} ± {s[k][1]:{fmt}}"
    lines = ["| objective (keys besides COMMON) | seeds | held-out mean@4 | greedy | pass@4 | clip fraction | "
             "overlong penalty | truncated | s / step |", "|---|---|---|---|---|---|---|---|---|",
             f"| after SFT, before RL (mean of every run's) | | {start['mean@4']:.3f} | {start['greedy_acc']:.3f} | "
             f"{start['pass@4']:.3f} | | | | |"]
    for arm, runs in results.items():
        s = summary(runs)
        keys = " ".join(f"`{a}`" for a in ARMS[arm]) or "(none)"
        lines.append(f"| {arm} ({keys}) | {len(runs)} | {pm(s, 'mean@4', '.3f')} | {pm(s, 'greedy', '.3f')} | "
                     f"{pm(s, 'pass@4', '.3f')} | {pm(s, 'clip_frac', '.2g')} | {pm(s, 'penalty', '.3f')} | "
                     f"{pm(s, 'truncated', '.3f')} | {s['step_s'][0]:.1f} |")
    return lines


def write_doc(results: dict, header: str) -> None:
    text = DOC.read_text()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:a] + "\n" + textwrap.fill(header, 116) + "\n\n" + "\n".join(table(results)) + "\n\n"
                   + f"![training reward per step and final held-out mean@4 per seed, one colour per objective]"
                     f"({PLOT.name})\n" + text[b:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "compare"))
    ap.add_argument("--sft", default=None, help="an SFT export to start from (default: build it under --out)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per run (make demo's: 2)")
    ap.add_argument("--only", nargs="*", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    ap.add_argument("--report", action="store_true", help="only write the table, plot and doc from finished runs")
    args = ap.parse_args()
    out = Path(args.out)
    sft = build(out, args.nproc, args.sft) if not args.report else out / "sft" / "export"
    for arm in args.only if not args.report else []:
        for seed in args.seeds:
            run_dir = out / arm / f"seed{seed}"
            if not finished(run_dir):
                sh(*launcher(args.nproc), "--config", "configs/demo.yaml", f"--model_path={sft}",
                   f"--train_data={out / 'data' / 'rl_train.jsonl'}", f"--eval_data={out / 'data' / 'eval.jsonl'}",
                   f"--run_dir={run_dir}", "--overwrite=true", f"--seed={seed}", *COMMON, *ARMS[arm])
                (run_dir / "revision.txt").write_text(revision())
    seeds = sorted(set(SEEDS) | set(args.seeds))  # the report: every finished run of these
    done = {arm: [out / arm / f"seed{s}" for s in seeds if finished(out / arm / f"seed{s}")] for arm in ARMS}
    results = {arm: [figures(d) for d in dirs] for arm, dirs in done.items() if dirs}
    if not results:
        print("no finished run under", out)
        return 1
    revs = sorted({(d / "revision.txt").read_text() for dirs in done.values() for d in dirs})
    n = sorted({len(r) for r in results.values()})
    header = (f"Measured {'; '.join(revs)} by `python benchmarks/compare_objectives.py` ({args.nproc} ranks per run, "
              f"{os.cpu_count()} CPU cores, {STEPS} steps per run, {'/'.join(map(str, n))} seeds per arm, COMMON: "
              f"{' '.join(COMMON)}). Figures: mean ± sample standard deviation across seeds.")
    plot(results)
    write_doc(results, header)
    print("\n".join(table(results)))
    print(json.dumps({"steps": STEPS, "common": COMMON, "cpus": os.cpu_count(), "nproc": args.nproc,
                      "arms": {arm: summary(runs) for arm, runs in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

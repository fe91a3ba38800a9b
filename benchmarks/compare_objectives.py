"""The demo's RL stage once per policy objective, from one SFT model, with the same seed, data and steps; a table
and a plot written into docs/algorithms.md (between its objectives-demo markers) with the date and the commit.

    python benchmarks/compare_objectives.py                    # data, tiny model and SFT once, then the 5 RL runs
    python benchmarks/compare_objectives.py --sft runs/demo/sft/export   # start from make demo's SFT model instead
    python benchmarks/compare_objectives.py --nproc 1          # one process per run (the demo uses 2 ranks)

Arms (ARMS): ppo (configs/demo.yaml as it is), gspo (the paper's clips 3e-4 / 4e-4 and seq-mean-token-mean), cispo
(MiniMax-M1: no lower bound on the IS weight, clip_low 1; the upper bound left at the demo's clip_high 0.28, the
paper gives no value), Dr. GRPO (seq-mean-token-sum-norm, no std scaling) and ppo with DAPO's overlong shaping
(L_cache 32 of max_response_len 160: DAPO's 4096 of 20480). Nothing is tuned per arm: whatever comes out is the
result. Everything goes under --out (runs/compare): data/, model/, sft/, one run folder per arm; an arm whose run
finished is not run again (delete its folder to rerun it); each run folder records the date and commit it ran at
(revision.txt), which the doc's header quotes. Figures: held-out greedy, mean@4 and pass@4 after the
last step (and before the first), the mean clip fraction over the steps, the median seconds per step (the step's
phases, evaluation excluded); the plot: held-out mean@4 against the step, one line per arm
(docs/objectives_demo.png). A table, then one JSON line last.
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
ARMS = {
    "ppo": [],
    "gspo": ["--objective=gspo", "--clip_low=3e-4", "--clip_high=4e-4", "--loss_agg=seq-mean-token-mean"],
    "cispo": ["--objective=cispo", "--clip_low=1.0"],
    "dr_grpo": ["--loss_agg=seq-mean-token-sum-norm", "--scale_std=none"],
    "ppo_overlong": ["--overlong.buffer=32"],
}
BEGIN, END = "<!-- objectives-demo:begin -->", "<!-- objectives-demo:end -->"
DOC, PLOT = ROOT / "docs" / "algorithms.md", ROOT / "docs" / "objectives_demo.png"


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


def finished(run_dir: Path, steps: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and any(json.loads(line).get("step") == steps and "eval/greedy_acc" in line
                                  for line in open(path))


def figures(run_dir: Path) -> dict:
    """One arm's metrics.jsonl -> its figures (module docstring) and its mean@4 curve."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    evals = [r for r in rows if "eval/greedy_acc" in r]
    steps = [r for r in rows if "loss" in r]
    first, last = evals[0], evals[-1]
    return {"greedy": last["eval/greedy_acc"], "mean@4": last["eval/mean@4"], "pass@4": last["eval/pass@4"],
            "start": {k: first[f"eval/{k}"] for k in ("greedy_acc", "mean@4", "pass@4")},
            "clip_frac": statistics.mean(r["clip_frac"] for r in steps),
            "step_s": statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in steps),
            "steps": len(steps), "curve": [(r["step"], r["eval/mean@4"]) for r in evals]}


def plot(results: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (arm, f) in enumerate(results.items()):  # markers and dashes keep lines that coincide visible
        ax.plot(*zip(*f["curve"]), marker="os^Dx"[i % 5], linestyle="-" if i % 2 == 0 else "--", label=arm)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out mean@4")
    ax.set_title("The demo's RL stage per objective (same SFT model, seed, steps)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def table(results: dict) -> list[str]:
    start = next(iter(results.values()))["start"]
    lines = ["| objective (keys) | greedy | mean@4 | pass@4 | clip fraction | s / step |", "|---|---|---|---|---|---|",
             f"| after SFT, before RL | {start['greedy_acc']:.3f} | {start['mean@4']:.3f} | {start['pass@4']:.3f} "
             f"| | |"]
    for arm, f in results.items():
        keys = " ".join(f"`{a}`" for a in ARMS[arm]) or "configs/demo.yaml"
        lines.append(f"| {arm} ({keys}) | {f['greedy']:.3f} | {f['mean@4']:.3f} | {f['pass@4']:.3f} | "
                     f"{f['clip_frac']:.3g} | {f['step_s']:.2f} |")
    return lines


def write_doc(results: dict, header: str) -> None:
    text = DOC.read_text()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:a] + "\n" + textwrap.fill(header, 116) + "\n\n" + "\n".join(table(results)) + "\n\n"
                   + f"![held-out mean@4 per step, one line per objective]({PLOT.name})\n" + text[b:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "compare"))
    ap.add_argument("--sft", default=None, help="an SFT export to start from (default: build it under --out)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per run (make demo's: 2)")
    ap.add_argument("--only", nargs="*", default=list(ARMS), choices=list(ARMS))
    args = ap.parse_args()
    out = Path(args.out)
    sft = build(out, args.nproc, args.sft)
    steps = 40  # configs/demo.yaml's
    for arm in args.only:
        if not finished(out / arm, steps):
            sh(*launcher(args.nproc), "--config", "configs/demo.yaml", f"--model_path={sft}",
               f"--train_data={out / 'data' / 'rl_train.jsonl'}", f"--eval_data={out / 'data' / 'eval.jsonl'}",
               f"--run_dir={out / arm}", "--overwrite=true", *ARMS[arm])
            (out / arm / "revision.txt").write_text(revision())
    results = {arm: figures(out / arm) for arm in args.only}
    runs = sorted({(out / arm / "revision.txt").read_text() for arm in args.only})
    header = (f"Measured {'; '.join(runs)} by `python benchmarks/compare_objectives.py` ({args.nproc} ranks per run, "
              f"{os.cpu_count()} CPU cores, {steps} steps per arm, one run each).")
    plot(results)
    write_doc(results, header)
    print("\n".join(table(results)))
    print(json.dumps({"bench": "compare_objectives", "runs": runs, "nproc": args.nproc,
                      "results": {arm: {k: v for k, v in f.items() if k != "curve"} for arm, f in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

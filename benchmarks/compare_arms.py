"""The demo's RL stage in arms of a study, several seeds each, from one SFT model; a table (mean and spread across
seeds) and a plot written into docs/algorithms.md (between the study's markers) with the date and the commit.

    python benchmarks/compare_arms.py --study objectives         # data, tiny model and SFT once, then every run
    python benchmarks/compare_arms.py --study models --sft runs/demo/sft/export   # from make demo's SFT model
    python benchmarks/compare_arms.py --study objectives --only ppo gspo --seeds 0 1   # a subset (finished runs kept)
    python benchmarks/compare_arms.py --study models --report    # table, plot and doc from the finished runs only

Studies (STUDIES), every arm configs/demo.yaml plus the study's COMMON keys and its own, nothing tuned per arm:
- objectives: ppo_epochs 2 x mini_batches 2 (four optimizer steps per batch, three of them on tokens the policy that
  sampled them no longer is, where the objectives differ), max_response_len 96 (which the demo's longest responses
  reach), 24 steps, held-out evaluation before the first and after the last step. Arms: ppo; gspo and cispo with
  their papers' values (the objective-aware defaults); Dr. GRPO (seq-mean-token-sum-norm, no std scaling); ppo with
  DAPO's overlong shaping (L_cache 32 of 96).
- models: the demo as it is (one on-policy pass, 40 steps, 16 groups of 8 samples a step), held-out evaluation every
  10 steps. Arms: grpo; gae (PPO with a critic at the critic.* defaults: the same samples, advantages from the
  critic instead of the group); gae_critic_lr (the same with the critic's lr 1e-4, 10x the default, under which the
  critic did not learn in 40 steps); grpo_rm (grpo plus a learned reward model, data/reward_model.py trained once
  under --out, standardised over each step, weight 0.5: the step's mean reward stays the task's accuracy).
Seeds SEEDS: data order and sampling seeds (the SFT model is the same). Everything goes under --out (runs/compare):
data/, model/, sft/, rm/, ARM/seedS/ run folders, each with the date and commit it ran at (revision.txt). Figures
per run: held-out greedy, mean@4, pass@4 after the last step, the mean clip fraction, the mean overlong penalty,
truncated fraction and critic explained variance over the steps, the reward model's raw mean score over the first
and the last 10 steps, the median seconds per step; per arm the mean and
the sample standard deviation across seeds (training variance, evaluation sampling included). Plot: per step the
training reward (objectives) or the held-out mean@4 (models), mean over seeds with a min..max band, and each seed's
final held-out mean@4. A table, then one JSON line last.
"""
import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
DOC = ROOT / "docs" / "algorithms.md"


@dataclasses.dataclass(frozen=True)
class Study:
    steps: int
    common: tuple  # keys every arm sets
    arms: dict  # name -> its own keys ({out}: the --out folder)
    marker: str  # docs/algorithms.md's "<!-- {marker}:begin -->" ... ":end -->"
    columns: tuple  # figures in the table (after mean@4, greedy, pass@4)
    curve: str  # the plot's per-step figure: "reward" (training) or "mean@4" (held-out)
    title: str


RM_KEYS = ("--reward.models={out}/rm", "--reward.model_weights=0.5", "--reward.models_normalize=true")
STUDIES = {
    "objectives": Study(24, ("--ppo_epochs=2", "--mini_batches=2", "--max_response_len=96", "--eval_every=0",
                             "--steps=24"),
                        {"ppo": (), "gspo": ("--objective=gspo",), "cispo": ("--objective=cispo",),
                         "dr_grpo": ("--loss_agg=seq-mean-token-sum-norm", "--scale_std=none"),
                         "ppo_overlong": ("--overlong.buffer=32",)},
                        "objectives-demo", ("clip_frac", "penalty", "truncated"), "reward",
                        "Objectives on the demo: 2 passes x 2 mini-batches per batch"),
    "models": Study(40, ("--eval_every=10", "--steps=40"),
                    {"grpo": (), "gae": ("--advantage=gae",), "gae_critic_lr": ("--advantage=gae", "--critic.lr=1e-4"),
                     "grpo_rm": RM_KEYS},
                    "models-demo", ("explained_var", "rm_score"), "mean@4",
                    "GRPO, PPO with a critic (GAE), GRPO + a reward model on the demo"),
}
KEYS = ("mean@4", "greedy", "pass@4", "clip_frac", "penalty", "truncated", "explained_var", "rm_score", "step_s")
LABELS = {"clip_frac": ("clip fraction", ".2g"), "penalty": ("overlong penalty", ".3f"),
          "truncated": ("truncated", ".3f"), "explained_var": ("critic explained variance", ".2f"),
          "rm_score": ("reward model's raw score, first -> last 10 steps", ".2f")}


def sh(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run([sys.executable, *cmd], cwd=ROOT, check=True)


def launcher(nproc: int) -> list[str]:
    return ["trainer.py", *([f"--nproc_per_node={nproc}"] if nproc > 1 else [])]


def build(out: Path, nproc: int, sft: str | None, study: Study) -> Path:
    """make demo's first three commands into out (each skipped when its output exists; model and SFT when an SFT
    export is given), and the reward model when an arm of the study uses it -> the SFT export."""
    if not (out / "data" / "eval.jsonl").is_file():
        sh("-m", "data.arithmetic", "--out", str(out / "data"), "--train", "20000", "--sft", "40000", "--eval", "1000")
    if not sft:
        if not (out / "model" / "config.json").is_file():
            sh("-m", "data.tiny_model", "--corpus", str(out / "data" / "sft.jsonl"), "--out", str(out / "model"))
        if not (out / "sft" / "export" / "config.json").is_file():
            sh(*launcher(nproc), "--config", "configs/demo_sft.yaml", f"--model_path={out / 'model'}",
               f"--train_data={out / 'data' / 'sft.jsonl'}", f"--run_dir={out / 'sft'}", "--overwrite=true")
    export = Path(sft) if sft else out / "sft" / "export"
    if any("{out}/rm" in k for keys in study.arms.values() for k in keys) and not (out / "rm" / "config.json").is_file():
        sh("-m", "data.reward_model", "--init", str(export), "--out", str(out / "rm"), "--exclude",
           str(out / "data" / "eval.jsonl"))
    return export


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


def mean_of(rows: list[dict], key: str, default: float | None = 0.0) -> float | None:
    """The mean of key over the rows that have it (default where none does: a figure the arm does not log)."""
    vals = [r[key] for r in rows if key in r]
    return statistics.mean(vals) if vals else default


def figures(run_dir: Path) -> dict:
    """One run's metrics.jsonl -> its figures (module docstring) and its per-step curves."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    evals = [r for r in rows if "eval/greedy_acc" in r]
    steps = [r for r in rows if "loss" in r]
    first, last = evals[0], evals[-1]
    return {"greedy": last["eval/greedy_acc"], "mean@4": last["eval/mean@4"], "pass@4": last["eval/pass@4"],
            "start": {k: first[f"eval/{k}"] for k in ("greedy_acc", "mean@4", "pass@4")},
            "clip_frac": mean_of(steps, "clip_frac"), "penalty": mean_of(steps, "overlong/penalty_mean"),
            "truncated": mean_of(steps, "truncated_frac"),
            "explained_var": mean_of(steps, "critic/explained_variance", None),
            "rm_score": mean_of(steps[-10:], "reward/rm", None), "rm_start": mean_of(steps[:10], "reward/rm", None),
            "step_s": statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in steps),
            "curves": {"reward": [(r["step"], r["reward"]) for r in steps],
                       "mean@4": [(r["step"], r["eval/mean@4"]) for r in evals]}}


def summary(runs: list[dict]) -> dict:
    """Per figure: (mean, sample std) across seeds; (None, None) for a figure the arm does not log."""
    return {k: (None, None) if runs[0][k] is None else
            (statistics.mean(r[k] for r in runs), statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0)
            for k in KEYS + ("rm_start",)}


def plot(results: dict, study: Study, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    for i, (arm, runs) in enumerate(results.items()):
        steps = [s for s, _ in runs[0]["curves"][study.curve]]
        per_step = list(zip(*[[v for _, v in r["curves"][study.curve]] for r in runs]))
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
    ax.set_ylabel({"reward": "training reward", "mean@4": "held-out mean@4"}[study.curve]
                  + " (seed mean, min..max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    bx.set_xticks(range(len(results)), list(results), rotation=30, fontsize=8)
    bx.set_ylabel("held-out mean@4 after the last step")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    n = "/".join(sorted({str(len(r)) for r in results.values()}))
    fig.suptitle(f"{study.title}, {n} seeds per arm", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict, study: Study) -> list[str]:
    starts = [r["start"] for runs in results.values() for r in runs]  # the SFT model, evaluated at each run's seed
    start = {k: statistics.mean(s[k] for s in starts) for k in starts[0]}

    def pm(s, k, fmt):
        if k == "rm_score" and s[k][0] is not None:
            return f"{s['rm_start'][0]:{fmt}} -> {s[k][0]:{fmt}} ± {s[k][1]:{fmt}}"
        return "" if s[k][0] is None else f"{s[k][0]:{fmt}} ± {s[k][1]:{fmt}}"
    cols = [LABELS[c][0] for c in study.columns]
    lines = ["| arm (keys besides COMMON) | seeds | held-out mean@4 | greedy | pass@4 | " + " | ".join(cols)
             + " | s / step |", "|---" * (len(cols) + 6) + "|",
             f"| after SFT, before RL (mean of every run's) | | {start['mean@4']:.3f} | {start['greedy_acc']:.3f} | "
             f"{start['pass@4']:.3f} |" + " |" * (len(cols) + 1)]
    for arm, runs in results.items():
        s = summary(runs)
        keys = " ".join(f"`{a.replace('{out}/', '')}`" for a in study.arms[arm]) or "(none)"
        lines.append(f"| {arm} ({keys}) | {len(runs)} | {pm(s, 'mean@4', '.3f')} | {pm(s, 'greedy', '.3f')} | "
                     f"{pm(s, 'pass@4', '.3f')} | " + " | ".join(pm(s, c, LABELS[c][1]) for c in study.columns)
                     + f" | {s['step_s'][0]:.1f} |")
    return lines


def write_doc(results: dict, study: Study, header: str, path: Path) -> None:
    text = DOC.read_text()
    begin, end = f"<!-- {study.marker}:begin -->", f"<!-- {study.marker}:end -->"
    a, b = text.index(begin) + len(begin), text.index(end)
    DOC.write_text(text[:a] + "\n" + textwrap.fill(header, 116) + "\n\n" + "\n".join(table(results, study))
                   + f"\n\n![{study.title}: per step and final held-out mean@4 per seed, one colour per arm]"
                     f"({path.name})\n" + text[b:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", choices=list(STUDIES), required=True)
    ap.add_argument("--out", default=str(ROOT / "runs" / "compare"))
    ap.add_argument("--sft", default=None, help="an SFT export to start from (default: build it under --out)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per run (make demo's: 2)")
    ap.add_argument("--only", nargs="*", default=None, help="arms of the study to run (default: all)")
    ap.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    ap.add_argument("--report", action="store_true", help="only write the table, plot and doc from finished runs")
    args = ap.parse_args()
    study, out = STUDIES[args.study], Path(args.out)
    arms = args.only or list(study.arms)
    if set(arms) - set(study.arms):
        ap.error(f"--only: no arm {sorted(set(arms) - set(study.arms))} in study {args.study} ({', '.join(study.arms)})")
    sft = build(out, args.nproc, args.sft, study) if not args.report else None
    for arm in arms if not args.report else []:
        for seed in args.seeds:
            run_dir = out / arm / f"seed{seed}"
            if not finished(run_dir, study.steps):
                sh(*launcher(args.nproc), "--config", "configs/demo.yaml", f"--model_path={sft}",
                   f"--train_data={out / 'data' / 'rl_train.jsonl'}", f"--eval_data={out / 'data' / 'eval.jsonl'}",
                   f"--run_dir={run_dir}", "--overwrite=true", f"--seed={seed}", *study.common,
                   *(k.format(out=out) for k in study.arms[arm]))
                (run_dir / "revision.txt").write_text(revision())
    seeds = sorted(set(SEEDS) | set(args.seeds))  # the report: every finished run of these
    done = {arm: [out / arm / f"seed{s}" for s in seeds if finished(out / arm / f"seed{s}", study.steps)]
            for arm in study.arms}
    results = {arm: [figures(d) for d in dirs] for arm, dirs in done.items() if dirs}
    if not results:
        print("no finished run under", out)
        return 1
    revs = sorted({(d / "revision.txt").read_text() for dirs in done.values() for d in dirs})
    n = sorted({len(r) for r in results.values()})
    header = (f"Measured {'; '.join(revs)} by `python benchmarks/compare_arms.py --study {args.study}` ({args.nproc} "
              f"ranks per run, {os.cpu_count()} CPU cores, {study.steps} steps per run, {'/'.join(map(str, n))} seeds "
              f"per arm, COMMON: {' '.join(study.common)}). Figures: mean ± sample standard deviation across seeds.")
    path = ROOT / "docs" / f"{study.marker.replace('-', '_')}.png"
    plot(results, study, path)
    write_doc(results, study, header, path)
    print("\n".join(table(results, study)))
    print(json.dumps({"study": args.study, "steps": study.steps, "common": study.common, "cpus": os.cpu_count(),
                      "nproc": args.nproc, "arms": {arm: summary(runs) for arm, runs in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

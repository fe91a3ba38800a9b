"""What a run tells its user: metric sinks (metrics.jsonl, tensorboard, wandb), the log file, progress bars,
the held-out table, the end-of-run summary and the plots.

    python trainer.py --plot RUN_DIR      # RUN_DIR/plot.png from RUN_DIR/metrics.jsonl (RL or SFT runs)
"""
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from config import ConfigError
from tasks import NOT_SCORED

LOG_NAME = "train.log"


class _Tee:
    """sys.stdout for rank 0: the console gets everything; the log file gets whole lines, progress-bar redraws
    (text after a carriage return) left out, but a line written above a bar (say: tqdm.write clears the bar with
    `\r<blanks>\r` first) kept."""

    def __init__(self, console, log):
        self.console, self.log, self._line = console, log, ""

    def write(self, text: str) -> int:
        self.console.write(text)
        self._line += text
        *done, self._line = self._line.split("\n")
        for line in done:
            parts = line.split("\r")
            if len(parts) == 1 or (len(parts) > 2 and not parts[-2].strip()):
                self.log.write(parts[-1] + "\n")
        self.log.flush()
        return len(text)

    def flush(self) -> None:
        self.console.flush()

    def __getattr__(self, name):
        return getattr(self.console, name)


def setup_logging(run_dir: Path, rank: int) -> None:
    """Rank 0: stdout is copied to RUN_DIR/train.log, and warnings of every library (vLLM, transformers, torch,
    python warnings) go to that file only, so the console keeps the progress bar. Other ranks print errors only."""
    logging.captureWarnings(True)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for h in list(root.handlers):
        root.removeHandler(h)
    if rank == 0:
        log = open(run_dir / LOG_NAME, "a", encoding="utf-8")
        sys.stdout = _Tee(sys.stdout, log)
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    else:
        root.addHandler(logging.NullHandler())
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # "Loading weights" bars on every model build
    quiet_library_loggers()


@contextlib.contextmanager
def native_stderr_to(path: Path):
    """For the block, file descriptor 2 appends to `path`: what native code writes to stderr directly, bypassing
    Python's logging (vLLM's C++ start-up warnings such as "NUMA binding: ..."), goes to the log, not the console.
    Restored on the way out, exceptions included, so an error raised in the block still reaches the console."""
    sys.stderr.flush()
    console = os.dup(2)
    try:
        with open(path, "a", encoding="utf-8") as log:
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(console, 2)
        os.close(console)


def quiet_library_loggers() -> None:
    """Route the loggers libraries configure for themselves (vllm, transformers) into the root logger's handlers."""
    for name in ("vllm", "transformers", "torch"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
        lg.setLevel(logging.WARNING)


def progress(rank: int, total: int, desc: str):
    """A tqdm bar on rank 0's console (disabled elsewhere)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=rank != 0, dynamic_ncols=True, file=sys.stdout)


class Timer:
    """with t("phase"): ... accumulates seconds per phase into t.s."""

    def __init__(self):
        self.s: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t0


class MemoryPeaks:
    """CUDA memory per phase of one RL step (GiB). gpu_mem/<name>_gb is torch's allocator: peak(name) its peak since
    the last call (or since the step began), now(name) what it holds now. gpu_mem/<name>_device_gb is the device's
    own use at that moment (total - free, torch.cuda.mem_get_info): everything on the GPU, vLLM's pool included.
    The two differ because vLLM allocates through its own pool and, asleep, unmaps the physical memory of tensors
    torch still counts as allocated: size engine.gpu_memory_utilization from the device figures. Off the GPU it
    records nothing."""

    def __init__(self, device):
        self.on, self.device, self.metrics = device.type == "cuda", device, {}
        if self.on:
            torch.cuda.reset_peak_memory_stats()

    def peak(self, name: str) -> None:
        self._record(name, torch.cuda.max_memory_allocated if self.on else None)

    def now(self, name: str) -> None:
        self._record(name, torch.cuda.memory_allocated if self.on else None)

    def _record(self, name: str, allocated) -> None:
        if allocated is not None:
            free, total = torch.cuda.mem_get_info(self.device)
            self.metrics[f"gpu_mem/{name}_gb"] = allocated() / 2**30
            self.metrics[f"gpu_mem/{name}_device_gb"] = (total - free) / 2**30
            torch.cuda.reset_peak_memory_stats()


def log_metrics(run_dir: Path, sinks: list, metrics: dict) -> None:
    """Append to metrics.jsonl, then tensorboard / wandb when configured (rank 0 calls this)."""
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics) + "\n")
    for sink in sinks:
        sink(metrics)


SAMPLE_COLUMNS = ("prompt", "completion", "reward", "reason", "components", "error")  # "" where a sample has none


def metric_sinks(cfg, run_dir: Path) -> list:
    """Optional loggers, imported only when configured (config.py checks at start that the packages are there):
    each is sink(metrics, samples=None): a step's metrics, or with samples (write_samples' lines) a table of them."""
    sinks = []
    if cfg.tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(run_dir / "tb"))

        def tensorboard(m: dict, samples: list | None = None) -> None:
            if samples:  # a markdown table under the Text tab, one per step
                rows = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
                rows += ["| " + " | ".join(json.dumps(str(x.get(c, "")))[1:-1].replace("|", "\\|") for c in SAMPLE_COLUMNS)
                         + " |" for x in samples]
                writer.add_text("samples", "\n".join(rows), m["step"])
            for k, v in ({} if samples else m).items():
                if isinstance(v, (int, float)) and k != "step":
                    writer.add_scalar(k, v, m["step"])
            writer.flush()
        sinks.append(tensorboard)
    if cfg.wandb_project:
        import wandb
        wb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), config=dataclasses.asdict(cfg))

        def wandb_log(m: dict, samples: list | None = None) -> None:
            if samples:
                wb.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS),
                                               data=[[str(x.get(c, "")) for c in SAMPLE_COLUMNS] for x in samples])},
                       step=m["step"])
            else:
                wb.log({k: v for k, v in m.items() if k != "step"}, step=m["step"])
        sinks.append(wandb_log)
    return sinks


LOST = ("timeout", "crash")  # the reward job was killed: over reward_timeout_s, or its worker died


def reward_failures(infos: list[dict]) -> dict:
    """One rank's failed rewards of a step, from the samples' infos: {"n": samples, "failed": samples with a failure,
    "counts": {"<who> <reason>": n}, "first": the first message}. who: the reward.funcs component (its info's
    "failed": {name: [reason, message]}), or "sample" when the whole job failed (LOST, or a scorer's error)."""
    counts, first, failed = {}, None, 0
    for info in infos:
        parts = [(who, *rm) for who, rm in info.get("failed", {}).items()] or \
            ([("sample", info["reason"], info.get("error") or info.get("detail") or info["reason"])]
             if info["reason"] in NOT_SCORED or info["reason"] in LOST else [])
        failed += bool(parts)
        for who, reason, message in parts:
            counts[f"{who} {reason}"] = counts.get(f"{who} {reason}", 0) + 1
            first = first or message
    return {"n": len(infos), "failed": failed, "counts": counts, "first": first}


def failure_line(step: int, every: list[dict]) -> str | None:
    """reward_failures of every rank -> one line, e.g. `step 3: rewards failed for 5 of 64 samples: flaky raised x4,
    sample timeout x1; first: mine.py:3 (flaky): ValueError: a third fail`; None when nothing failed."""
    failed, n, counts = sum(s["failed"] for s in every), sum(s["n"] for s in every), {}
    if not failed:
        return None
    for s in every:
        for k, v in s["counts"].items():
            counts[k] = counts.get(k, 0) + v
    first = next(s["first"] for s in every if s["first"])
    return (f"step {step}: rewards failed for {failed} of {n} samples: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) + f"; first: {first}")


def say(rank: int, line: str | None) -> None:
    """Rank 0: a line (if any) on the console above the progress bar (and in train.log, which copies stdout)."""
    if rank == 0 and line:
        from tqdm import tqdm
        tqdm.write(line, file=sys.stdout)


def write_samples(run, step: int, groups, text_of) -> None:
    """log_samples: rank 0 appends log_samples of the step's completions to run_dir/samples.jsonl, taken across its
    groups in turn (each group's first sample, then each one's second...: distinct prompts first), one line each:
    {step, prompt (as the model saw it: the templated prompt's tokens decoded), completion, reward, reason, and
    components, failed, error where the info has them} (text_of(trajectory) -> what the model wrote), and gives them
    to the tensorboard / wandb sinks when on."""
    if run.rank != 0:
        return
    turns = sorted((j, i) for i, g in enumerate(groups) for j in range(len(g.samples)))[:run.cfg.log_samples]
    done = [(groups[i].row, groups[i].samples[j], *groups[i].scores[j]) for j, i in turns]
    lines = [{"step": step, "prompt": run.tok.decode(row["prompt_ids"]), "completion": text_of(tr), "reward": score,
              "reason": info.get("reason"), **{k: info[k] for k in ("components", "failed", "error") if k in info}}
             for row, tr, score, info in done]
    with open(run.run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    for sink in run.sinks:  # tensorboard / wandb: a table of them
        sink({"step": step}, lines)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def eval_sums(rows: list[dict], scores: list[float], k: int, sources: list[str]) -> list[float]:
    """Per source, 4 sums over rows: greedy score, sampled scores, pass@k (a sample passes when it scores 1), rows.
    scores: per row, the greedy completion's then its k samples' (k + 1 per row, in row order)."""
    sums = [0.0] * (4 * len(sources))
    for i, row in enumerate(rows):
        s = scores[i * (k + 1):(i + 1) * (k + 1)]
        passed = sum(x >= 1.0 for x in s[1:])  # a sample passes when it scores 1
        base = 4 * sources.index(row["data_source"])
        for j, v in enumerate((s[0], sum(s[1:]), pass_at_k(k, passed, k), 1)):
            sums[base + j] += v
    return sums


def eval_metrics(tot: list[float], sources: list[str], k: int) -> dict:
    """eval_sums of every rank -> eval/greedy_acc, eval/mean@k (mean score of the samples), eval/pass@k, overall and
    eval/<source>/... per data_source when there are several, and eval/rows."""
    def acc(t: list[float], prefix: str) -> dict:
        n = max(t[3], 1)
        return {f"{prefix}greedy_acc": t[0] / n, f"{prefix}mean@{k}": t[1] / (n * k), f"{prefix}pass@{k}": t[2] / n}
    per = {src: tot[4 * i:4 * i + 4] for i, src in enumerate(sources)}
    out = acc([sum(v[j] for v in per.values()) for j in range(4)], "eval/")
    if len(sources) > 1:
        for src, t in per.items():
            out.update(acc(t, f"eval/{src}/"))
    out["eval/rows"] = sum(v[3] for v in per.values())
    return out


def print_eval_table(metrics: dict, k: int) -> None:
    """One line per data source (and 'all'): greedy, mean@k, pass@k."""
    print(f"{'source':24} {'greedy':>8} {f'mean@{k}':>8} {f'pass@{k}':>8}")
    keys = sorted({key[5:-len('greedy_acc') - 1] for key in metrics if key.endswith("/greedy_acc") and key != "eval/greedy_acc"})
    for name, prefix in [("all", "eval/")] + [(src, f"eval/{src}/") for src in keys]:
        print(f"{name:24} {metrics[prefix + 'greedy_acc']:8.3f} {metrics[prefix + f'mean@{k}']:8.3f} "
              f"{metrics[prefix + f'pass@{k}']:8.3f}")


def steps_done(start: int, steps: int) -> str:
    """What this process ran of steps 1..steps, having started after step `start`: "1 step (resumed after step 3:
    step 4)", "40 steps"."""
    n = steps - start
    return f"{n} step{'s' * (n != 1)}" + (f" (resumed after step {start}: step{'s' * (n != 1)} "
                                          f"{start + 1}{f'..{steps}' * (n != 1)})" if start else "")


def report_rl(run_dir: Path, k: int, seconds: float, steps: int, start: int = 0) -> None:
    """Plot, then every held-out evaluation in metrics.jsonl, one line per step: greedy, mean@k, pass@k (and the
    tool-call rate), then the steps this process ran (after `start`) and their time. The file holds this run alone:
    a used run_dir is continued from its own checkpoint (what lay after it set aside) or replaced, never appended to
    by another run."""
    plot_run(run_dir)
    evals = [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "eval/greedy_acc" in r]
    if evals:
        cols = ["greedy_acc", f"mean@{k}", f"pass@{k}"] + ["tool_call_rate"] * ("eval/tool_call_rate" in evals[0])
        print(f"held-out accuracy ({evals[0]['eval/rows']:.0f} prompts)")
        print(f"{'step':>6}" + "".join(f"{c:>16}" for c in cols))
        for r in evals:
            print(f"{r['step']:>6}" + "".join(f"{r[f'eval/{c}']:>16.3f}" for c in cols))
    print(f"{steps_done(start, steps)} in {seconds:.0f} s ({(steps - start) / max(seconds, 1e-9):.3f} steps/s); "
          f"metrics: {run_dir / 'metrics.jsonl'}  plot: {run_dir / 'plot.png'}  export: {run_dir / 'export'}")


# panels: (title, metric keys); a panel is drawn when any of its keys appears in the run
PANELS = [
    ("training reward", ["reward"]),
    ("SFT loss", ["sft_loss", "eval/val_loss"]),
    ("held-out accuracy", None),  # every top-level eval/* key
    ("response length (tokens)", ["response_len", "response_len_p90", "response_len_max"]),
    ("rollout-training mismatch", ["mismatch/kl_k3", "mismatch/log_ratio_abs_mean", "mismatch/prob_diff_max"]),
    ("tool use", ["tools/call_rate", "tools/turns_mean", "tools/obs_token_frac"]),
    ("critic (advantage: gae)", ["critic/value_loss", "critic/explained_variance", "critic/vf_clipfrac"]),
    ("seconds per step, by phase", "time/"),
]


def plot_run(run_dir: Path) -> Path:
    """metrics.jsonl -> plot.png, one panel per kind of figure the run logged (RL: reward, accuracy, length,
    mismatch, phases; SFT: loss)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (is {run_dir} a run folder?)")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    panels = []
    for title, keys in PANELS:
        if keys is None:
            keys = sorted({k for r in rows for k in r if k.startswith("eval/") and k.count("/") == 1 and k not in ("eval/rows", "eval/val_loss")})
        elif isinstance(keys, str):
            keys = sorted({k for r in rows for k in r if k.startswith(keys)})
        keys = [k for k in keys if any(k in r for r in rows)]
        if keys:
            panels.append((title, keys))
    if not panels:
        raise ConfigError(f"{path}: no metrics to plot")
    cols = min(2, len(panels))
    fig, ax = plt.subplots(math.ceil(len(panels) / cols), cols, figsize=(6 * cols, 4 * math.ceil(len(panels) / cols)),
                           squeeze=False)
    for a, (title, keys) in zip(ax.flat, panels):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            a.plot(*zip(*pts), marker="o" if len(pts) < 12 else None, label=key.removeprefix("eval/"))
        a.set_title(title), a.set_xlabel("step"), a.legend(fontsize=8)
    for a in list(ax.flat)[len(panels):]:
        a.axis("off")
    fig.tight_layout()
    out = Path(run_dir) / "plot.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

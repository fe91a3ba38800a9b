"""Ours against TRL's GRPOTrainer on the identical job, side by side: the same model folder, train rows, prompts per
step, samples per prompt, response length, learning rate (constant), loss (PPO clip 0.2 / 0.28, token mean, no KL,
one optimizer step per rollout), one process each, run one after the other. Prints each side's median step, its
phases and its peak RSS, and the ratio; one JSON line last. TRL runs in its own venv (.venv-trl, made by `make
bench-vs-trl`: trl pinned there, never in the project's requirements), this script's --side trl.

    make bench-vs-trl                                                     # the table of docs/speed.md
    python benchmarks/vs_trl.py --shape demo                              # the demo job (its SFT model)
    python benchmarks/vs_trl.py --shape 0.5b --response_len 256 --steps 3 # Qwen2.5-0.5B's shape, random init
    python benchmarks/vs_trl.py --shape demo --copris                     # ours with CoPRIS (buffer stated)

Jobs. demo: the `make demo` RL job's model and rows (bench_step.py's cache: the same generators, a 200-step SFT model),
8 prompts x 8 samples per step, responses up to --response_len (default 160) tokens, lr 3e-5. 0.5b: real_shape.py's
build (Qwen2.5-0.5B's shape with random weights, V = 151936, the arithmetic rows, a BPE of 1024 tokens), 2 prompts x
4 samples, responses of exactly --response_len tokens (a random model does not stop: both sides run to the limit), lr
1e-6. Temperature 1, no top-p / top-k, no chat template (the tiny tokenizers have none), grad clip 1, AdamW betas
(0.9, 0.999), no weight decay, no warm-up. Each side draws its prompts its own way (TRL's sampler, our
PromptSource), the same count per step. Reward: ours the rows' task scorer (math: the last boxed answer against the
row's), TRL boxed_reward here (the same check on the last \\boxed{...}). Precision: ours `precision: auto` (the
dtype it resolved to is printed); TRL bf16 exactly when ours resolved to bf16 (TrainingArguments' bf16: CPU autocast,
fp32 weights), gradient checkpointing off on both (TRL's default is on; ours is off on CPU).

Rollout modes, named in the output: ours synchronous (copris.enabled false: every request to its end, as TRL) or
with --copris CoPRIS (concurrency = the step's samples x 2: half again as many requests in flight, the unfinished
ones buffered into the next step, whose trained rows are then partly an earlier policy's); TRL: transformers'
generate on the policy (use_vllm false: TRL's vLLM modes need CUDA), synchronous.

Timing. Ours: per step the wall time between consecutive metrics.jsonl lines (elapsed_s) and the trainer's time/*
phases; TRL: per optimizer step the wall time between a callback's on_step_begin and on_step_end, and its phases by
wrapping GRPOTrainer's methods (generation, reward, the rest of scoring, the update = the step less those). The
first --warmup steps are not counted; figures are medians. Peak RSS: the largest process of each side's tree
(GNU time's maximum resident set size, reaped children included).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRL_PY = ROOT / ".venv-trl" / "bin" / "python"
OURS_PY = ROOT / ".venv" / "bin" / "python"


def job(args) -> dict:
    """The job both sides run: model folder, train rows and the step's sizes (module docstring)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.shape == "demo":
        import bench_step
        cache = argparse.Namespace(cache=str(ROOT / "runs" / "bench_step"), sft_steps=200)
        model, data = bench_step.demo_job(cache, build=True)
        return dict(model=model, data=data, groups=8, n_samples=8, lr=3e-5, max_prompt_len=96)
    out = ROOT / "runs" / "vs_trl" / "0.5b"
    if not (out / "build" / "model" / "config.json").is_file():
        import real_shape
        real_shape.piece_build(argparse.Namespace(shape="qwen2.5-0.5b"), out)
    return dict(model=str(out / "build" / "model"), data=str(out / "build" / "data" / "rl_train.jsonl"), groups=2,
                n_samples=4, lr=1e-6, max_prompt_len=96)


def timed_run(cmd: list, log: Path, env: dict) -> tuple[int, float]:
    """Runs cmd under GNU time; -> (exit code, the largest process's peak RSS in GiB)."""
    rss = log.with_suffix(".rss")
    with open(log, "w") as f:
        rc = subprocess.run(["/usr/bin/time", "-o", str(rss), "-f", "%M", *cmd], cwd=ROOT, stdout=f,
                            stderr=subprocess.STDOUT, env=env).returncode
    return rc, int(rss.read_text().split()[-1]) / 2**20


def ours(args, j: dict, out: Path) -> dict:
    run_dir = out / "ours"
    concurrency = j["groups"] * j["n_samples"] * (2 if args.copris else 1)
    cmd = [str(OURS_PY), "trainer.py", "--config", "configs/demo.yaml", f"--model_path={j['model']}",
           f"--train_data={j['data']}", "--eval_data=", f"--run_dir={run_dir}", "--overwrite=true",
           f"--batch_groups={j['groups']}", f"--n_samples={j['n_samples']}", f"--max_prompt_len={j['max_prompt_len']}",
           f"--max_response_len={args.response_len}", f"--lr={j['lr']}", "--lr_schedule=constant", "--warmup_steps=0",
           f"--steps={args.warmup + args.steps}", "--save_every=0", "--keep_checkpoints=1", "--eval_every=0",
           f"--copris.enabled={str(args.copris).lower()}", f"--copris.concurrency={concurrency}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    rc, peak = timed_run(cmd, out / "ours.log", env)
    if rc != 0:
        raise SystemExit(f"vs_trl: ours failed (exit {rc}); see {out / 'ours.log'}")
    shutil.copy(run_dir / "metrics.jsonl", out / "ours_metrics.jsonl")
    shutil.rmtree(run_dir)  # its checkpoint and export (8 GB at the 0.5B shape)
    lines = [json.loads(x) for x in open(out / "ours_metrics.jsonl") if '"time/update"' in x]
    phases = ("weight_push", "rollout", "reward", "old_logprobs", "update")
    steps = [{"step": m["elapsed_s"] - (lines[i - 1]["elapsed_s"] if i else 0.0),
              **{p: m.get(f"time/{p}", 0.0) for p in phases}} for i, m in enumerate(lines)][args.warmup:]
    return dict(mode=f"CoPRIS, {concurrency} requests in flight for {j['groups'] * j['n_samples']} trained samples "
                     f"(the rest buffered)" if args.copris else "synchronous (vLLM CPU engine, in-process)",
                peak_rss_gib=peak, steps=len(steps), precision=ours_precision(j),
                off_policy_token_frac=statistics.median(m.get("off_policy_token_frac", 0.0) for m in lines),
                **{k: statistics.median(s[k] for s in steps) for k in steps[0]})


def ours_precision(j: dict) -> str:
    """The compute dtype `precision: auto` gives the job's model on this machine (model.compute_dtype)."""
    import torch
    from transformers import AutoConfig
    sys.path.insert(0, str(ROOT))
    from model import compute_dtype
    dtype = compute_dtype("auto", torch.device("cpu"), AutoConfig.from_pretrained(j["model"]).hidden_size)
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def trl(args, j: dict, out: Path, bf16: bool) -> dict:
    if not TRL_PY.is_file():
        raise SystemExit(f"vs_trl: {TRL_PY} missing: `make bench-vs-trl` makes TRL's venv")
    spec = dict(j, response_len=args.response_len, steps=args.warmup + args.steps, bf16=bf16,
                out=str(out / "trl"), seed=0)
    rc, peak = timed_run([str(TRL_PY), __file__, "--side", "trl", "--spec", json.dumps(spec)], out / "trl.log",
                         dict(os.environ))
    if rc != 0:
        raise SystemExit(f"vs_trl: TRL failed (exit {rc}); see {out / 'trl.log'}")
    steps = json.loads((out / "trl" / "steps.json").read_text())[args.warmup:]
    return dict(mode="synchronous (transformers generate on the policy)", peak_rss_gib=peak, steps=len(steps),
                precision="bf16 autocast" if bf16 else "fp32",
                **{k: statistics.median(s[k] for s in steps) for k in steps[0]})


def boxed_reward(completions, answer, **_) -> list[float]:
    """1.0 where the last \\boxed{...} of the completion holds the row's answer, else 0.0."""
    out = []
    for text, want in zip(completions, answer):
        start = text.rfind("\\boxed{")
        end = text.find("}", start)
        out.append(float(start >= 0 and end > start and text[start + 7:end].strip() == str(want).strip()))
    return out


def trl_side(spec: dict) -> None:
    """In .venv-trl: GRPOTrainer on the spec's job, each optimizer step and its phases timed into OUT/steps.json."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    rows = [json.loads(x) for x in open(spec["data"])]
    data = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    cfg = GRPOConfig(output_dir=spec["out"], per_device_train_batch_size=spec["groups"] * spec["n_samples"],
                     gradient_accumulation_steps=1, num_generations=spec["n_samples"],
                     max_completion_length=spec["response_len"], learning_rate=spec["lr"],
                     lr_scheduler_type="constant", warmup_steps=0, max_steps=spec["steps"], beta=0.0, epsilon=0.2,
                     epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1, temperature=1.0,
                     top_p=1.0, bf16=spec["bf16"], gradient_checkpointing=False, use_cpu=True, logging_steps=1,
                     save_strategy="no", report_to="none", seed=spec["seed"], max_grad_norm=1.0, weight_decay=0.0,
                     adam_beta1=0.9, adam_beta2=0.999, log_completions=False, disable_tqdm=True)
    steps, cur = [], {}

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            cur.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            s = {"step": time.perf_counter() - cur.pop("t0"), **cur}
            s["score_other"] = s.get("generate_and_score", 0.0) - s.get("generate", 0.0) - s.get("reward", 0.0)
            s["update"] = s["step"] - s.get("generate_and_score", 0.0)
            steps.append(s)

    trainer = GRPOTrainer(model=spec["model"], reward_funcs=boxed_reward, args=cfg, train_dataset=data,
                          callbacks=[Clock()])
    for name, key in (("_generate", "generate"), ("_calculate_rewards", "reward"),
                      ("_generate_and_score_completions", "generate_and_score")):
        setattr(trainer, name, timing(getattr(trainer, name), key, cur))
    trainer.train()
    Path(spec["out"], "steps.json").write_text(json.dumps(steps))


def timing(fn, key: str, cur: dict):
    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            cur[key] = cur.get(key, 0.0) + time.perf_counter() - t0
    return timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="demo", choices=["demo", "0.5b"])
    ap.add_argument("--response_len", type=int, default=None, help="tokens (default: demo 160, 0.5b 32)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per side (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--copris", action="store_true", help="ours with CoPRIS (module docstring)")
    ap.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side == "trl":
        trl_side(json.loads(args.spec))
        return 0
    args.response_len = args.response_len or {"demo": 160, "0.5b": 32}[args.shape]
    j = job(args)
    out = ROOT / "runs" / "vs_trl" / f"{args.shape}_{args.response_len}{'_copris' if args.copris else ''}"
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    if "ours" in args.sides:
        res["ours"] = ours(args, j, out)
    if "trl" in args.sides:
        bf16 = res.get("ours", {}).get("precision") == "bf16"
        res["trl"] = trl(args, j, out, bf16)
    for side, r in res.items():
        print(f"{side:5s} {r['mode']}, {r['precision']}: median step {r['step']:.3f} s over {r['steps']} steps; "
              + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if k not in ("step", "steps", "peak_rss_gib")
                          and isinstance(v, float)) + f"; peak RSS {r['peak_rss_gib']:.2f} GiB")
    ratio = res["ours"]["step"] / res["trl"]["step"] if len(res) == 2 else None
    if ratio:
        print(f"ours / TRL: {ratio:.2f}x per step")
    print(json.dumps(dict(bench="vs_trl", shape=args.shape, response_len=args.response_len, job=j,
                          ratio=ratio, **res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

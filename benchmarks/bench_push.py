"""Weight push benchmark: the full policy (every tensor through vLLM's reload_weights) vs a LoRA policy's adapter
(a PEFT folder loaded under a new LoRARequest), on one rank, the trainer's own push functions (model.push_full,
model.push_adapter). Each arm runs in its own process (one vLLM engine per process); a push follows a real
optimizer step's worth of change (the weights are perturbed), so nothing is cached.

    python benchmarks/bench_push.py --model MODEL_DIR [--rank 8] [--reps 3]
    python benchmarks/bench_push.py --hidden 1024 --layers 8        # a random Qwen2 of that size (no hub)

A table, then one JSON line last.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def arm(model_dir: str, rank: int, reps: int) -> dict:
    """rank 0: full pushes; rank > 0: adapter pushes. -> bytes and seconds per push."""
    import torch
    import model
    from trainer import LoraConfig
    from rollout.vllm_engine import EngineConfig, RolloutEngine
    _, _, device = model.init_distributed()
    policy = model.build_model(model_dir, device, trainable=True, lora=LoraConfig(rank=rank))
    engine = RolloutEngine(EngineConfig(model_dir, max_model_len=128, lora_rank=rank), distributed=True)
    push = model.push_adapter if rank else model.push_full
    secs, nbytes = [], 0
    for _ in range(reps):
        with torch.no_grad():
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 1e-3)
        t0 = time.perf_counter()
        nbytes = push(policy, engine, torch.bfloat16 if device.type == "cuda" else None)
        secs.append(time.perf_counter() - t0)
    engine.shutdown()
    return {"bytes": nbytes, "seconds": secs, "params": sum(p.numel() for p in policy.parameters()),
            "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF model folder; default: a random Qwen2 of --hidden/--layers")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank of the adapter arm")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)  # internal: run one arm, print JSON
    a = ap.parse_args()
    if a.arm is not None:
        print("RESULT " + json.dumps(arm(a.model, a.arm, a.reps)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if not a.model:
            from data.tiny_model import build_model_folder
            a.model = str(Path(tmp) / "model")
            build_model_folder(Path(a.model), ["1 + 2 = 3. The answer is 3."] * 50, vocab_size=512, hidden=a.hidden,
                               layers=a.layers, heads=a.hidden // 64, max_len=512)
        out = {}
        for name, r in (("full", 0), (f"lora r={a.rank}", a.rank)):
            p = subprocess.run([sys.executable, __file__, "--model", a.model, "--arm", str(r), "--reps", str(a.reps)],
                               capture_output=True, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                sys.exit(f"{name} arm failed:\n{p.stderr[-3000:]}")
            out[name] = json.loads(line[-1][7:])
    print(f"{'push':<12} {'params':>12} {'pushed MB':>10} {'s per push (median)':>20}")
    for name, r in out.items():
        median = sorted(r["seconds"])[len(r["seconds"]) // 2]
        print(f"{name:<12} {r['params']:>12,} {r['bytes'] / 2**20:>10.3f} {median:>20.4f}")
    import torch
    import vllm
    print(json.dumps({"bench": "push", "device": "cuda" if torch.cuda.is_available() else platform.processor() or "cpu",
                      "torch": torch.__version__, "vllm": vllm.__version__, "model": a.model if "tmp" not in a.model
                      else f"random qwen2 hidden={a.hidden} layers={a.layers}", **out}))


if __name__ == "__main__":
    main()
    import launch
    launch.exit_process(0)  # a rank that finished must not abort in interpreter teardown (see its docstring)

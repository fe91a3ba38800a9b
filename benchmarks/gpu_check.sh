#!/usr/bin/env bash
# The GPU check: facts from a lent H200 in about 7 minutes, on the machine's own torch/transformers/triton, so that a
# rerun fits in a 15-minute slot. The steps run most important first, each under its own time limit, so a kill or a
# hang at any point leaves the facts of the steps before it:
#   step       what                                                                                expected  limit
#   preflight  gpu_probes.py preflight: CUDA and compute capability >= 9.0 (else the check stops here, exit 1);
#              device, clocks, power; versions vs requirements.txt's pins; trainer/model import
#              without vllm                                                                             20 s   30 s
#   probes     gpu_probes.py probes: the fused head's fp32 weight-gradient accumulation over 3 chunks vs fp64;
#              a random tied 0.5B-shape Qwen2 on disk through model.build_model on a one-rank NCCL group, the
#              bf16 gather, a bf16 export in several shards, reloaded by transformers: weights equal,
#              log-probs close; host and GPU memory per phase                                           15 s   45 s
#   tests      tests/test_fused_linear.py (ragged chunks at V=151936 on CUDA), tests/test_kernels.py     120 s  150 s
#   kernels    bench_kernels.py --quick: the project's kernels, then Liger (its wheel in .whl/) and torch
#              eager at T=16384, V=151936 bf16: bytes moved, GB/s, share of the copy bandwidth and of
#              4.8 TB/s                                                                                 60 s   75 s
#   head       bench_kernels.py --only fused-head: T=16384, V=151936, H 896/3584/5120 x chunk
#              128/441/1024, the unfused path at H=896: time, TFLOP/s, peak memory                      45 s   60 s
#   step       bench_step.py --synthetic --size 1.5b --max_response_len 8192 (trainer vs plain)          90 s  110 s
#   ckpt       bench_step.py --synthetic --size 0.5b --checkpoint: weights and the CUDA generator's
#              state through save / update / load                                                       45 s   60 s
#                                                                                               total  395 s  530 s
# Before preflight, the wheels carried in .whl/ (`make gpu-wheels`) whose packages the machine lacks are installed
# into a temporary folder on PYTHONPATH (the lent image has no registry). Where vLLM is installed (not on the lent
# machine), on a tiny model built here: grpo (2 GRPO steps on the vLLM GPU path: sleep, wake, push, rollout after
# evaluation) and prime (2 PRIME steps), 60 + 180 + 180 s more.
#
#   bash benchmarks/gpu_check.sh OUT_DIR                 # the GPU machine (device tool: OUT_DIR=$OUT, carry .whl)
#   bash benchmarks/gpu_check.sh --cpu-dry-run OUT_DIR   # every step at tiny sizes on CPU (checks the script)
#   GPU_CHECK_ONLY="step ckpt" bash benchmarks/gpu_check.sh OUT_DIR   # a rerun of some steps only
#
# OUT_DIR gets at most four files (the device tool brings back 8): summary.txt (one line per step: name, exit status,
# seconds, what it found: its JSON's "found", else its last output line), results.jsonl (each step's JSON line, with
# "step", "rc" and "s" added), log.txt (all output) and, on a GPU, clocks.csv (nvidia-smi every second: clocks, power,
# temperature, clock-event reasons). The exit status is 1 if any step failed or timed out. The dry run gives each step
# 5x its limit (a shared CPU).
set -uo pipefail
dry=0
if [ "${1:-}" = "--cpu-dry-run" ]; then
    dry=1
    shift
fi
out=${1:?usage: gpu_check.sh [--cpu-dry-run] OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
if [ "$dry" = 1 ]; then
    py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    scale=5
    export CUDA_VISIBLE_DEVICES=""
else
    py=${PYTHON:-python3}
    scale=1
fi
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
log=$out/log.txt
: >"$out/summary.txt"
: >"$out/results.jsonl"
: >"$log"
failed=0
tmp=$(mktemp -d -t gpu_check.XXXXXX)  # wheels' site, step outputs, the vLLM steps' tiny model and runs
smi_pid=
trap 'rm -rf "$tmp"; [ -z "$smi_pid" ] || kill "$smi_pid" 2>/dev/null' EXIT
if [ "$dry" = 0 ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used,\
clocks_event_reasons.active --format=csv -l 1 >"$out/clocks.csv" 2>&1 &
    smi_pid=$!
fi

# The wheels in .whl/ whose distributions this Python lacks, installed into a temporary folder on PYTHONPATH.
wheels=$(compgen -G ".whl/*.whl" || true)
if [ -n "$wheels" ]; then
    missing=$("$py" -c '
import sys
from importlib.metadata import PackageNotFoundError, version
for w in sys.argv[1:]:
    try:
        version(w.split("/")[-1].split("-")[0])
    except PackageNotFoundError:
        print(w)' $wheels)
    if [ -n "$missing" ]; then
        site=$tmp/site
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" $missing 2>&1 |
            tee -a "$log" && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    fi
    echo "wheels installed from .whl/: $(echo ${missing:-none, all present})" | tee -a "$out/summary.txt" "$log"
else
    echo "wheels: no .whl/ here (make gpu-wheels), nothing installed" | tee -a "$out/summary.txt" "$log"
fi

# step NAME LIMIT_S CMD...: CMD under a time limit (x scale); its output to the console and log.txt; one line in
# summary.txt and its last output line, when JSON, into results.jsonl. Returns CMD's exit status.
step() {
    local name=$1 limit=$(($2 * scale))
    shift 2
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        return 0
    fi
    echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
    local t0=$SECONDS own=$tmp/$name.out
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log" "$own"
    local rc=${PIPESTATUS[0]}
    "$py" -c '
import json, sys
name, rc, s, own, out = sys.argv[1:]
lines = [x for x in open(own, errors="replace").read().splitlines() if x.strip()]
try:
    facts = json.loads(lines[-1])
except (IndexError, ValueError):
    facts = None
why = " (timed out)" if rc in ("124", "137") else ""
found = facts.get("found", "") if isinstance(facts, dict) else (lines[-1][:300] if lines else "no output")
with open(f"{out}/summary.txt", "a") as f:
    f.write(f"{name} rc={rc}{why} {s}s: {found}\n")
if isinstance(facts, dict):
    with open(f"{out}/results.jsonl", "a") as f:
        f.write(json.dumps({"step": name, "rc": int(rc), "s": int(s), **facts}) + "\n")
' "$name" "$rc" "$((SECONDS - t0))" "$own" "$out"
    tail -n 1 "$out/summary.txt" | tee -a "$log"
    [ "$rc" = 0 ] || failed=1
    return "$rc"
}

if [ "$dry" = 1 ]; then  # tiny sizes, CPU
    preflight=(--cpu)
    probes=(--size tiny --vocab 1024 --hidden 64)
    kernel_bench=(--n 256 --v 1024 --rounds 1 --linear-shape 64,32,1024)
    head_bench=(--head-T 64 --head-V 1024 --head-H 32,48 --head-chunks 16,8192 --rounds 1)  # 8192: CPU's default
    step_bench=(--size tiny --max_prompt_len 16 --max_response_len 64 --groups 2 --n_samples 4 --steps 1 --warmup 1
                --threads 1)
    ckpt_bench=(--size tiny --max_prompt_len 16 --max_response_len 32 --groups 1 --n_samples 2 --steps 1 --warmup 0
                --threads 1)
else
    preflight=()
    probes=(--size 0.5b)
    kernel_bench=(--quick --budget-s 45)
    head_bench=(--budget-s 35)
    step_bench=(--size 1.5b --max_response_len 8192 --steps 3 --warmup 1)
    ckpt_bench=(--size 0.5b --max_response_len 1024 --groups 2 --n_samples 4 --steps 1 --warmup 0)
fi

step preflight 30 "$py" benchmarks/gpu_probes.py preflight "${preflight[@]}"
if [ $? = 2 ]; then
    echo "no CUDA GPU of compute capability >= 9.0: nothing else runs" | tee -a "$out/summary.txt"
    exit 1
fi
step probes 45 "$py" benchmarks/gpu_probes.py probes "${probes[@]}"
step tests 150 "$py" -m pytest -q -p no:cacheprovider --durations=10 tests/test_fused_linear.py tests/test_kernels.py
step kernels 75 "$py" benchmarks/bench_kernels.py "${kernel_bench[@]}"
step head 60 "$py" benchmarks/bench_kernels.py --only fused-head "${head_bench[@]}"
step step 110 "$py" benchmarks/bench_step.py --synthetic "${step_bench[@]}"
step ckpt 60 "$py" benchmarks/bench_step.py --synthetic --checkpoint "${ckpt_bench[@]}"
if "$py" -c "import vllm" >/dev/null 2>&1; then
    tiny=$tmp/tiny
    step tinydata 60 "$py" -c "
import json, sys
from pathlib import Path
from data.arithmetic import write_demo_data
from data.tiny_model import build_model_folder
out = Path(sys.argv[1])
write_demo_data(out / 'data', n_train=400, n_sft=400, n_eval=8, seed=0)
rows = [json.loads(line) for line in open(out / 'data' / 'sft.jsonl')]
build_model_folder(out / 'model', [r['prompt'] + r['completion'] for r in rows], vocab_size=400, hidden=128, layers=2)
" "$tiny"
    rl=(--model_path="$tiny/model" --train_data="$tiny/data/rl_train.jsonl" --eval_data="$tiny/data/eval.jsonl"
        --steps=2 --eval_every=1 --eval_samples=2 --n_samples=4 --batch_groups=4 --max_prompt_len=64
        --max_response_len=64 --token_budget=1024 --copris.concurrency=8 --overwrite=true)
    step grpo 180 "$py" trainer.py "${rl[@]}" --run_dir="$tiny/runs/grpo"
    step prime 180 "$py" trainer.py "${rl[@]}" --run_dir="$tiny/runs/prime" --prime.enabled=true \
        --prime.filter_low=0 --prime.filter_high=1
else
    echo "grpo prime skipped: vllm is not installed here" | tee -a "$out/summary.txt"
fi
if [ "$dry" = 0 ] && command -v nvidia-smi >/dev/null; then
    echo "clocks after: $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader 2>&1)" | tee -a "$out/summary.txt"
fi
echo "=== summary" && cat "$out/summary.txt"
exit "$failed"

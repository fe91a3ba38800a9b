#!/usr/bin/env bash
# The GPU check, about 7-9 minutes on one H200, on the machine's own torch/transformers/triton. Each step has its
# own time limit, so one hang cannot eat the budget:
#   env       versions vs requirements.txt's pins (a difference is reported, never fatal); trainer/model import
#             without pulling vllm in                                                                   45 s
#   tests     tests/test_kernels.py and tests/test_fused_linear.py (the trainer's loss path) on CUDA, large
#             shapes included; they need no sandbox, so a machine without bubblewrap runs them          180 s
#   kernels   bench_kernels.py --quick (T=16384, V=151936, bf16), against Liger when its wheel is in .whl/  90 s
#   step      bench_step.py --synthetic --size 1.5b --max_response_len 8192: the trainer's training side
#             (packed forwards, FSDP2, bf16 mixed precision, activation checkpointing) vs plain transformers 150 s
#   ckpt      bench_step.py --synthetic --size 0.5b --checkpoint: one FSDP2 bf16 update, save_checkpoint,
#             one more update, load_checkpoint: the loaded weights must equal the saved ones exactly    90 s
# Where vLLM is installed (else said in summary.txt and skipped), on a tiny model built here (tinydata, 60 s):
#   grpo      2 GRPO steps on the vLLM GPU path, evaluation before each: sleep(level 2), wake, weight push,
#             rollout after evaluation                                                                 180 s
#   prime     2 PRIME steps (the PRM, whitening all-reduced on the GPU)                                180 s
# Without vLLM the limits add up to 555 s; expected total about 6 minutes.
#
#   bash benchmarks/gpu_check.sh OUT_DIR                 # the GPU machine (device tool: OUT_DIR=$OUT, carry .whl)
#   bash benchmarks/gpu_check.sh --cpu-dry-run OUT_DIR   # every step at tiny sizes on CPU (checks the script)
#   GPU_CHECK_ONLY="step ckpt" bash benchmarks/gpu_check.sh OUT_DIR   # a rerun of some steps only
#
# Writes OUT_DIR/<step>.log for each step, OUT_DIR/<step>.json (a benchmark's JSON line, the env step's versions)
# and OUT_DIR/summary.txt (one line per step: name, exit status, seconds). Every step runs whatever happened before;
# the exit status is 1 if any step failed or timed out. The dry run gives each step 5x its limit (a shared CPU).
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
if compgen -G ".whl/liger_kernel-*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/liger_kernel-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
: >"$out/summary.txt"
failed=0

# step NAME LIMIT_S CMD...: run CMD with a time limit (x scale), output to NAME.log (and the console), its last line to
# NAME.json when that is JSON; one line in summary.txt.
step() {
    local name=$1 limit=$(($2 * scale))
    shift 2
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        return
    fi
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    tail -n 1 "$out/$name.log" | grep '^{' >"$out/$name.json" || rm -f "$out/$name.json"
    local why=$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo " (timed out)")
    echo "$name rc=$rc$why $((SECONDS - t0))s" | tee -a "$out/summary.txt"
    [ "$rc" = 0 ] || failed=1
}

if [ "$dry" = 1 ]; then  # tiny sizes, CPU
    kernel_bench=(--n 256 --v 1024 --rounds 1)
    step_bench=(--size tiny --max_prompt_len 16 --max_response_len 64 --groups 2 --n_samples 4 --steps 1 --warmup 1
                --threads 1)
    ckpt_bench=(--size tiny --max_prompt_len 16 --max_response_len 32 --groups 1 --n_samples 2 --steps 1 --warmup 0
                --threads 1)
else
    kernel_bench=(--quick --budget-s 60)
    step_bench=(--size 1.5b --max_response_len 8192 --steps 3 --warmup 1)
    ckpt_bench=(--size 0.5b --max_response_len 1024 --groups 2 --n_samples 4 --steps 1 --warmup 0)
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true; } \
    >"$out/nvidia-smi.txt"
step env 45 "$py" -c "
import json, sys
sys.path.insert(0, 'benchmarks')
import bench_step, model, trainer
v = bench_step.versions()
for name, d in v['differs_from_pins'].items():
    print(f'note: {name} {d[\"installed\"]} differs from the pinned {d[\"pinned\"]} (requirements.txt); running anyway')
assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'importing trainer/model pulled vllm in'
import torch
print('cuda available:', torch.cuda.is_available())
print(json.dumps(v))
"
step tests 180 "$py" -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fused_linear.py
step kernels 90 "$py" benchmarks/bench_kernels.py "${kernel_bench[@]}"
step step 150 "$py" benchmarks/bench_step.py --synthetic "${step_bench[@]}"
step ckpt 90 "$py" benchmarks/bench_step.py --synthetic --checkpoint "${ckpt_bench[@]}"
if "$py" -c "import vllm" >/dev/null 2>&1; then
    tiny="$out/tiny"
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
    step grpo 180 "$py" trainer.py "${rl[@]}" --run_dir="$out/runs/grpo"
    step prime 180 "$py" trainer.py "${rl[@]}" --run_dir="$out/runs/prime" --prime.enabled=true \
        --prime.filter_low=0 --prime.filter_high=1
else
    echo "grpo prime skipped: vllm is not installed here" | tee -a "$out/summary.txt"
fi
cat "$out/summary.txt"
exit "$failed"

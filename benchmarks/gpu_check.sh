#!/usr/bin/env bash
# The GPU check: facts from a lent H200 within about 5 minutes (limits 330 s in all), on the machine's own
# torch/transformers/triton, so that a failed phase can be rerun alone inside the same 15-minute lease (whose start
# takes 1 to 3 minutes). Phases run most important first, each under its own time limit, and each prints one JSON
# line (phase, rc, seconds, limit, its facts), so a kill or a hang leaves the numbers of the phases before it.
# Estimates and how they were made: docs/gpu.md, "The GPU check".
#   phase      what                                                                            estimate  limit
#   wheels     the wheels in .whl/ (`make gpu-wheels`) this Python lacks, into a temporary folder
#              on PYTHONPATH (the lent image has no registry); a failure stops the check           5 s   15 s
#   preflight  gpu_probes.py preflight: CUDA with compute capability >= 9.0, device, clocks, power,
#              versions vs requirements.txt, trainer/model import without vllm; ANY failure stops
#              the check here                                                                      12 s   30 s
#   tests      the CUDA-only tests: large shapes (V=151936) of tests/test_kernels.py and
#              tests/test_fused_linear.py, the ragged-chunk weight gradient                       35 s   60 s
#   head       bench_kernels.py --only fused-head at T=16384, V=151936, H=3584: chunk 441 (the
#              CUDA default) and 1024, the unfused path                                            20 s   40 s
#   step       bench_step.py --synthetic --size 1.5b --max_response_len 8192: 1 warm-up + 2 timed
#              trainer steps against plain transformers                                            45 s   95 s
#   ckpt       bench_step.py --synthetic --size 0.5b --checkpoint: weights and the CUDA
#              generator's state through save / update / load                                      25 s   50 s
#   probes     gpu_probes.py probes: fp32 weight-gradient accumulation over 3 chunks vs fp64; a tied
#              0.5B-shape Qwen2 built on one NCCL rank, gathered in bf16, exported, reloaded        20 s   40 s
#                                                                                          total  162 s  330 s
# Optional phases, run only when GPU_CHECK_ONLY names them: kernels (the full kernel benchmark, bench_kernels.py
# with a 240 s budget, limit 300 s), triton (gpu_probes.py triton: two shipped solutions and three corpus attacks
# through the Triton reward's checked and native runs, both verdicts printed; limit 120 s), and where vLLM is installed (not on the lent machine) tinydata, grpo and prime
# (2 GRPO / PRIME steps on the vLLM GPU path on a tiny model; 60 + 180 + 180 s; grpo and prime build tinydata).
#
#   bash benchmarks/gpu_check.sh OUT_DIR                 # the GPU machine (device tool: OUT_DIR=$OUT, carry .whl)
#   bash benchmarks/gpu_check.sh --cpu-dry-run OUT_DIR   # every phase at tiny sizes on CPU (checks the script)
#   GPU_CHECK_ONLY=step bash benchmarks/gpu_check.sh OUT_DIR         # rerun one phase (or several: "step ckpt")
#   GPU_CHECK_ONLY=kernels bash benchmarks/gpu_check.sh OUT_DIR      # the optional full kernel benchmark
#
# OUT_DIR gets at most four files (the device tool brings back 8): summary.txt (one line per phase: name, exit
# status, seconds, what it found: its JSON's "found", else its last output line), results.jsonl (one JSON line per
# phase: "phase", "rc", "s", "limit_s" and the phase's own JSON facts, if it printed any), log.txt (all output) and,
# on a GPU, clocks.csv (nvidia-smi every second). The exit status is 1 if any phase failed or timed out, 2 for an
# unknown phase name. The dry run gives each phase 5x its limit (a shared CPU).
set -uo pipefail
PHASES="preflight tests head step ckpt probes"  # the default run, in priority order (wheels always runs first)
OPTIONAL="kernels triton tinydata grpo prime"
dry=0
if [ "${1:-}" = "--cpu-dry-run" ]; then
    dry=1
    shift
fi
out=${1:?usage: gpu_check.sh [--cpu-dry-run] OUT_DIR}
only=${GPU_CHECK_ONLY:-$PHASES}
for name in $only; do
    if [[ " $PHASES $OPTIONAL " != *" $name "* ]]; then
        echo "GPU_CHECK_ONLY: unknown phase '$name' (phases: $PHASES; optional: $OPTIONAL)" >&2
        exit 2
    fi
done
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

# phase NAME LIMIT_S CMD...: CMD under a time limit (x scale) when NAME is selected; its output to the console and
# log.txt; one line in summary.txt, and one JSON line (phase, rc, s, limit_s, plus CMD's last output line when that
# is a JSON object) printed and appended to results.jsonl. Returns CMD's exit status (0 when not selected).
phase() {
    local name=$1 limit=$(($2 * scale))
    shift 2
    [ "$name" = wheels ] || [[ " $only " == *" $name "* ]] || return 0
    echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
    local t0=$SECONDS own=$tmp/$name.out
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log" "$own"
    local rc=${PIPESTATUS[0]}
    "$py" -c '
import json, sys
name, rc, s, limit, own, out = sys.argv[1:]
lines = [x for x in open(own, errors="replace").read().splitlines() if x.strip()]
try:
    facts = json.loads(lines[-1])
except (IndexError, ValueError):
    facts = None
facts = facts if isinstance(facts, dict) else {"found": lines[-1][:300] if lines else "no output"}
why = " (timed out)" if rc in ("124", "137") else ""
with open(f"{out}/summary.txt", "a") as f:
    f.write(name + f" rc={rc}{why} {s}s: " + str(facts.get("found", "")) + "\n")
line = json.dumps({"phase": name, "rc": int(rc), "s": int(s), "limit_s": int(limit), **facts})
print(line)
with open(f"{out}/results.jsonl", "a") as f:
    f.write(line + "\n")
' "$name" "$rc" "$((SECONDS - t0))" "$limit" "$own" "$out" | tee -a "$log"
    tail -n 1 "$out/summary.txt"
    [ "$rc" = 0 ] || failed=1
    return "$rc"
}

# The wheels in .whl/ whose distributions this Python lacks, installed into a temporary folder on PYTHONPATH.
install_wheels() {
    local wheels missing
    wheels=$(compgen -G ".whl/*.whl" || true)
    if [ -z "$wheels" ]; then
        echo "no .whl/ here (make gpu-wheels): nothing installed"
        return 0
    fi
    missing=$("$py" -c '
import sys
from importlib.metadata import PackageNotFoundError, version
for w in sys.argv[1:]:
    try:
        version(w.split("/")[-1].split("-")[0])
    except PackageNotFoundError:
        print(w)' $wheels) || return 1
    if [ -n "$missing" ]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" $missing || return 1
    fi
    echo "installed from .whl/: $(echo ${missing:-none, all present})"
}

if [ "$dry" = 1 ]; then  # tiny sizes, CPU
    preflight=(--cpu)
    probes=(--size tiny --vocab 1024 --hidden 64)
    kernel_bench=(--n 256 --v 1024 --rounds 1 --linear-shape 64,32,1024)
    head_bench=(--head-T 64 --head-V 1024 --head-H 48 --head-chunks 16,8192 --rounds 1)  # 8192: CPU's default
    step_bench=(--size tiny --max_prompt_len 16 --max_response_len 64 --groups 2 --n_samples 4 --steps 2 --warmup 1
                --threads 1)
    ckpt_bench=(--size tiny --max_prompt_len 16 --max_response_len 32 --groups 1 --n_samples 2 --steps 1 --warmup 0
                --threads 1)
else
    preflight=()
    probes=(--size 0.5b)
    kernel_bench=(--budget-s 240)
    head_bench=(--head-H 3584 --head-chunks 441,1024)  # 441: default_chunk(151936, cuda) (tests/test_gpu_check.py)
    step_bench=(--size 1.5b --max_response_len 8192 --steps 2 --warmup 1)
    ckpt_bench=(--size 0.5b --max_response_len 1024 --groups 2 --n_samples 4 --steps 1 --warmup 0)
fi

export -f install_wheels
export py tmp
if ! phase wheels 15 bash -c install_wheels; then
    echo "the wheels did not install: nothing else runs" | tee -a "$out/summary.txt" "$log"
    exit 1
fi
[ ! -d "$tmp/site" ] || export PYTHONPATH=$tmp/site${PYTHONPATH:+:$PYTHONPATH}
if ! phase preflight 30 "$py" benchmarks/gpu_probes.py preflight "${preflight[@]}"; then
    echo "preflight failed: nothing else runs" | tee -a "$out/summary.txt" "$log"
    exit 1
fi
phase tests 60 "$py" -m pytest -q -p no:cacheprovider --durations=5 -k "large or ragged" tests/test_kernels.py \
    tests/test_fused_linear.py
phase head 40 "$py" benchmarks/bench_kernels.py --only fused-head "${head_bench[@]}"
phase step 95 "$py" benchmarks/bench_step.py --synthetic "${step_bench[@]}"
phase ckpt 50 "$py" benchmarks/bench_step.py --synthetic --checkpoint "${ckpt_bench[@]}"
phase probes 40 "$py" benchmarks/gpu_probes.py probes "${probes[@]}"
phase kernels 300 "$py" benchmarks/bench_kernels.py "${kernel_bench[@]}"
phase triton 120 "$py" benchmarks/gpu_probes.py triton
if [[ " $only " == *" grpo "* || " $only " == *" prime "* || " $only " == *" tinydata "* ]]; then
    if "$py" -c "import vllm" >/dev/null 2>&1; then
        tiny=$tmp/tiny
        only="$only tinydata"
        phase tinydata 60 "$py" -c "
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
        phase grpo 180 "$py" trainer.py "${rl[@]}" --run_dir="$tiny/runs/grpo"
        phase prime 180 "$py" trainer.py "${rl[@]}" --run_dir="$tiny/runs/prime" --prime.enabled=true \
            --prime.filter_low=0 --prime.filter_high=1
    else
        echo "tinydata grpo prime skipped: vllm is not installed here" | tee -a "$out/summary.txt" "$log"
    fi
fi
if [ "$dry" = 0 ] && command -v nvidia-smi >/dev/null; then
    echo "clocks after: $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader 2>&1)" | tee -a "$out/summary.txt"
fi
echo "=== summary" && cat "$out/summary.txt"
exit "$failed"

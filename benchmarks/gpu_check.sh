#!/usr/bin/env bash
# One GPU check of kernels/, within 8 minutes: CUDA kernel tests, then the kernel benchmark.
#   bash benchmarks/gpu_check.sh OUT_DIR
# Writes OUT_DIR/env.txt, tests.log, bench.log and bench.json (the benchmark's JSON line).
# A Liger-Kernel wheel in .whl/ (see benchmarks/README.md) is installed into /tmp/site first, so the benchmark
# also measures Liger. Exit status: that of the tests (the benchmark runs either way).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/liger_kernel-*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/liger_kernel-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
              'cuda', torch.cuda.is_available())"
} >"$out/env.txt" 2>&1
timeout 180 "$py" -m pytest -q tests/test_kernels.py 2>&1 | tee "$out/tests.log"
status=${PIPESTATUS[0]}
timeout 270 "$py" benchmarks/bench_kernels.py --budget-s 200 2>&1 | tee "$out/bench.log"
tail -n 1 "$out/bench.log" >"$out/bench.json"
exit "$status"

"""benchmarks/bench_update.py at a tiny size on CPU: ours (two variants), plain (fp32 and bf16 autocast) and the
floor each report their seconds; the last line is the JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_json_line():
    cmd = [sys.executable, "benchmarks/bench_update.py", "--size", "tiny", "--steps", "1", "--warmup", "1",
           "--floor_reps", "1", "--set", "", "--set", "token_budget=64"]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    res = out["results"]
    assert set(res) == {"ours", "ours token_budget=64", "plain", "plain_bf16", "floor"}, sorted(res)
    for way in ("ours", "ours token_budget=64", "plain", "plain_bf16"):
        assert res[way]["update"] > 0 and res[way]["optim"] > 0 and res[way]["fwd_bwd"] > 0, res[way]
    # the same rows in one micro-batch or several: the same gradient
    assert abs(res["ours"]["grad_norm"] / res["ours token_budget=64"]["grad_norm"] - 1) < 1e-4, res
    f = res["floor"]
    assert f["gemm_fp32_s"] > 0 and f["gemm_bf16_s"] > 0 and f["bandwidth_gbs"] > 0 and f["floor_bf16_s"] > 0
    assert out["laid_tokens"] == 2 * 40 + 8 * 32 and out["trained_tokens"] == 8 * 32

"""benchmarks/bench_step.py --synthetic at a tiny size on CPU: the trainer's old-log-prob forward and update on
random-token rollouts, the plain baseline on the same rows, a checkpoint round trip; the last line is the JSON."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("step_s", "plain_step_s", "step_vs_plain", "update_vs_plain_fwd_bwd", "padding_frac", "old_logprob_share",
        "peak_rss_mib", "old_logprobs_s", "update_s", "plain_fwd_bwd_s", "plain_optim_s", "tokens_per_s")


def test_synthetic_tiny_json_line():
    cmd = [sys.executable, "benchmarks/bench_step.py", "--synthetic", "--size", "tiny", "--steps", "2", "--warmup",
           "1", "--groups", "2", "--n_samples", "2", "--max_prompt_len", "16", "--max_response_len", "32",
           "--threads", "1", "--checkpoint"]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(k in out for k in KEYS), sorted(set(KEYS) - set(out))
    assert all(out[k] > 0 for k in KEYS if k.endswith("_s")), {k: out[k] for k in KEYS if k.endswith("_s")}
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("step_vs_plain", "update_vs_plain_fwd_bwd",
                                                             "old_logprob_share", "tokens_per_s")), out
    assert 0 <= out["padding_frac"] <= 0.10, out["padding_frac"]
    # 2 groups x 2 samples trained (each group's prompt laid out once), 4 buffered rows forwarded, no DUMMY rows
    assert out["trained_tokens"] > 0 and out["forward_only_tokens"] > 0 and out["laid_tokens"] == out["computed_tokens"]
    assert 0 < out["shared_prompt_frac"] < 0.5 and out["laid_tokens"] < out["real_tokens"], out
    assert out["checkpoint"]["ok"], out["checkpoint"]
    assert out["mfu"] is None and out["shapes"]["size"] == "tiny"


def test_critical_rank_reports_the_rank_the_others_wait_for(monkeypatch):
    """At world 2 the demo job's phases are those of the rank that waited least (they add up to its step); the step,
    the plain baseline and the slowest rollout are maxima over ranks, rank_wait_max the longest wait."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_step
    slow = {"rollout": 0.5, "reward": 0.03, "rank_wait": 0.01, "update": 0.2, "step": 0.95, "plain_step": 0.8}
    fast = {"rollout": 0.3, "reward": 0.02, "rank_wait": 0.21, "update": 0.25, "step": 1.0, "plain_step": 0.9}
    monkeypatch.setattr(bench_step, "all_gather_list", lambda values: [fast, slow])
    out = bench_step.critical_rank(fast)
    assert {k: out[k] for k in ("rollout", "reward", "rank_wait", "update")} == \
        {"rollout": 0.5, "reward": 0.03, "rank_wait": 0.01, "update": 0.2}
    assert out["step"] == 1.0 and out["plain_step"] == 0.9 and out["slowest_rollout"] == 0.5
    assert out["rank_wait_max"] == 0.21

"""The RL step with objective gspo and cispo, run as a user would (tests/episode_trainer.py: trainer.py whose
episodes stop on a token the random tiny model emits often) on 1 and 2 ranks: CoPRIS partial rollout (trajectories
carried into the next step: cross-stage old log-probs), LoRA adapters with the k3 KL to the base model, a mismatch
correction (gspo: a sequence mode; cispo: token masking), a tools task (the calculator: multi-turn episodes whose
observation tokens are outside the loss) and, for gspo, two mini-batches. Each run must finish, train (finite loss,
non-zero gradient norm) and log the figures of every part."""
import json
import math
import subprocess
import sys

import pytest

from helpers import ENV, ROOT, metrics, rl_args
from test_episodes import frequent_token

pytestmark = pytest.mark.slow  # 4 runs with real engines: about 4 minutes on the 2-core machine

RUNS = {"gspo": ("--objective=gspo", "--clip_low=3e-4", "--clip_high=4e-4", "--loss_agg=seq-mean-token-mean",
                 "--correction.mode=sequence_truncate", "--mini_batches=2"),
        "cispo": ("--objective=cispo", "--clip_low=1.0", "--correction.mode=token_mask")}


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("objective", RUNS)
def test_objective_runs_with_copris_lora_correction_and_tools(tiny_tools, tmp_path, objective, nproc):
    data = tmp_path / "calc.jsonl"
    data.write_text("".join(json.dumps({**json.loads(line), "task": "math_calculator"}) + "\n"
                            for line in open(tiny_tools / "data" / "rl_train.jsonl")))
    args = rl_args(tiny_tools, tmp_path / "run", f"--train_data={data}", "--steps=2", "--save_every=0",
                   "--max_response_len=96", "--tools.tool_steps=2", "--tools.max_obs_tokens=8", "--tools.workers=1",
                   "--lora.rank=8", "--kl_coef=0.01", *RUNS[objective])
    p = subprocess.run([sys.executable, "tests/episode_trainer.py", *([f"--nproc_per_node={nproc}"] if nproc > 1
                                                                      else []), *args],
                       cwd=ROOT, env={**ENV, "CALL_END_ID": str(frequent_token(tiny_tools / "model"))},
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    steps = [m for m in metrics(tmp_path / "run") if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and 0 <= m["clip_frac"] <= 1, m
        assert m["tools/call_rate"] > 0 and 0 < m["correction/weight_mean"] and "mismatch/kl_k3" in m, m
    assert steps[1]["off_policy_token_frac"] > 0, "no token of step 2 was sampled in step 1: CoPRIS untested"

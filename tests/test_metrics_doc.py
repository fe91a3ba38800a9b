"""docs/metrics.md names every key a run writes, and only those: the trainer's own runs with a fake engine
(tests/fake_rl.py) log every kind of line (GRPO with evaluation over two data sources and a mismatch correction,
PRIME, PPO with a critic (GAE), DAPO's overlong shaping, tool episodes, SFT); the keys they log (eval/mean@2 as
eval/mean@k, a data source's keys as eval/<source>/...) and the page's are the same set, but for the CUDA-only keys
no CPU run writes."""
import json
import re

from fake_rl import run_args, train
from helpers import ROOT
from test_reward_models import rm_folder

CUDA_ONLY = {"mfu", *(f"gpu_mem/{m}_{k}" for m in ("rollout_peak", "asleep", "train_peak") for k in ("gb", "device_gb"))}
PAGE = (ROOT / "docs" / "metrics.md").read_text()


def documented() -> set[str]:
    """Backticked metric keys in the page's tables (their first column)."""
    return {k for line in PAGE.splitlines() if line.startswith("| `")
            for k in re.findall(r"`([^`]+)`", line.split(" | ")[0])}


def as_documented(key: str) -> str:
    """A logged key as the page writes it: @4 -> @k, eval/<a data source>/x -> eval/<source>/x."""
    key = re.sub(r"@\d+$", "@k", key)
    key = re.sub(r"^reward/.+$", "reward/<function>", key)
    key = re.sub(r"^eval/reward/.+$", "eval/reward/<model>", key)
    key = re.sub(r"^reward_errors/.+$", "reward_errors/<reason>", key)
    return re.sub(r"^eval/[^/]+/(greedy_acc|mean@k|pass@k)$", r"eval/<source>/\1", key)


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_page_names_exactly_the_keys_runs_write(world_of_one, tiny, tiny_tools, tmp_path):
    data = tiny / "data"
    rows = [json.loads(line) for line in open(data / "eval.jsonl")]
    two_sources = jsonl(tmp_path / "eval2.jsonl", [{**r, "data_source": "ab"[i % 2]} for i, r in enumerate(rows)])
    calc = [{**json.loads(line), "task": "math_calculator"} for line in open(data / "rl_train.jsonl")]
    tools = (f"--model_path={tiny_tools / 'model'}", f"--train_data={jsonl(tmp_path / 'calc.jsonl', calc)}",
             f"--eval_data={jsonl(tmp_path / 'calc_eval.jsonl', calc[:4])}", "--max_response_len=96",
             "--eval_samples=2", "--tools.workers=1")
    runs = {"grpo": ("--steps=2", "--eval_every=1", f"--eval_data={two_sources}", "--eval_samples=2",
                     "--correction.mode=token_mask"),
            "prime": ("--prime.enabled=true", "--prime.filter_low=0", "--prime.filter_high=1"),
            "gae": ("--advantage=gae", "--critic.warmup_steps=1", "--steps=2"),
            "overlong": ("--overlong.buffer=4", "--reward.funcs=rewards/example_reward_funcs.py:boxed_answer,"
                         "rewards/example_reward_funcs.py:digit_share", "--reward.weights=1,0.5"),
            "tools": tools,
            "sft": ("--mode=sft", f"--train_data={data / 'sft.jsonl'}", "--sft_epochs=0", "--sft_batch_rows=16",
                    "--max_response_len=96", f"--eval_data={data / 'sft.jsonl'}")}
    flaky = tmp_path / "flaky.py"     # fails for about half the samples: reward_errors/reward_error
    flaky.write_text("def odd_fails(row, completion):\n    if len(completion) % 2:\n        raise ValueError('odd')\n"
                     "    return 0.0\n")
    runs["overlong"] = (*runs["overlong"][:1], runs["overlong"][1] + f",{flaky}:odd_fails", "--reward.weights=1,0.5,1",
                        f"--reward.models={rm_folder(tiny, tmp_path / 'rm')}",  # reward/rm, reward_models/truncated
                        f"--eval_data={data / 'eval.jsonl'}", "--eval_samples=2")  # eval/reward/rm
    logged = {}
    for name, extra in runs.items():
        for line in train(run_args(tiny, tmp_path / name, *extra)).metrics:
            logged.update(dict.fromkeys(line, name))
    for needle in ("eval/a/pass@2", "correction/weight_mean", "prm_acc", "overlong/penalty_mean", "tools/call_rate",
                   "eval/tool_call_rate", "critic/vf_clipfrac", "sft_loss", "data/eval_rows", "reward/digit_share",
                   "eval/val_loss", "reward_errors/reward_error", "reward/rm", "reward_models/truncated",
                   "eval/reward/rm"):
        assert needle in logged, f"the runs no longer log {needle}: the check would miss its kind"
    missing = {k: run for k, run in logged.items() if as_documented(k) not in documented()}
    assert not missing, f"keys runs write that docs/metrics.md does not name: {missing}"
    stale = documented() - {as_documented(k) for k in logged} - CUDA_ONLY
    assert not stale, f"keys docs/metrics.md names that no run writes: {stale}"

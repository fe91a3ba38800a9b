"""Data formats (jsonl, parquet, verl's layout, chat templates), eval mode, plots, optional loggers."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError
from data.rows import load_rows, tokenize_prompts
from trainer import load_config

ROOT = Path(__file__).resolve().parents[1]
VERL_ROW = {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "What is 2+3?"}],
            "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": 0}}


def test_parquet_round_trip_and_verl_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    ours = [{"prompt": "Ann has 3 apples. Answer:", "answer": "3", "task": "math"}]
    pq.write_table(pa.Table.from_pylist(ours), tmp_path / "ours.parquet")
    rows = load_rows(str(tmp_path / "ours.parquet"), "rl")
    assert rows == [{**ours[0], "data_source": "default", "_where": f"{tmp_path / 'ours.parquet'}:1"}]
    pq.write_table(pa.Table.from_pylist([VERL_ROW]), tmp_path / "verl.parquet")
    (row,) = load_rows(str(tmp_path / "verl.parquet"), "rl")
    assert row["answer"] == "5" and row["task"] == "math" and row["data_source"] == "gsm8k"
    assert row["prompt"] == VERL_ROW["prompt"]


@pytest.mark.parametrize("bad, needle", [
    ({**VERL_ROW, "reward_model": {"style": "rule"}}, "verl.jsonl:2: reward_model must be an object with 'ground_truth'"),
    ({**VERL_ROW, "prompt": [{"role": "user"}]}, "verl.jsonl:2: 'prompt' must be a non-empty string or a list"),
    ({"prompt": "", "answer": "1"}, "verl.jsonl:2: 'prompt' must be a non-empty string"),
    ([1, 2], "verl.jsonl:2: expected an object, got list"),
])
def test_malformed_rows_stop_with_file_and_row(tmp_path, bad, needle):
    f = tmp_path / "verl.jsonl"
    f.write_text(json.dumps(VERL_ROW) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ConfigError) as e:
        load_rows(str(f), "rl")
    assert needle in str(e.value)


def test_chat_template_applied_when_the_model_has_one(tiny, tmp_path):
    from transformers import AutoTokenizer
    model = tmp_path / "chat_model"
    shutil.copytree(tiny / "model", model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = AutoTokenizer.from_pretrained(model)
    rows = [{"prompt": "2+3?", "answer": "5"}, {"prompt": VERL_ROW["prompt"], "answer": "5"}]
    kept, skipped = tokenize_prompts(rows, tok, 512, chat_template=True)
    assert [tok.decode(r["prompt_ids"]) for r in kept] == ["<user>2+3?<assistant>", "<user>What is 2+3?<assistant>"]
    plain, _ = tokenize_prompts(rows, tok, 512, chat_template=False)
    assert tok.decode(plain[0]["prompt_ids"]) == "2+3?"
    assert tokenize_prompts(rows, tok, 3, chat_template=True) == ([], 2)  # over-length prompts skipped, counted


@pytest.mark.slow
def test_eval_mode_table_per_source_and_samples(tiny, tmp_path):
    rows = [json.loads(l) for l in open(tiny / "data" / "eval.jsonl")][:6]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({**r, "data_source": "a" if i % 2 else "b"}) + "\n" for i, r in enumerate(rows)))
    p = subprocess.run([sys.executable, "trainer.py", "--mode=eval", f"--model_path={tiny / 'model'}",
                        f"--eval_data={data}", f"--run_dir={tmp_path / 'ev'}", "--eval_samples=2",
                        "--max_prompt_len=128", "--max_response_len=16", "--token_budget=256"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "source" in p.stdout and "mean@2" in p.stdout and "\nall " in p.stdout and "\na " in p.stdout
    summary = json.loads((tmp_path / "ev" / "eval_summary.json").read_text())
    assert summary["eval/rows"] == 6 and "eval/a/pass@2" in summary and "eval/b/greedy_acc" in summary
    samples = [json.loads(l) for l in open(tmp_path / "ev" / "eval_samples.jsonl")]
    assert len(samples) == 6 * 3 and {s["kind"] for s in samples} == {"greedy", "sample"}
    assert all(s["score"] == 0.0 for s in samples)  # a random-init model never boxes the right answer


@pytest.mark.parametrize("kind", ["rl", pytest.param("sft", marks=pytest.mark.slow),
                                  pytest.param("empty", marks=pytest.mark.slow)])
def test_plot_command(tmp_path, kind):
    """RL runs (with a mismatch panel), SFT runs (their step-0 data line and losses) and a folder with nothing to
    plot: a picture, or exit 2 with the reason, never a traceback."""
    rows = {"rl": [{"step": 0, "eval/greedy_acc": 0.1, "eval/mean@4": 0.1, "eval/pass@4": 0.2, "eval/rows": 5},
                   {"step": 1, "reward": 0.2, "response_len": 10, "response_len_p90": 14, "response_len_max": 20,
                    "mismatch/kl_k3": 1e-9, "time/rollout": 1.0, "time/update": 0.5}],
            "sft": [{"step": 0, "data/train_rows": 10, "data/train_skipped": 0}] +
                   [{"step": i, "sft_loss": 3.0 / i, "grad_norm": 1.0, "lr": 1e-3, "elapsed_s": i} for i in (1, 2, 3)],
            "empty": []}[kind]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run([sys.executable, "trainer.py", "--plot", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    if kind == "empty":
        assert p.returncode == 2 and "no metrics to plot" in p.stderr
    else:
        assert p.returncode == 0 and (tmp_path / "plot.png").stat().st_size > 10_000


def test_eval_mode_needs_eval_data_and_loggers_are_optional(tiny, monkeypatch):
    base = [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]
    with pytest.raises(ConfigError, match="mode: eval needs eval_data"):
        load_config([*base, "--mode=eval"])
    import importlib.util
    import sys
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "tensorboard" else real(name, *a))
    assert load_config([*base, "--tensorboard=true"]).tensorboard is True  # installed (here: said to be) is found,
    assert "tensorboard" not in sys.modules  # not imported: only a run that logs imports it (missing: test_day_one.py)

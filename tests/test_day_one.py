"""What a TRL or verl user reaches for on day one, besides reward.funcs (tests/test_user_rewards.py): the learning-rate
schedules, top_k / min_p in every sampled request (and refused where the IS ratio would be wrong), missing logging
packages refused at start, the tensorboard sink's samples table, and SFT's validation loss on eval_data, checked
against transformers' own loss of the export."""
import importlib.util
import json
import math
import subprocess
import types

import pytest
import torch

from config import ConfigError
from helpers import ENV, ROOT, trainer_cmd
from trainer import Config, load_config, make_optimizer


def lrs(schedule: str, mode: str = "rl", steps: int = 6, warmup: int = 2) -> list[float]:
    """The learning rate of each of `steps` optimizer steps (peak 1.0)."""
    cfg = Config(mode=mode, lr=1.0, warmup_steps=warmup, lr_schedule=schedule)
    optim, sched = make_optimizer(cfg, torch.nn.Linear(2, 2), steps)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        optim.step()
        sched.step()
    return out


def test_lr_schedules():
    """Warm-up (1/2, 2/2), then with f = (step - warmup) / (steps - 1 - warmup) over the 4 steps after it: constant,
    linear 1 - 0.9 f, cosine 0.1 + 0.45 (1 + cos(pi f)), the last step at 10%; auto is constant for RL and cosine
    for SFT."""
    f = [0, 1 / 3, 2 / 3, 1]
    assert lrs("constant") == pytest.approx([0.5, 1, 1, 1, 1, 1])
    assert lrs("linear") == pytest.approx([0.5, 1] + [1 - 0.9 * x for x in f])
    assert lrs("cosine") == pytest.approx([0.5, 1] + [0.1 + 0.45 * (1 + math.cos(math.pi * x)) for x in f])
    assert lrs("auto") == lrs("constant") and lrs("auto", "sft") == lrs("cosine", "sft")


def test_top_k_and_min_p_reach_every_sampled_request():
    from rollout.vllm_engine import RolloutEngine
    engine = RolloutEngine.__new__(RolloutEngine)  # sampling() reads only these two
    engine.top_k, engine.min_p = 5, 0.1
    sampled, greedy = engine.sampling(8, 1.0, 0.9, 3, [0]), engine.sampling(8, 0.0, 1.0, None, [0])
    assert (sampled.top_k, sampled.min_p, sampled.top_p) == (5, 0.1, 0.9)
    assert (greedy.top_k, greedy.min_p) in ((-1, 0.0), (0, 0.0))  # greedy: no filter


@pytest.fixture
def base(tiny):
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]


@pytest.mark.parametrize("args, needle", [
    (["--top_k=5", "--correction.mode=token_truncate"], "so do top_k and min_p"),
    (["--min_p=0.05", "--copris.old_logprob_source=rollout"], "so do top_k and min_p"),
    (["--top_k=0"], "top_k must be -1 (off) or >= 1"),
    (["--min_p=1"], "min_p in [0, 1)"),
    (["--log_samples=-1"], "log_samples must be >= 0"),
    (["--chat_template_file=nothere.jinja"], "chat_template_file 'nothere.jinja': no such file"),
    (["--reward.weights=1,x"], "reward.weights: expected float, got 'x'"),
    (["--lr_schedule=step"], "lr_schedule: must be one of ['auto', 'constant', 'linear', 'cosine']"),
])
def test_refused_settings(base, args, needle):
    with pytest.raises(ConfigError) as e:
        load_config([*base, *args])
    assert needle in str(e.value)


def test_top_k_and_min_p_pass_with_trainer_old_logprobs(base):
    cfg = load_config([*base, "--top_k=20", "--min_p=0.05"])
    assert (cfg.top_k, cfg.min_p) == (20, 0.05)


@pytest.mark.parametrize("flag, package", [("--tensorboard=true", "tensorboard"), ("--wandb_project=x", "wandb")])
def test_a_missing_logging_package_is_refused_at_start(base, monkeypatch, flag, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(ConfigError, match=f"needs the {package} package, which is not installed"):
        load_config([*base, flag])


def test_tensorboard_sink_writes_scalars_and_the_samples_table(tmp_path, monkeypatch):
    """report.metric_sinks' tensorboard sink against a recording SummaryWriter (the package is optional)."""
    import report
    calls = []

    class Writer:
        def __init__(self, logdir):
            calls.append(("dir", logdir))

        def add_scalar(self, k, v, step):
            calls.append(("scalar", k, v, step))

        def add_text(self, k, text, step):
            calls.append(("text", k, text, step))

        def flush(self):
            pass
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=Writer))
    (sink,) = report.metric_sinks(Config(tensorboard=True), tmp_path)
    sink({"step": 3, "reward": 0.5, "note": "x"})
    sink({"step": 3}, [{"prompt": "a|b", "completion": "c\nd", "reward": 1.0, "reason": "ok", "step": 3},
                       {"prompt": "p", "completion": "c", "reward": 0.5, "reason": "reward_error", "step": 3,
                        "components": {"f": 0.5}, "error": "mine.py:3 (g): ValueError: x"}])
    assert calls[1] == ("scalar", "reward", 0.5, 3) and len(calls) == 3
    kind, key, table, step = calls[2]
    assert (kind, key, step) == ("text", "samples", 3)
    assert table.splitlines() == ["| prompt | completion | reward | reason | components | error |", "|" + "---|" * 6,
                                  "| a\\|b | c\\nd | 1.0 | ok |  |  |",
                                  "| p | c | 0.5 | reward_error | {'f': 0.5} | mine.py:3 (g): ValueError: x |"]


def test_sft_validation_loss_is_the_exports_loss(tiny, tmp_path):
    """SFT on 2 ranks with eval_data: eval/val_loss before the first step, every eval_every steps and after the last
    one; the last value is the mean completion-token loss transformers computes for the exported model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    rows = [json.loads(line) for line in open(tiny / "data" / "sft.jsonl")]
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[:37]))
    run_dir = tmp_path / "sft"
    p = subprocess.run(trainer_cmd(2, "--mode=sft", f"--model_path={tiny / 'model'}",
                                   f"--train_data={tiny / 'data' / 'sft.jsonl'}", f"--eval_data={held}",
                                   f"--run_dir={run_dir}", "--sft_epochs=0", "--steps=5", "--sft_batch_rows=16",
                                   "--lr=3e-3", "--eval_every=2", "--max_prompt_len=64", "--max_response_len=96",
                                   "--token_budget=2048", "--save_every=0"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    logged = {m["step"]: m["eval/val_loss"] for m in map(json.loads, open(run_dir / "metrics.jsonl"))
              if "eval/val_loss" in m}
    assert sorted(logged) == [0, 2, 4, 5] and logged[5] < logged[0], logged
    tok = AutoTokenizer.from_pretrained(run_dir / "export")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "export", dtype=torch.float32)
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows[:37]:
            prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            completion = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            if len(prompt) > 64 or len(completion) > 96:
                continue
            logp = model(torch.tensor([prompt + completion])).logits[0].log_softmax(-1)
            targets = torch.tensor(completion)
            total -= float(logp[len(prompt) - 1:-1].gather(1, targets[:, None]).sum())
            n += len(completion)
    assert logged[5] == pytest.approx(total / n, rel=1e-4), (logged[5], total / n)


def test_chat_template_file_reaches_prompts_and_the_export(tiny, tmp_path):
    """chat_template_file replaces the tokenizer's template for the prompts (SFT and RL render them with
    data.rows.prompt_text) and is the export's (serving_tokenizer keeps it); without one, the export gets the plain
    template and the training tokenizer is left as it was."""
    from data.rows import PLAIN_TEMPLATE, load_tokenizer, prompt_text, serving_tokenizer
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>")
    tok = load_tokenizer(str(tiny / "model"), str(template))
    row = {"prompt": "Ann has 3 apples.", "_where": "x:1"}
    assert prompt_text(row, tok, True) == "<|user|>Ann has 3 apples.<|assistant|>"
    assert serving_tokenizer(tok, True) is tok
    plain = load_tokenizer(str(tiny / "model"))
    assert plain.chat_template is None and prompt_text(row, plain, True) == "Ann has 3 apples."
    served = serving_tokenizer(plain, True)
    assert served.chat_template == PLAIN_TEMPLATE.read_text() and plain.chat_template is None
    assert served.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                      add_generation_prompt=True) == row["prompt"]
    assert serving_tokenizer(tok, False).chat_template == PLAIN_TEMPLATE.read_text()  # chat_template: false trains plain

"""The arithmetic generator (correct answers, long-tailed lengths) and the tokenizer round trip."""
import json
import re

from data.arithmetic import make_split
from rewards.math import math_reward


def test_answers_are_correct_and_lengths_long_tailed():
    rows = make_split(3000, seed=1)
    for r in rows[:500]:
        steps = re.findall(r"(\d+)([+-])(\d+)=(\d+)\.", r["solution"])
        for a, op, b, c in steps:
            assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(c)
        assert steps[-1][3] == r["answer"]
        assert math_reward(r["solution"], r["answer"])[0] == 1.0
    n_steps = sorted(r["solution"].count("=") for r in rows)
    median, p99 = n_steps[len(rows) // 2], n_steps[int(len(rows) * 0.99)]
    assert median <= 2 and p99 >= 4 * median  # most are short, a few are long


def test_tokenizer_round_trip(tiny):
    """AutoTokenizer loads Qwen2Tokenizer with our BPE: same ids as the raw file, lossless decoding.
    (The engine's tokenizer is compared in test_engine.py.)"""
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer
    tok = AutoTokenizer.from_pretrained(tiny / "model")
    raw = Tokenizer.from_file(str(tiny / "model" / "tokenizer.json"))
    assert type(tok).__name__ == "Qwen2Tokenizer"
    for line in open(tiny / "data" / "eval.jsonl"):
        r = json.loads(line)
        text = r["prompt"] + r["solution"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(text).ids
        assert tok.decode(ids) == text  # spaces survive


def test_demo_sft_demonstrations_carry_the_planned_slips(tmp_path):
    """The SFT set is careless on purpose (about 40% box the result off by one); RL data is clean."""
    from data.arithmetic import write_demo_data
    write_demo_data(tmp_path, n_train=300, n_sft=1000, n_eval=100)
    sft = [json.loads(l) for l in open(tmp_path / "sft.jsonl")]
    right = [math_reward(r["completion"], r["answer"])[0] for r in sft]
    assert 0.5 < sum(right) / len(right) < 0.7
    for r in sft:  # a slip changes only the boxed answer, by one
        lines = re.findall(r"=(\d+)\.", r["completion"])
        boxed = int(re.search(r"\\boxed\{(\d+)\}", r["completion"]).group(1))
        assert int(lines[-1]) == int(r["answer"]) and abs(boxed - int(r["answer"])) <= 1
    for name in ("rl_train.jsonl", "eval.jsonl"):
        rows = [json.loads(l) for l in open(tmp_path / name)]
        assert all(math_reward(r["solution"], r["answer"])[0] == 1.0 for r in rows)
    held_out = {r["prompt"] for r in map(json.loads, open(tmp_path / "eval.jsonl"))}
    assert not held_out & {r["prompt"] for r in sft}

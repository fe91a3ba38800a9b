"""Train a small reward model for the demo task: a learned reward beside the verifier (reward.models; the models
comparison in docs/algorithms.md, benchmarks/compare_arms.py --study models).

A Qwen2ForSequenceClassification (num_labels 1) whose body starts from a causal LM folder (the demo's SFT export)
and whose scalar head is fresh, trained on pairs of one problem's worked solutions with the Bradley-Terry loss

    loss = -log sigmoid(s(prompt + chosen) - s(prompt + rejected)),   mean over the batch's pairs

chosen: the correct solution; rejected: the same with the off-by-one final answer the demo's SFT model learned
(data.arithmetic.with_slip). It learns to check the box against the last line, not the sums: a partial verifier, as
learned reward models are (a variant that also rejected chains with one wrong sum carried to the box stayed at
chance on those, 0.54, after 300 steps at lr 1e-4). 300 steps take under 3 minutes on 2 cores; held-out pairwise
accuracy 0.983 (2026-12-06, from make demo's SFT model). Problems come from the generator at their own seeds
(data.arithmetic.make_split, p_stop 0.35 as the RL prompts); a prompt of an --exclude file (the held-out set: short
problems repeat across seeds) is skipped. The input is prompt + response with no template, as rewards/models.py
formats it for a tokenizer without a chat template. Prints the held-out pairwise accuracy; the folder (config,
weights, tokenizer) goes to --out.

    python -m data.reward_model --init runs/demo/sft/export --out runs/demo/rm --exclude runs/demo/data/eval.jsonl
"""
import argparse
import json
import random
from pathlib import Path

import torch

from data.arithmetic import make_split, with_slip


def pairs(n: int, seed: int, exclude: set) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) of n problems less those whose prompt is in exclude."""
    rng = random.Random(seed + 1)
    return [(r["prompt"], r["solution"], with_slip(r, rng)["solution"])
            for r in make_split(n, seed, p_stop=0.35) if r["prompt"] not in exclude]


def scores(model, tok, texts: list[str]) -> torch.Tensor:
    """(n,) scores: one right-padded forward, read at the last non-pad token (the pooling rewards/models.py uses)."""
    batch = tok(texts, padding=True, padding_side="right", return_tensors="pt")
    return model(**batch).logits[:, 0]


def train(init: Path, out: Path, steps: int, batch: int, lr: float, seed: int, n_train: int, n_eval: int,
          exclude: set = frozenset()) -> float:
    """Bradley-Terry training from init's body -> held-out pairwise accuracy."""
    from tqdm import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(init)
    logging.set_verbosity_error()  # its load report lists the fresh head and the unused lm_head: both expected
    model = AutoModelForSequenceClassification.from_pretrained(init, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tok.pad_token_id
    held_out = pairs(n_eval, 200 + seed, exclude)
    train_pairs = pairs(n_train, 100 + seed, exclude | {p for p, _, _ in held_out})
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order = random.Random(seed)
    bar = tqdm(range(steps), desc="reward model", mininterval=2)
    for _ in bar:
        b = order.sample(train_pairs, batch)
        s = scores(model, tok, [p + c for p, c, _ in b] + [p + r for p, _, r in b])
        loss = -torch.nn.functional.logsigmoid(s[:batch] - s[batch:]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(held_out), 256):
            b = held_out[i:i + 256]
            s = scores(model, tok, [p + c for p, c, _ in b] + [p + r for p, _, r in b])
            right += int((s[:len(b)] > s[len(b):]).sum())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.chat_template = None  # it was trained on prompt + response as text: rewards/models.py formats it so only
    tok.save_pretrained(out)  # when the folder has no template (init's, for serving, would reformat the input)
    return right / len(held_out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", type=Path, required=True, help="a causal-LM folder: the body (and tokenizer) to start from")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="pairs per step")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=20000, help="training pairs")
    ap.add_argument("--eval", type=int, default=1000, help="held-out pairs")
    ap.add_argument("--exclude", type=Path, nargs="*", default=[], help="jsonl files whose prompts are not trained on")
    a = ap.parse_args()
    skip = {json.loads(line)["prompt"] for f in a.exclude for line in open(f) if line.strip()}
    acc = train(a.init, a.out, a.steps, a.batch, a.lr, a.seed, a.train, a.eval, skip)
    print(f"reward model -> {a.out} ({len(skip)} prompts excluded): held-out pairwise accuracy {acc:.3f}")

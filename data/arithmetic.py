"""Arithmetic word problems whose worked solutions have a long-tailed length.

A problem is a start amount followed by k gain/loss events; the worked solution writes one
line per event ("12+7=19.") and ends with "\\boxed{answer}". k is drawn from a geometric
distribution (P(k) ~ p (1-p)^(k-1), capped), so most solutions are one or two lines and a few
need many: the long tail that partial rollout exists for.

Rows: {"id", "task": "math", "prompt", "answer", "solution"}. The SFT view adds "completion".

The tools variant (make demo-tools): products of two 2-digit numbers plus a small count, which the tiny model copies
well but cannot multiply. A share of the SFT demonstrations calls the calculator (a completion given as turns: the
call, the tool's answer, the boxed result); the rest write a (correct) product from memory. RL rows come twice: task
math_calculator (episodes with the calculator) and task math (the same problems, no tool).

    python -m data.arithmetic --out runs/data --train 20000 --eval 256
    python -m data.arithmetic --tools --out runs/demo_tools/data --train 20000 --sft 20000 --eval 500
"""
import argparse
import json
import random
from pathlib import Path

NAMES = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jo"]
ITEMS = ["apples", "coins", "books", "cards", "shells", "stamps", "pens", "marbles"]
PROMPT_SUFFIX = " Answer:"


def make_problem(rng: random.Random, max_steps: int = 12, p_stop: float = 0.55,
                 max_value: int = 9) -> dict:
    """One problem. Steps k ~ Geometric(p_stop) capped at max_steps; amounts in [1, max_value]."""
    k = 1
    while k < max_steps and rng.random() > p_stop:
        k += 1
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(1, max_value)
    sentences = [f"{name} has {total} {item}."]
    lines = []
    for _ in range(k):
        x = rng.randint(1, max_value)
        if rng.random() < 0.5 or x > total:  # gains keep the total non-negative
            sentences.append(f"{name} gets {x} more.")
            lines.append(f"{total}+{x}={total + x}.")
            total += x
        else:
            sentences.append(f"{name} loses {x}.")
            lines.append(f"{total}-{x}={total - x}.")
            total -= x
    prompt = " ".join(sentences) + f" How many {item} now?" + PROMPT_SUFFIX
    solution = " " + " ".join(lines) + f" \\boxed{{{total}}}"
    return {"task": "math", "prompt": prompt, "answer": str(total), "solution": solution}


def make_split(n: int, seed: int, start_id: int = 0, p_stop: float = 0.55) -> list[dict]:
    """n problems from a seeded generator; ids start_id, start_id+1, ..."""
    rng = random.Random(seed)
    return [{"id": start_id + i, **make_problem(rng, p_stop=p_stop)} for i in range(n)]


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def with_slip(row: dict, rng: random.Random) -> dict:
    """The same worked solution with a careless final answer: boxed = result +- 1."""
    wrong = int(row["answer"]) + (1 if int(row["answer"]) == 0 or rng.random() < 0.5 else -1)
    return {**row, "solution": row["solution"].rsplit("\\boxed{", 1)[0] + f"\\boxed{{{wrong}}}"}


def write_demo_data(out: Path, n_train: int, n_sft: int, n_eval: int, seed: int = 0,
                    rl_p_stop: float = 0.35, slip_rate: float = 0.4) -> None:
    """rl_train.jsonl / eval.jsonl (prompt, answer) and sft.jsonl (prompt, completion). SFT problems
    are mostly short (p_stop 0.55, mean 1.8 steps); RL and held-out ones lean longer (rl_p_stop,
    mean 2.9 steps at 0.35). The SFT demonstrations are deliberately careless: a share `slip_rate`
    of them box the final result off by one, so the SFT model learns the slip and RL, rewarded by
    the verifier, has a mistake to unlearn."""
    train = make_split(n_train, seed, 0, rl_p_stop)
    slip = random.Random(seed + 3)
    sft = [with_slip(r, slip) if slip.random() < slip_rate else r for r in make_split(n_sft, seed + 1, n_train)]
    held_out = make_split(n_eval, seed + 2, n_train + n_sft, rl_p_stop)
    seen = {r["prompt"] for r in train} | {r["prompt"] for r in sft}
    held_out = [r for r in held_out if r["prompt"] not in seen]
    write_jsonl(train, out / "rl_train.jsonl")
    write_jsonl([{**r, "completion": r["solution"]} for r in sft], out / "sft.jsonl")
    write_jsonl(held_out, out / "eval.jsonl")


def make_product(rng: random.Random) -> dict:
    """`a` boxes of `b` items plus `c` loose ones: answer a*b+c, a, b in [12, 99], c in [1, 9]."""
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(1, 9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    prompt = f"{name} has {a} boxes of {b} {item} and {c} more {item}. How many {item} in all?" + PROMPT_SUFFIX
    return {"prompt": prompt, "answer": str(a * b + c), "expression": f"{a}*{b}+{c}"}


def tool_demonstration(row: dict) -> list[dict]:
    """A completion as turns: the calculator call (hermes format), its answer, the boxed result."""
    call = json.dumps({"name": "calculator", "arguments": {"expression": row["expression"]}})
    return [{"role": "assistant", "content": f" <tool_call>{call}</tool_call>"},
            {"role": "tool", "content": row["answer"]},
            {"role": "assistant", "content": f" \\boxed{{{row['answer']}}}"}]


def write_tools_data(out: Path, n_train: int, n_sft: int, n_eval: int, seed: int = 0, tool_rate: float = 0.3) -> None:
    """sft.jsonl (a share tool_rate of demonstrations call the calculator), rl_tools.jsonl / eval_tools.jsonl (task
    math_calculator) and rl_plain.jsonl / eval_plain.jsonl (task math: the same problems without the tool)."""
    rng = random.Random(seed + 10)
    rows = [{"id": i, **make_product(rng)} for i in range(n_train + n_sft + n_eval)]
    train, sft, held_out = rows[:n_train], rows[n_train:n_train + n_sft], rows[n_train + n_sft:]
    seen = {r["prompt"] for r in train + sft}
    held_out = [r for r in held_out if r["prompt"] not in seen]
    pick = random.Random(seed + 11)
    write_jsonl([{"id": r["id"], "prompt": r["prompt"],
                  "completion": tool_demonstration(r) if pick.random() < tool_rate else
                  f" {r['expression']}={r['answer']}. \\boxed{{{r['answer']}}}"} for r in sft], out / "sft.jsonl")
    for name, task in (("tools", "math_calculator"), ("plain", "math")):
        for split, part in (("rl", train), ("eval", held_out)):
            write_jsonl([{"id": r["id"], "task": task, "prompt": r["prompt"], "answer": r["answer"]} for r in part],
                        out / f"{split}_{name}.jsonl")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train", type=int, default=20000, help="RL prompts")
    ap.add_argument("--sft", type=int, default=20000, help="SFT prompt/completion pairs")
    ap.add_argument("--eval", type=int, default=256, help="held-out prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tools", action="store_true", help="the tools demo's data (write_tools_data)")
    a = ap.parse_args()
    (write_tools_data if a.tools else write_demo_data)(a.out, a.train, a.sft, a.eval, a.seed)

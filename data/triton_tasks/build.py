"""Export the Triton tasks as jsonl for the trainer.

    python -m data.triton_tasks.build --out runs/triton
    -> rl_train.jsonl   {"id", "task": "triton", "name", "category", "prompt", "reference_code"}
       sft.jsonl        the same rows plus "completion" (the reference solution as one ```python block)
       eval.jsonl       the RL rows again (the task set is the evaluation set, as in KernelBench)
"""
import argparse
from pathlib import Path

from data.arithmetic import write_jsonl
from data.triton_tasks import task_rows


def export(out: Path) -> None:
    rl = task_rows()
    write_jsonl(rl, out / "rl_train.jsonl")
    write_jsonl(task_rows(sft=True), out / "sft.jsonl")
    write_jsonl(rl, out / "eval.jsonl")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    export(ap.parse_args().out)

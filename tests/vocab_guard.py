"""Runs one trainer job in this process (a world of one) under a guard that records every tensor an op produces with
more than `rows` rows of the model's vocabulary V: a (tokens x V) tensor outside the fused head's chunks and the
engine's running batch. Writes what it saw to OUT as json: {"v": V, "rows": rows, "seen": [[op, shape, where], ...],
"rc": the trainer's exit code, "ops": ops watched}.

    python tests/vocab_guard.py OUT ROWS TRAINER_ARGS...      (PLANT=logits: the head builds the full logits first)

TorchDispatchMode sees every aten op of this thread below autograd: the trainer's forwards and backwards (FSDP2's
included) and the in-process vLLM engine's (VLLM_ENABLE_V1_MULTIPROCESSING=0, the trainer's default).
"""
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import launch  # noqa: E402
import model  # noqa: E402
from kernels import fused_linear  # noqa: E402
import trainer  # noqa: E402


GUARD_CHUNK_LOGITS = 1 << 23  # the fused head's chunks here: 55 tokens at V=151936 (the CPU default is 441, more
# than the rows a job's forward has: its chunks would hide a (tokens x V) tensor from the guard)


class VocabGuard(TorchDispatchMode):
    """Records (op, shape, the innermost project frame) of each op output with a dimension V whose other dimensions
    hold more than `rows` elements."""

    def __init__(self, V: int, rows: int):
        super().__init__()
        self.V, self.rows, self.seen, self.ops = V, rows, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and self.V in t.shape and t.numel() // self.V > self.rows:
                here = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                        if str(ROOT) in f.filename and "/.venv/" not in f.filename and "vocab_guard" not in f.filename]
                self.seen.append([str(func), list(t.shape), here[-1] if here else "(outside the project)"])
        return out


def plant_full_logits() -> None:
    """The bug the guard exists for: the head computes the (N, V) logits and hands fn their log-softmax's rows."""
    forward = model.Head.forward

    def full(self, h):
        if self.fn is not None:
            torch.nn.functional.linear(h[0], self.weight).log_softmax(-1)  # (N, V)
        return forward(self, h)
    model.Head.forward = full


def main() -> None:
    out, rows, argv = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    if os.environ.get("PLANT") == "logits":
        plant_full_logits()
    fused_linear._CHUNK_LOGITS = GUARD_CHUNK_LOGITS
    path = next(a.split("=", 1)[1] for a in argv if a.startswith("--model_path="))
    guard = VocabGuard(AutoConfig.from_pretrained(path).vocab_size, rows)
    with guard:
        rc = trainer.main(argv)
    seen = guard.seen
    out.write_text(json.dumps({"v": guard.V, "rows": rows, "rc": rc, "ops": guard.ops,
                               "seen": [s for i, s in enumerate(seen) if s not in seen[:i]][:50]}))
    launch.exit_process(0)


if __name__ == "__main__":
    main()

"""KernelBench-style Triton tasks: a PyTorch reference (`Model`, `get_inputs()`, `get_init_inputs()`) and a
reference Triton solution (`ModelNew`) per task, with the AutoTriton/KernelBench prompt.

    reference/<category>/<name>.py    the task as the model sees it
    solutions/<category>/<name>.py    a ModelNew that scores 1.0 under rewards.triton.kernel (CPU interpreter)

Rows (see build.py for the jsonl export):
    {"id": int, "task": "triton", "name": str, "category": str, "prompt": str, "reference_code": str}
    the SFT view adds "completion": the solution as one ```python block.
Shapes are tiny on purpose: on CPU every kernel runs in TRITON_INTERPRET=1, one program instance at a time.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CATEGORIES = ("elementwise", "activations", "reductions", "softmax", "norms", "matmul", "scans")

_EXAMPLE_REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]


def get_init_inputs():
    return []
'''

_EXAMPLE_SOLUTION = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
        return out
'''

PROMPT = """You write custom Triton kernels to replace the PyTorch operators in the given architecture.

Here is an example. The given architecture is:
```python
{example_reference}```
The new architecture with a Triton kernel is:
```python
{example_solution}```

Rules: every computation of the output must happen inside @triton.jit kernels launched from ModelNew.forward;
torch may only allocate tensors (torch.empty, torch.empty_like, torch.zeros, ...) and reshape or view them.
Keep the parameters of Model under the same names so they can be loaded into ModelNew. Import only torch,
torch.nn, triton, triton.language, math. No try/except, no torch.nn.functional, no `@` matrix product, no
tensor math methods (x.sum(), ...).
The kernels are checked as an H100 (sm_90) runs them. Outputs must match within atol = rtol = 1e-4 for float32
(1e-2 for float16 / bfloat16): an fp32 tl.dot rounds its inputs to TF32 by default, too coarse for 1e-4, so pass
input_precision="ieee" (or "tf32x3"). torch.empty memory holds garbage: write every output element. Every load
and store must stay inside its tensor (mask the edges), and programs may run in any order. Inside a program, a
load that reads what other lanes stored (another position in the block, or another block shape) needs
tl.debug_barrier() after the store, and lanes that store to one address must store the same value.

You are given the following architecture:
```python
{reference}```
Optimize the architecture named Model with custom Triton kernels! Name your optimized output architecture
ModelNew. Output the new code in one ```python code block. Generate real code, NOT pseudocode, make sure it
compiles and is fully functional. Just output the new model code, no other text, and NO testing code!
"""


def build_prompt(reference_code: str) -> str:
    """The AutoTriton/KernelBench one-shot prompt ("write ModelNew with Triton kernels") for one reference."""
    return PROMPT.format(example_reference=_EXAMPLE_REFERENCE, example_solution=_EXAMPLE_SOLUTION,
                         reference=reference_code)


def load_tasks() -> list:
    """Every task, sorted by (category, name): {"name", "category", "reference_code", "solution"}."""
    tasks = []
    for category in CATEGORIES:
        for path in sorted((ROOT / "reference" / category).glob("*.py")):
            tasks.append({"name": path.stem, "category": category, "reference_code": path.read_text(),
                          "solution": (ROOT / "solutions" / category / path.name).read_text()})
    return tasks


def task_rows(sft: bool = False) -> list:
    """Trainer rows, one per task (ids in load_tasks order); sft=True adds "completion"."""
    rows = []
    for i, t in enumerate(load_tasks()):
        row = {"id": i, "task": "triton", "name": t["name"], "category": t["category"],
               "prompt": build_prompt(t["reference_code"]), "reference_code": t["reference_code"]}
        if sft:
            row["completion"] = f"```python\n{t['solution']}```"
        rows.append(row)
    return rows

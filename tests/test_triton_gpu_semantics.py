"""Issue 44: the interpreter behaves like the GPU it stands for (rewards/triton_gpu.py, rewards/triton_harness.py).

For each class done, an attack that scored 1.0 on main (before this issue's fix) and an honest kernel in the same
style that keeps scoring 1.0, through triton_reward:
  bounds     a load whose mask forgets `offs >= 1` reads 4 bytes before its tensor: out_of_bounds
  garbage    a ReLU that stores only the positive elements into a 64 MiB torch.empty (zero pages on CPU): NaN in
             fresh memory, wrong_output; the same kernel into torch.zeros scores
  tf32       an fp32 tl.dot with the default input precision: TF32 operands on sm_90, wrong_output at 1e-4;
             input_precision="ieee" scores
  messages   a race's and a bounds failure's public detail names the kernel and the argument only
"""
import pytest

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton_kernel import lint, triton_reward
from triton_corpus.gpu_rules import ATTACKS, RELU_KERNEL, model

TASKS = {t["name"]: t for t in load_tasks()}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")

RELU_LAUNCH = "relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)\nreturn out"
RELU_BEFORE = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    before = tl.load(x_ptr + offs - 1, mask=MASK)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) + tl.where(offs >= 1, before * 0.0, 0.0), mask=offs < n)
'''
RELU_POSITIVES = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x, mask=(offs < n) & (x > 0.0))
'''
BIG_EMPTY = "out = torch.empty(1 << 24, dtype=x.dtype)[:x.numel()].view(x.shape)\n"
MATMUL = TASKS["matmul"]["solution"]
CASES = [   # (id, task, attack, reason, honest)
    ("bounds_mask_forgets_the_first_column", "relu",
     model(RELU_BEFORE.replace("MASK", "offs < n"), "out = torch.empty_like(x)\n" + RELU_LAUNCH), "out_of_bounds",
     model(RELU_BEFORE.replace("MASK", "(offs < n) & (offs >= 1)"), "out = torch.empty_like(x)\n" + RELU_LAUNCH)),
    ("garbage_relu_stores_only_positives", "relu", model(RELU_POSITIVES, BIG_EMPTY + RELU_LAUNCH), "wrong_output",
     model(RELU_POSITIVES, "out = torch.zeros_like(x)\n" + RELU_LAUNCH)),
    ("tf32_dot_default_precision", "matmul", MATMUL.replace(', input_precision="ieee"', ""), "wrong_output",
     MATMUL.replace('input_precision="ieee"', 'input_precision="tf32x3"')),
]


def test_the_attacks_pass_the_linter_and_differ_from_their_honest_twins():
    assert MATMUL.count('input_precision="ieee"') == 1
    for cid, _, attack, _, honest in CASES:
        assert lint(attack) == lint(honest) == (None, ""), cid
        assert attack != honest, cid


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", CASES, ids=[c[0] for c in CASES])
def test_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info
    score, info = triton_reward(honest, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
def test_race_and_bounds_messages_name_the_kernel_and_argument_only():
    race = next(a for a in ATTACKS if a.id == "total_sum_lost_updates")
    score, info = triton_reward(race.code, TASKS[race.task], timeout_s=60)
    assert info["reason"] == "race" and "element 0 of out_ptr" in info["detail"], info
    assert info["public"] == "runtime: ['race: sum_kernel: out_ptr']", info
    score, info = triton_reward(CASES[0][2], TASKS["relu"], timeout_s=60)
    assert info["reason"] == "out_of_bounds" and "bytes outside" in info["detail"], info
    assert info["public"] == "runtime: ['out_of_bounds: relu_kernel: x_ptr']", info

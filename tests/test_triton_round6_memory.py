"""Issue 52's round 6, the memory model and the language (tests/triton_corpus/round6_memory.py): each attack, right
only at an edge of a rule (1.0 on e2de9f9), scores 0 with its reason through triton_reward; its honest twin in the
same style scores 1.0. One case of each rule quick, the rest slow. The rules' unit tests without a sandbox sit
beside them: tests/test_triton_gpu_semantics.py (Visibility), below (tl.cat's order)."""
import pytest

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton.kernel import lint, triton_reward
from triton_corpus.gpu_rules import model
from triton_corpus.round6_memory import CASES, OPEN

TASKS = {t["name"]: t for t in load_tasks()}
QUICK = {"scalar_read_back_without_barrier", "cuda_branch_never_checked"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def test_the_attacks_differ_from_their_honest_twins_and_twins_pass_the_linter():
    for cid, _, attack, reason, honest in CASES:
        assert attack != honest, cid
        assert lint(honest) == (None, ""), cid
        if not reason.startswith("lint_"):
            assert lint(attack) == (None, ""), cid


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", [c if c[0] in QUICK else pytest.param(
    *c, marks=pytest.mark.slow) for c in CASES], ids=[c[0] for c in CASES])
def test_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info
    score, info = triton_reward(honest, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


CAT_SUM = model('''
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, N, HALF: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, HALF)
    lo = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
    hi = tl.load(x_ptr + row * N + HALF + offs, mask=HALF + offs < N, other=0.0)
    tl.store(out_ptr + row, tl.sum(tl.cat(lo, hi, can_reorder=True), axis=0))
''', "x = x.contiguous()\nM, N = x.shape\nout = torch.empty(M, dtype=x.dtype)\n"
     "row_sum_kernel[(M,)](x, out, N, HALF=triton.next_power_of_2(N) // 2)\nreturn out")


@needs_bwrap
@pytest.mark.slow
def test_an_order_free_use_of_a_reordering_cat_scores_one():
    """tl.cat(can_reorder=True) summed as a whole: the order Triton leaves open changes nothing (hook_reorder)."""
    assert lint(CAT_SUM) == (None, "")
    score, info = triton_reward(CAT_SUM, TASKS["row_sum"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="relaxed ordering across programs is not emulated: rewards/triton/README.md, "
                                       "Known gaps (a strict xfail: it fails once the hole is closed)")
@pytest.mark.parametrize("cid, task, attack, reason, honest", OPEN, ids=[c[0] for c in OPEN])
def test_open_attack_is_still_refused_nowhere(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info

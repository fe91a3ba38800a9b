"""Issue 29: the honest kernels (tests/triton_corpus/honest.py), written the ways people and models write Triton,
pass the linter and score 1.0 through the full reward under TRITON_INTERPRET=1. Four of them (autotune, heuristics,
three kernels in one forward, a docstring and a `__main__` block) run in the quick suite, the rest are slow.
"""
import pytest

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton.kernel import lint, triton_reward
from triton_corpus.honest import HONEST

TASKS = {t["name"]: t for t in load_tasks()}
QUICK = {"autotune_config_list", "clamp_heuristics", "swiglu_three_kernels", "bias_add_docstring_main_block"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def test_honest_set():
    assert len(HONEST) >= 20 and len({h[0] for h in HONEST}) == len(HONEST) and QUICK <= {h[0] for h in HONEST}
    refused = {cid: lint(code) for cid, _, code in HONEST if lint(code)[0]}
    assert not refused, refused


@needs_bwrap
@pytest.mark.parametrize("cid, task, code", [h if h[0] in QUICK else pytest.param(*h, marks=pytest.mark.slow)
                                             for h in HONEST], ids=[h[0] for h in HONEST])
def test_honest_kernel_scores_one(cid, task, code):
    score, info = triton_reward(f"```python\n{code}```", TASKS[task])
    assert (score, info["reason"]) == (1.0, "ok"), info
    assert info["max_abs_err"] < 1e-4

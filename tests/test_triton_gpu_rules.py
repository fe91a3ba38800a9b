"""Issue 36: a Triton kernel scores only if a GPU would run it the same way, and the linter's time is linear.

The fifth-round corpus (tests/triton_corpus/gpu_rules.py) through triton_reward: host Python in kernel bodies
scores 0 (gpu_compile: each launch's kernel is compiled for sm_90 first), races between programs score 0 (race,
or wrong_output under another schedule of the programs), the linter takes under 2 s on every ~100 KB file that
used to take seconds to minutes (over 100 KB: lint_size), and the honest kernels the new rules must keep (builtins on
constexprs, atomics, persistent tl.range loops, tl.reduce with a tuple combine, tl.swizzle2d) score 1.0. One run
per class and one honest kernel are in the quick suite, the rest are slow. Unit tests of the race rule
(rewards/triton/gpu.py) run without a sandbox; the order programs run in: tests/test_triton_schedules.py.
"""
import time

import numpy as np
import pytest

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem, running_sandboxes
from rewards.triton.memory import Programs, _first_clash
from rewards.triton.kernel import lint, triton_reward
from triton_corpus.gpu_rules import ATTACKS, HONEST

TASKS = {t["name"]: t for t in load_tasks()}
RUNS = [a for a in ATTACKS if a.cls in (1, 2)]
QUICK = {"int_affine_python_ints", "total_sum_lost_updates", "atomic_max_per_row"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def test_corpus_covers_every_class():
    assert {c: sum(a.cls == c for a in ATTACKS) >= 3 for c in (1, 2, 3)} == {1: True, 2: True, 3: True}
    assert len({a.id for a in ATTACKS}) == len(ATTACKS) and QUICK <= {a.id for a in ATTACKS} | {h[0] for h in HONEST}
    assert all(a.before == "1.0" for a in RUNS)


@needs_bwrap
@pytest.mark.parametrize("attack", [a if a.id in QUICK else pytest.param(a, marks=pytest.mark.slow) for a in RUNS],
                         ids=[a.id for a in RUNS])
def test_attack_scores_zero_with_its_reason(attack):
    assert lint(attack.code) == (None, ""), "the attack must get past the linter: the run is what refuses it"
    score, info = triton_reward(attack.code, TASKS[attack.task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, attack.reason), info
    assert attack.detail in info["detail"], info
    assert running_sandboxes(wait_s=10) == []


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.cls == 3], ids=[a.id for a in ATTACKS if a.cls == 3])
def test_the_linter_takes_under_2_s_on_100_kb(attack):
    """Class 3: each file of about 100 KB lints in under 2 s with its reason; over 100 KB it is not linted at all.
    The issue's 600 grid names took 15 s before, 1450 of them 75 s."""
    lint(HONEST[0][2])                     # the linter's one-off imports are not the file's time
    t0 = time.monotonic()
    reason, detail = lint(attack.code)
    took = time.monotonic() - t0
    assert (reason, attack.detail in detail) == (attack.reason, True), (reason, detail)
    assert took < 2.0, f"{attack.id}: {took:.2f} s (before the fix: {attack.before})"


@needs_bwrap
@pytest.mark.parametrize("cid, task, code", [h if h[0] in QUICK else pytest.param(*h, marks=pytest.mark.slow)
                                             for h in HONEST], ids=[h[0] for h in HONEST])
def test_honest_kernel_scores_one(cid, task, code):
    score, info = triton_reward(code, TASKS[task])
    assert (score, info["reason"]) == (1.0, "ok"), info


def _spans(*accesses) -> tuple:
    """Programs._spans of (address, program) pairs."""
    programs = Programs()
    programs.touched = {"x": [(np.array([a], np.uint64), p) for a, p in accesses]}
    return programs._spans(("x",))


def test_race_rule():
    """One program's store against another's access of the same byte, an atomic against a plain access; never a
    program against itself, loads against loads or atomics against atomics (those pairs are never checked)."""
    assert _first_clash(_spans((8, 0)), _spans((8, 1))) == 8                # stored by 0, loaded by 1
    assert _first_clash(_spans((8, 0), (8, 1)), _spans((8, 0), (8, 1))) == 8   # stored by both
    assert _first_clash(_spans((8, 0)), _spans((8, 0))) is None              # one program's own bytes
    assert _first_clash(_spans((8, 0)), _spans((9, 1))) is None              # other bytes
    assert _first_clash(_spans(), _spans((8, 1))) is None
    assert _first_clash(_spans((8, 2), (16, 3)), _spans((16, 3), (8, 2), (24, 1))) is None

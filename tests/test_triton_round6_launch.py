"""Issue 52's round 6, the launch classes (tests/triton_corpus/round6_launch.py): every autotune config checked, each
autotuner choosing on its own, every program resident at once, configs out of sm_90's resources skipped as Triton
skips them, public messages that no input value changes.

Through triton_reward: each attack scores 0 with its reason, its honest twin 1.0; each leak's public text is the
reason's own sentence. Without a sandbox: the runs autotune_choice plans cover every config in a run that tunes and
in one that only chooses, and every pair of two autotuners' configs; run 2 of Schedule has every program started
before any atomic runs; _compare's public text is the same for results that differ only in what the inputs chose.
"""
import itertools
import json

import pytest
import torch

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton.gpu import MAX_RUNS, autotune_choice, autotune_runs
from rewards.triton.kernel import PUBLIC, _compare, _parse_result, lint, triton_reward
from rewards.triton.schedule import _RESIDENT, Deadlock
from test_triton_schedules import _launch
from triton_corpus.round6_launch import CASES, LEAKS, TWO_SIZES_OF_NINE

TASKS = {t["name"]: t for t in load_tasks()}
QUICK = {"seventeen_inside"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def test_the_attacks_pass_the_linter_and_differ_from_their_honest_twins():
    for cid, _, attack, _, honest in CASES:
        assert lint(attack) == lint(honest) == (None, ""), cid
        assert attack != honest, cid
    assert all(lint(code) == (None, "") for _, _, code, _ in LEAKS)


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", [c if c[0] in QUICK else pytest.param(
    *c, marks=pytest.mark.slow) for c in CASES], ids=[c[0] for c in CASES])
def test_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=120)
    assert (score, info["reason"]) == (0.0, reason), info
    if reason == "wrong_output":            # detail names the case and run; the public text neither
        assert ", run " in info["detail"] and info["public"] == "values differ from the reference (atol=rtol=0.0001)", \
            info
    score, info = triton_reward(honest, TASKS[task], timeout_s=120)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("cid, task, code, reason", LEAKS, ids=[c[0] for c in LEAKS])
def test_public_text_is_the_reasons_own(cid, task, code, reason):
    score, info = triton_reward(code, TASKS[task], timeout_s=120)
    assert (score, info["reason"]) == (0.0, reason), info
    assert info["public"] == PUBLIC.get(reason, "values differ from the reference (atol=rtol=0.0001)"), info
    assert info["detail"] != info["public"], info       # what the run chose stays in detail


@pytest.mark.parametrize("sizes", [[2], [9], [36], [2, 2], [2, 3], [8, 8], [1, 4], [3, 3, 3], [2, 2, 2, 2],
                                   [4, 1, 4, 2]])
def test_every_config_tunes_and_only_chooses_and_every_pair_meets(sizes):
    runs = autotune_runs(sizes)
    assert runs <= MAX_RUNS
    plan = [[autotune_choice(sizes, t, r) for t in range(len(sizes))] for r in range(runs)]
    assert all(len({tunes for tunes, _ in row}) == 1 for row in plan)       # a run tunes for all or for none
    assert plan[0][0][0] and all(k == 0 for _, k in plan[0])                # run 0 tunes, the first config
    for t, m in enumerate(sizes):
        for tunes in (True, False):
            assert {row[t][1] for row in plan if row[t][0] is tunes} == set(range(m)), (t, tunes)
    alone = [[k for _, k in row] for row in plan if not row[0][0]]
    for t, u in itertools.combinations(range(len(sizes)), 2):
        assert {(row[t], row[u]) for row in alone} == set(itertools.product(range(sizes[t]), range(sizes[u])))


@needs_bwrap
@pytest.mark.slow
def test_a_forward_whose_tunings_need_more_runs_than_the_cap_is_refused():
    """Honest work refused: one autotuner of 9 configs tuned for two sizes is two tunings, 9 + 81 runs."""
    assert lint(TWO_SIZES_OF_NINE) == (None, "")
    score, info = triton_reward(TWO_SIZES_OF_NINE, TASKS["relu"], timeout_s=120)
    assert (score, info["reason"]) == (0.0, "lint_launch") and "need 90 runs" in info["public"], info


def test_the_runs_an_autotuned_forward_needs_past_the_cap():
    assert autotune_runs([9]) == 18 > 16             # e2de9f9's cap: the ninth config never chosen
    assert autotune_runs([8, 8]) == MAX_RUNS and autotune_runs([36]) == MAX_RUNS
    assert autotune_runs([9, 8]) > MAX_RUNS and autotune_runs([37]) > MAX_RUNS    # refused: lint_launch


def test_run_2_has_every_program_inside_before_any_atomic_runs():
    def program(memory, p):              # enters, leaves: how many were inside when each entered
        memory.log.append(memory.atomic(0, lambda v: v + 1))
        memory.atomic(0, lambda v: v - 1)
    for run, most in ((0, 0), (1, 0), (2, 49)):
        assert max(_launch(50, run, program)[1].log) == most, run
    assert max(_launch(_RESIDENT + 20, 2, program)[1].log) == _RESIDENT - 1      # resident at once: an SM each


def test_run_2_lets_a_spin_wait_end_and_finds_a_deadlock():
    def relay(memory, p):                # p waits for flag p - 1, then sets flag p (look-back)
        while p and memory.atomic(8 * (p - 1)) == 0:
            pass
        memory.atomic(8 * p, lambda v: 1)
        memory.log.append(p)
    assert _launch(6, 2, relay)[1].log == list(range(6))

    def waits_on_the_next(memory, p):
        while memory.atomic(8 * (p + 1)) == 0:
            pass
    with pytest.raises(Deadlock, match="3 programs wait"):
        _launch(3, 2, waits_on_the_next)


def _blob(meta: dict, tensors: dict) -> bytes:
    from safetensors.torch import save
    return save(tensors, metadata={"meta": json.dumps({"error": None, "detail": "", "phase": None, "n_out": [1],
                                                        "launches": [1], "runs": [4], "violations": [], "ms": None,
                                                        **meta})})


def test_public_text_does_not_change_with_what_the_inputs_chose():
    cases = [{"inputs": [torch.zeros(2, 3)], "outputs": [torch.ones(2, 3)]}]
    good = {f"{p}.0.0{s}": torch.ones(2, 3) if p == "out" else torch.zeros(2, 3) for p in ("out", "after")
            for s in ("", ".1", ".2", ".3")}
    seen = {}
    for name, meta, tensors in [
            ("race a", {"violations": ["race: k: a_ptr: program (0, 0, 0) stores to element 0 of a_ptr, which "
                                       "program (1, 0, 0) stores to"]}, good),
            ("race b", {"violations": ["race: k: b_ptr: program (3, 0, 0) stores to element 2 of b_ptr, which "
                                       "program (1, 0, 0) loads"]}, good),
            ("deadlock 2", {"violations": ["deadlock: k: 2 programs wait in atomics that no program will change "
                                           "(run 0)"]}, good),
            ("deadlock 5", {"violations": ["deadlock: k: 5 programs wait in atomics that no program will change "
                                           "(run 3)"]}, good),
            ("bounds", {"violations": ["out_of_bounds: k: x_ptr: program (0, 0, 0) loads 4 bytes outside every "
                                       "tensor argument's storage (first at -4)"]}, good),
            ("wrong run 0", {}, {**good, "out.0.0": torch.zeros(2, 3)}),
            ("wrong run 3", {}, {**good, "out.0.0.3": torch.zeros(2, 3)}),
            ("mutated run 2", {}, {**good, "after.0.0.2": torch.ones(2, 3)})]:
        reason, detail, public, _ = _compare(cases, _parse_result(_blob(meta, tensors), cases))
        seen.setdefault(reason, set()).add(public)
        assert public != detail, name
    assert seen == {"race": {PUBLIC["race"]}, "deadlock": {PUBLIC["deadlock"]},
                    "out_of_bounds": {PUBLIC["out_of_bounds"]}, "input_mutated": {PUBLIC["input_mutated"]},
                    "wrong_output": {"values differ from the reference (atol=rtol=0.0001)"}}

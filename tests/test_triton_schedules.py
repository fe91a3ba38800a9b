"""Issue 44, classes 1, 2 and 5: the programs of an interpreted launch overlap as on a GPU (rewards/triton/gpu.py's
Schedule), the autotuner benchmarks every config (hook_autotune), and a case runs once per schedule or config
wanted, each run compared with the reference (rewards/triton/kernel.py).

Through triton_reward (tests/triton_corpus/schedules.py): each attack, right in every order of whole programs and
with the first autotune config (1.0 before this change), scores 0 with its reason; its honest twin and the
honest kernels score 1.0; nothing passes from one run to the next (a module-level cache of run 0's outputs, a
load_state_dict hook writing into the state it was given); a relay in which every program waits on the next one
is a deadlock. Without a
sandbox: Schedule's orders (grid, reverse, random), spin-waits that block and wake (rewards/triton/schedule.py),
a repeated read that was not a wait, a deadlock; the result file's runs validated.
"""
import json

import numpy as np
import pytest
import torch

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton.schedule import Deadlock, Schedule
from rewards.triton.gpu import MAX_RUNS
from rewards.triton.kernel import _MAX_RUNS, PUBLIC, Malformed, _compare, _parse_result, lint, triton_reward
from triton_corpus.schedules import (CASES, HONEST, TUNED_RESET_ON_EMPTY, WAITS_ON_THE_NEXT,
                                     WRITES_INTO_THE_LOADED_STATE)

TASKS = {t["name"]: t for t in load_tasks()}
QUICK = {"cas_without_retry", "carry_never_waits", "tuned_second_config_does_less", "caches_run_0_outputs"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def test_the_attacks_pass_the_linter_and_differ_from_their_honest_twins():
    for cid, _, attack, _, honest in CASES:
        assert lint(attack) == lint(honest) == (None, ""), cid
        assert attack != honest, cid
    assert all(lint(code) == (None, "") for _, _, code in HONEST) and lint(WAITS_ON_THE_NEXT) == (None, "")


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", [c if c[0] in QUICK else pytest.param(
    *c, marks=pytest.mark.slow) for c in CASES], ids=[c[0] for c in CASES])
def test_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info
    if reason == "wrong_output":            # detail names the run; the public text neither run nor value
        assert ", run " in info["detail"] and info["public"] == "values differ from the reference (atol=rtol=0.0001)", \
            info
    score, info = triton_reward(honest, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
@pytest.mark.parametrize("cid, task, code", HONEST, ids=[h[0] for h in HONEST])
def test_honest_kernel_scores_one(cid, task, code):
    score, info = triton_reward(code, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
def test_a_run_starts_from_copies_of_the_reference_state():
    """The candidate overwrites the state dict its load hook saw after every forward: each run must load its own
    copy (0.0 when the 4 runs shared it; caches_run_0_outputs covers a module shared by the runs)."""
    assert lint(WRITES_INTO_THE_LOADED_STATE) == (None, "")
    score, info = triton_reward(WRITES_INTO_THE_LOADED_STATE, TASKS["bias_add"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
def test_the_second_call_of_a_tuned_kernel_has_no_reset_to_zero():
    """Triton resets reset_to_zero's arguments around its benchmark, not at the calls after it: a total into
    torch.empty is right in the runs that tune (2j) and wrong in the runs that only choose (2j + 1)."""
    assert lint(TUNED_RESET_ON_EMPTY) == (None, "")
    score, info = triton_reward(TUNED_RESET_ON_EMPTY, TASKS["total_sum"], timeout_s=60)
    assert (score, info["reason"]) == (0.0, "wrong_output") and "run 1 of" in info["detail"], info


@needs_bwrap
def test_programs_that_wait_on_each_other_forever_are_a_deadlock():
    score, info = triton_reward(WAITS_ON_THE_NEXT, TASKS["relu"], timeout_s=60)
    assert (score, info["reason"]) == (0.0, "deadlock"), info
    assert "deadlock: relay_kernel: 4 programs wait in atomics that no program will change (run 0)" in info["detail"]
    assert info["public"] == PUBLIC["deadlock"], info


class Memory:
    """Fake memory for Schedule: cells by address; each program's steps are atomics on it."""

    def __init__(self, schedule: Schedule):
        self.cells, self.schedule, self.log = {}, schedule, []

    def atomic(self, address: int, update=None):
        """An atomic on one cell: update(old) -> new (None: a read). Returns the old value."""
        def op():
            old = self.cells.get(address, 0)
            if update is not None:
                self.cells[address] = update(old)
            return old
        return self.schedule.atomic(op, lambda: self.cells.get(address, 0).to_bytes(8, "little"),
                                    np.arange(address, address + 8, dtype=np.uint64))


def _launch(n: int, run_index: int, program) -> list:
    """Runs program(memory, p) for p in range(n) under Schedule; the order in which they started."""
    schedule = Schedule()
    schedule.run_index, schedule.executor = run_index, type("Executor", (), {})()
    memory, started, running = Memory(schedule), [], {}
    schedule.executor.fn = lambda: program(memory, running["p"])
    schedule.start(n, lambda p: (running.__setitem__("p", p), p not in started and started.append(p)), lambda p: None)
    schedule.executor.fn()
    return started, memory, schedule


def test_runs_0_and_1_admit_in_grid_order_and_reverse_later_runs_at_random():
    def program(memory, p):
        memory.atomic(0, lambda v: v + 1)
    assert _launch(5, 0, program)[0] == [0, 1, 2, 3, 4]
    assert _launch(5, 1, program)[0] == [4, 3, 2, 1, 0]
    orders = {tuple(_launch(5, 2, program)[0]) for _ in range(20)}
    assert len(orders) > 5 and all(sorted(o) == list(range(5)) for o in orders)


def test_a_read_modify_write_from_two_atomics_loses_updates_under_some_schedule():
    def program(memory, p):
        seen = memory.atomic(0)
        memory.atomic(0, lambda v, seen=seen: seen + 1)
    totals = [_launch(4, r, program)[1].cells[0] for r in [0, 1] + [2] * 20]
    assert totals[:2] == [4, 4] and min(totals) < 4


def test_a_spin_wait_blocks_until_its_flag_changes_and_every_schedule_ends():
    def program(memory, p):              # p waits for flag p - 1, then sets flag p (look-back)
        while p and memory.atomic(8 * (p - 1)) == 0:
            pass
        memory.atomic(8 * p, lambda v: 1)
        memory.log.append(p)
    for r in [0, 1] + [2] * 10:
        assert _launch(6, r, program)[1].log == list(range(6))


def test_a_repeated_read_that_is_no_wait_goes_on():
    def program(memory, p):             # reads the same unchanged cell twice, then writes its own
        memory.atomic(0)
        memory.atomic(0)
        memory.atomic(8 + 8 * p, lambda v: 1)
    for r in (0, 1, 2):
        memory = _launch(3, r, program)[1]
        assert [memory.cells.get(8 + 8 * p) for p in range(3)] == [1, 1, 1]


def test_programs_that_wait_forever_are_a_deadlock():
    def program(memory, p):
        while memory.atomic(8 * (p + 1)) == 0:
            pass
    for r in (0, 1, 2):
        with pytest.raises(Deadlock, match="3 programs wait"):
            _launch(3, r, program)


def test_an_exception_in_one_program_ends_the_launch_with_it():
    def program(memory, p):              # the others wait on a flag nobody sets: unwound, never a deadlock
        memory.atomic(0, lambda v: v + 1)
        if p == 2:
            raise KeyError("boom")
        while memory.atomic(8) == 0:
            pass
    for r in (0, 1, 2):
        with pytest.raises(KeyError, match="boom"):
            _launch(4, r, program)


def _blob(runs: list, tensors: dict) -> bytes:
    from safetensors.torch import save
    meta = {"error": None, "detail": "", "phase": None, "n_out": [1] * 3, "launches": [1] * 3, "runs": runs,
            "violations": [], "ms": None}
    return save(tensors, metadata={"meta": json.dumps(meta)})


def test_the_sandbox_and_the_parent_cap_runs_alike():
    """triton_gpu runs in the sandbox without this package, so the cap is written twice: a case the harness runs
    more often than the parent accepts would be a Malformed result (crash) for honest work."""
    assert MAX_RUNS == _MAX_RUNS


def test_every_run_of_every_case_is_validated_and_compared():
    cases = [{"inputs": [torch.zeros(2, 3)], "outputs": [torch.full((2, 3), float(k))]} for k in range(3)]
    good = {f"{p}.{k}.0{s}": torch.full((2, 3), float(k) if p == "out" else 0.0) for p in ("out", "after")
            for k in range(3) for s in ("", ".1")}
    assert _compare(cases, _parse_result(_blob([2, 2, 2], good), cases))[0] == "ok"
    for runs in ([1, 2, 2], [0, 2, 2], [_MAX_RUNS + 1, 2, 2], [2, 2]):      # names that do not match, no run, too many
        with pytest.raises(Malformed):
            _parse_result(_blob(runs, good), cases)
    wrong = {**good, "out.1.0.1": torch.full((2, 3), 5.0)}
    reason, detail, public, _ = _compare(cases, _parse_result(_blob([2, 2, 2], wrong), cases))
    assert (reason, public) == ("wrong_output", "values differ from the reference (atol=rtol=0.0001)")
    assert detail.startswith("case 1, run 1 of 2: max abs err 4 "), detail

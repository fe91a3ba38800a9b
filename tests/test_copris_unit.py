"""CoprisScheduler.collect against a deterministic fake engine (no vLLM): every branch, in milliseconds.

The fake gives each request in flight one token per step. Token k of sample s of prompt p is
token(p, s, k) whatever segment produced it, with log-prob logp(p, s, k, version), so a trajectory
that was aborted and resumed must end up equal to an uninterrupted one. A request finishes "stop"
at stop_len(p, s) tokens (unless ignore_eos) or "length" at its max_tokens."""
import json
import re
from dataclasses import MISSING, fields

import pytest

from rollout.copris import CoprisScheduler, Delta, Group, Trajectory

PROMPT_LEN = 3


def prompt(p: int) -> list[int]:
    return [900_000 + p, 1, 2]


def token(p: int, s: int, k: int) -> int:
    return 10_000 * p + 100 * s + k


def logp(p: int, s: int, k: int, version: int) -> float:
    return -(1 + (p + 2 * s + 3 * k) % 10) / 10 - version


def stop_len(p: int, s: int) -> int:
    """Long-tailed response lengths, 2..20 tokens."""
    return 2 + (3 * p + 5 * s) % 7 + (12 if (p + s) % 5 == 0 else 0)


class FakeEngine:
    """The engine interface of rollout/vllm_engine.py, recording every add, the requests (and
    prompts) in flight at each step, what each request streamed, and every abort."""

    def __init__(self, version: int = 0):
        self.version = version  # the "weights" log-probs come from
        self.running = {}  # req_id -> (p, s, response position of its first new token, params)
        self.adds = []  # (req_id, prompt_ids, max_tokens) in submission order
        self.in_flight, self.prompts_in_flight = [], []  # per step
        self.streamed = {}  # req_id -> tokens it emitted
        self.finished_at = {}  # req_id -> index of the step it finished in
        self.aborted = []

    @staticmethod
    def sampling(max_tokens, temperature, top_p, seed, stop_token_ids, ignore_eos=False):
        return {"max_tokens": max_tokens, "seed": seed, "ignore_eos": ignore_eos}

    def add(self, req_id, prompt_ids, params):
        if params["max_tokens"] < 1:  # vLLM rejects it too
            raise ValueError(f"{req_id}: max_tokens={params['max_tokens']}, must be >= 1")
        assert req_id not in self.streamed, f"request id {req_id} submitted twice"
        p, s, _ = map(int, re.fullmatch(r"p(\d+)-s(\d+)-g(\d+)", req_id).groups())
        self.running[req_id] = (p, s, len(prompt_ids) - PROMPT_LEN, params)
        self.adds.append((req_id, list(prompt_ids), params["max_tokens"]))
        self.streamed[req_id] = []

    def step(self):
        if not self.running:
            raise AssertionError("engine.step() with nothing in flight: collect would spin for ever")
        self.in_flight.append(len(self.running))
        self.prompts_in_flight.append(len({p for p, *_ in self.running.values()}))
        deltas = []
        for rid, (p, s, k0, params) in list(self.running.items()):
            out = self.streamed[rid]
            k = k0 + len(out)
            out.append(token(p, s, k))
            reason = ("stop" if not params["ignore_eos"] and k + 1 >= stop_len(p, s)
                      else "length" if len(out) >= params["max_tokens"] else None)
            if reason:
                del self.running[rid]
                self.finished_at[rid] = len(self.in_flight) - 1
            deltas.append(Delta(rid, [out[-1]], [logp(p, s, k, self.version)], reason is not None, reason))
        return deltas

    def abort(self, req_ids):
        for rid in req_ids:
            del self.running[rid]
        self.aborted += req_ids


class Prompts:
    """draw_prompt: prompt ids start, start+1, ...; fails instead of drawing for ever."""

    def __init__(self, start: int = 0, limit: int = 200):
        self.next, self.limit, self.drawn = start, limit, []

    def __call__(self):
        assert len(self.drawn) < self.limit, f"draw_prompt called {self.limit} times: collect never stops"
        p, self.next = self.next, self.next + 1
        self.drawn.append(p)
        return p, prompt(p), {"id": p}


def scheduler(n=4, groups=2, concurrency=6, max_len=16, **kw) -> CoprisScheduler:
    return CoprisScheduler(n, groups, concurrency, max_len, 1.0, 1.0, [0], seed=0, **kw)


def reject_odd(calls: list):
    """keep_group dropping odd prompt ids; records every group it is asked about."""
    def keep(g: Group) -> bool:
        calls.append(g.prompt_id)
        return g.prompt_id % 2 == 0
    return keep


def check_tokens(t: Trajectory) -> None:
    """Every token and log-prob of t is what the fake emitted at its position, under its version."""
    where = f"group {t.prompt_id} sample {t.sample}"
    assert len(t.tokens) == len(t.logprobs) == len(t.versions), \
        f"{where}: {len(t.tokens)} tokens, {len(t.logprobs)} log-probs, {len(t.versions)} versions"
    for k, (tok, lp, v) in enumerate(zip(t.tokens, t.logprobs, t.versions)):
        want = token(t.prompt_id, t.sample, k)
        assert tok == want, f"{where} token {k}: {tok}, expected {want}"
        assert lp == logp(t.prompt_id, t.sample, k, v), \
            f"{where} token {k}: log-prob {lp}, version {v} gave {logp(t.prompt_id, t.sample, k, v)}"


def check_complete(g: Group, n: int, limit: int) -> None:
    """g holds samples 0..n-1 of its prompt, each run to its natural end or to the length limit."""
    samples = [t.sample for t in g.samples]
    assert samples == list(range(n)), f"group {g.prompt_id}: samples {samples}"
    for t in g.samples:
        L = stop_len(g.prompt_id, t.sample)
        want = (L, "stop") if L <= limit else (limit, "length")
        assert t.prompt_id == g.prompt_id and t.prompt_ids == prompt(g.prompt_id), \
            f"group {g.prompt_id} sample {t.sample}: prompt {t.prompt_id} {t.prompt_ids}"
        assert (len(t.tokens), t.finish_reason) == want, \
            f"group {g.prompt_id} sample {t.sample}: {len(t.tokens)} tokens, {t.finish_reason}; expected {want}"
        check_tokens(t)


def unfinished(sched: CoprisScheduler) -> list[Trajectory]:
    return [t for g in sched.buffer for t in g.samples if not t.finished]


# -- CoPRIS mode ------------------------------------------------------------------------------

def test_concurrency_held_at_P_on_every_step():
    sched, draw = scheduler(concurrency=6), Prompts()
    for version in range(3):
        eng = FakeEngine(version)
        sched.collect(eng, draw, version)
        bad = [(i, c) for i, c in enumerate(eng.in_flight) if c != 6]
        assert not bad, f"collect {version}: {len(bad)} steps with in-flight != P=6; (step, count): {bad[:10]}"


def test_stops_at_B_complete_groups_and_buffers_the_rest():
    sched, eng, draw = scheduler(n=4, groups=2, concurrency=6), FakeEngine(), Prompts()
    groups, stats = sched.collect(eng, draw, 0)
    assert sorted(g.prompt_id for g in groups) == [0, 1], f"returned groups {[g.prompt_id for g in groups]}"
    for g in groups:
        check_complete(g, 4, 16)
    last = len(eng.in_flight) - 1  # stopped in the step that completed the B-th group
    assert any(eng.finished_at.get(f"p{g.prompt_id}-s{t.sample}-g0") == last for g in groups for t in g.samples), \
        f"no returned sample finished in the last step {last}: collect ran past B complete groups"
    left = {f"p{t.prompt_id}-s{t.sample}-g{t.segments - 1}" for t in unfinished(sched) if t.segments}
    assert sorted(eng.aborted) == sorted(left) and stats.aborted == len(left) > 0, \
        f"aborted {eng.aborted} (stats {stats.aborted}), still running in the buffer {sorted(left)}"
    assert not eng.running, f"left running in the engine: {list(eng.running)}"
    assert {g.prompt_id for g in sched.buffer} == set(draw.drawn) - {0, 1}, \
        f"buffer {[g.prompt_id for g in sched.buffer]}, drawn {draw.drawn}"


def test_tokens_streamed_before_an_abort_are_kept():
    sched, draw, streamed = scheduler(), Prompts(), {}
    for version in range(2):
        eng = FakeEngine(version)
        sched.collect(eng, draw, version)
        streamed.update(eng.streamed)
    partial = [t for t in unfinished(sched) if t.tokens]
    assert partial, "no partial trajectory in the buffer: the test checks nothing"
    for t in partial:
        segs = [streamed[f"p{t.prompt_id}-s{t.sample}-g{k}"] for k in range(t.segments)]
        assert t.tokens == sum(segs, []), f"group {t.prompt_id} sample {t.sample}: tokens {t.tokens}, streamed {segs}"
        check_tokens(t)


def test_extra_groups_completed_in_the_last_step_come_first_next_call():
    sched, draw, calls = scheduler(n=1, groups=1, concurrency=3), Prompts(), []
    sched.forced_len = lambda p, s: 5  # three one-sample groups finish in the same step
    groups, _ = sched.collect(FakeEngine(), draw, 0, keep_group=reject_odd(calls))
    assert [g.prompt_id for g in groups] == [0] and [g.prompt_id for g in sched.buffer] == [2], \
        f"returned {[g.prompt_id for g in groups]}, buffered {[g.prompt_id for g in sched.buffer]}"
    eng = FakeEngine(1)
    groups, _ = sched.collect(eng, draw, 1, keep_group=reject_odd(calls))
    assert [g.prompt_id for g in groups] == [2] and not eng.adds, \
        f"second call returned {[g.prompt_id for g in groups]} after submitting {eng.adds}"
    assert calls == [0, 1, 2], f"keep_group asked about {calls}: each group exactly once"


def test_unstarted_queue_never_grows():
    sched, draw = scheduler(n=4, groups=1, concurrency=5), Prompts()
    for version in range(8):
        sched.collect(FakeEngine(version), draw, version)
        unstarted = [(t.prompt_id, t.sample) for g in sched.buffer for t in g.samples if t.segments == 0]
        assert len(unstarted) <= 3, f"after collect {version}: unstarted trajectories {unstarted} (at most n-1)"


def test_resume_submits_buffered_trajectories_first_with_their_tokens_and_reduced_max_tokens():
    sched, draw = scheduler(), Prompts()
    sched.collect(FakeEngine(0), draw, 0)
    carried = [(t, len(t.tokens)) for t in unfinished(sched)]
    assert any(k for _, k in carried), "no partial trajectory in the buffer: the test checks nothing"
    eng = FakeEngine(1)
    groups, _ = sched.collect(eng, draw, 1)
    assert len(eng.adds) > len(carried), f"{len(eng.adds)} adds for {len(carried)} carried trajectories"
    for (t, k), (req_id, ids, max_tokens) in zip(carried, eng.adds):
        where = f"group {t.prompt_id} sample {t.sample}"
        assert req_id == f"p{t.prompt_id}-s{t.sample}-g{t.segments - 1}", f"{where}: submitted {req_id} in its place"
        assert ids == prompt(t.prompt_id) + [token(t.prompt_id, t.sample, j) for j in range(k)], \
            f"{where}: resubmitted as {ids}, expected the prompt + its {k} tokens"
        assert max_tokens == 16 - k, f"{where}: max_tokens {max_tokens} with {k} tokens, expected {16 - k}"
    for t, k in carried:
        if t.finished:
            assert t.versions == [0] * k + [1] * (len(t.tokens) - k), \
                f"group {t.prompt_id} sample {t.sample}: versions {t.versions}, {k} tokens from stage 1"
    for g in groups:
        check_complete(g, 4, 16)


def test_trajectory_at_its_limit_on_resume_finishes_as_truncated():
    sched, draw = scheduler(n=4, groups=2, concurrency=6, max_len=16), Prompts()
    sched.collect(FakeEngine(0), draw, 0)
    sched.max_response_len = 3  # shrunk on resume
    carried = [(t, list(t.tokens)) for t in unfinished(sched)]
    assert any(len(tk) >= 3 for _, tk in carried) and any(len(tk) < 3 for _, tk in carried), \
        f"carried lengths {[len(tk) for _, tk in carried]}: need some at and some under the new limit"
    eng = FakeEngine(1)
    sched.collect(eng, draw, 1)
    submitted = {req_id.rsplit("-g", 1)[0]: max_tokens for req_id, _, max_tokens in eng.adds}
    for t, tokens in carried:
        where, rid = f"group {t.prompt_id} sample {t.sample}", f"p{t.prompt_id}-s{t.sample}"
        if len(tokens) >= 3:
            assert rid not in submitted and t.finish_reason == "length" and t.tokens == tokens, \
                f"{where} at the limit with {len(tokens)} tokens: max_tokens {submitted.get(rid)}, " \
                f"{t.finish_reason}, {t.tokens}"
        else:
            assert submitted.get(rid) == 3 - len(tokens), \
                f"{where}: {len(tokens)} tokens, max_tokens {submitted.get(rid)}"


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("limit", ["max_response_len", "forced_len"])
def test_group_completed_by_truncation_at_resume_goes_through_keep_group(keep, limit):
    sched = scheduler(n=2, groups=1, concurrency=4, max_len=16)
    if limit == "forced_len":
        sched.forced_len = lambda p, s: 4
    else:
        sched.max_response_len = 4
    done = Trajectory(7, 0, prompt(7), [token(7, 0, k) for k in range(2)], [-0.5] * 2, [0] * 2, finish_reason="stop")
    full = Trajectory(7, 1, prompt(7), [token(7, 1, k) for k in range(4)], [-0.5] * 4, [0] * 4, segments=1)
    sched.buffer = [Group(7, {"id": 7}, [done, full])]
    calls, eng = [], FakeEngine(1)

    def keep_group(g: Group) -> bool:
        calls.append(g.prompt_id)
        return keep or g.prompt_id != 7
    groups, stats = sched.collect(eng, Prompts(start=8), 1, keep_group=keep_group)
    assert calls[:1] == [7], f"keep_group asked about {calls}: group 7 (complete by truncation) first"
    assert full.finish_reason == "length", f"group 7 sample 1: finish_reason {full.finish_reason}"
    assert not any(rid.startswith("p7-") for rid, _, _ in eng.adds), f"group 7 resubmitted: {eng.adds}"
    if keep:
        assert [g.prompt_id for g in groups] == [7] and stats.dropped_groups == 0, \
            f"accepted group 7: returned {[g.prompt_id for g in groups]}, dropped {stats.dropped_groups}"
    else:
        assert 7 not in [g.prompt_id for g in groups] and stats.dropped_groups == 1, \
            f"rejected group 7: returned {[g.prompt_id for g in groups]}, dropped {stats.dropped_groups}"


@pytest.mark.parametrize("cap,restarts", [(0, True), (1, False)])
def test_staleness_cap_restarts_old_partial_trajectories(cap, restarts):
    sched, draw = scheduler(staleness_cap=cap), Prompts()
    sched.collect(FakeEngine(0), draw, 0)
    partial = [(t, len(t.tokens)) for t in unfinished(sched) if t.tokens]
    finished = [(t, list(t.tokens)) for g in sched.buffer for t in g.samples if t.finished]
    assert partial and finished, "need partial and finished trajectories in the buffer"
    eng = FakeEngine(1)
    _, stats = sched.collect(eng, draw, 1)
    assert stats.restarted_stale == (len(partial) if restarts else 0), \
        f"cap {cap}: restarted {stats.restarted_stale} of {len(partial)} partial trajectories"
    adds = {rid.rsplit("-g", 1)[0]: (ids, mt) for rid, ids, mt in eng.adds}
    for t, k in partial:
        ids, max_tokens = adds[f"p{t.prompt_id}-s{t.sample}"]
        kept = 0 if restarts else k
        assert (len(ids) - PROMPT_LEN, max_tokens) == (kept, 16 - kept), \
            f"cap {cap} group {t.prompt_id} sample {t.sample}: resubmitted with {len(ids) - PROMPT_LEN} " \
            f"of {k} tokens, max_tokens {max_tokens}"
        assert (0 in t.versions) != restarts, f"cap {cap} group {t.prompt_id} sample {t.sample}: versions {t.versions}"
        check_tokens(t)
    for t, tokens in finished:
        assert t.tokens == tokens, f"group {t.prompt_id} sample {t.sample}: a finished sample changed"


def stale_restart(cap: int, version: int) -> tuple[Trajectory, Trajectory]:
    """Group 5 buffered with sample 0 sampled at versions [0, 0, 1] and sample 1 at [1, 1], each with the trainer's
    old log-probs (the engine's + 0.25) for its tokens; one collect at `version` with staleness_cap `cap`, then the
    trainer's fill of the new tokens' old log-probs. -> the two trajectories."""
    def partial(s: int, versions: list[int]) -> Trajectory:
        lps = [logp(5, s, k, v) for k, v in enumerate(versions)]
        return Trajectory(5, s, prompt(5), [token(5, s, k) for k in range(len(versions))], lps, list(versions),
                          [lp + 0.25 for lp in lps], segments=2)
    a, b = partial(0, [0, 0, 1]), partial(1, [1, 1])
    sched = scheduler(n=2, groups=1, staleness_cap=cap)
    sched.buffer = [Group(5, {"id": 5}, [a, b])]
    sched.collect(FakeEngine(version), Prompts(start=6), version)
    for t in (a, b):
        t.old_logprobs += [lp + 0.25 for lp in t.logprobs[len(t.old_logprobs):]]
        check_tokens(t)
    return a, b


def test_stale_restart_keeps_no_old_logprob_of_the_old_sampling():
    """A trajectory restarted for staleness is trained against the policy that sampled its new tokens: each of its
    old log-probs is the one of its own token's version (none left over from the sampling it threw away)."""
    a, _ = stale_restart(cap=0, version=2)
    assert set(a.versions) == {2} and a.tokens, f"sample 0 not restarted: versions {a.versions}"
    want = [logp(5, 0, k, v) + 0.25 for k, v in enumerate(a.versions)]
    assert a.old_logprobs == want, f"old log-probs {a.old_logprobs}, for versions {a.versions}: {want}"


def test_staleness_counts_from_the_first_token():
    """staleness_cap=1 at version 2: a trajectory whose first token is 2 versions old restarts even though its newest
    is 1 version old; one whose first token is 1 version old is extended, keeping its tokens."""
    a, b = stale_restart(cap=1, version=2)
    assert a.versions and set(a.versions) == {2}, f"first token 2 versions old, not restarted: versions {a.versions}"
    assert b.versions[:2] == [1, 1] and set(b.versions[2:]) == {2}, f"first token 1 version old: versions {b.versions}"


def test_dynamic_sampling_collects_until_B_groups_are_kept():
    sched, draw, calls = scheduler(n=4, groups=2, concurrency=6), Prompts(), []
    for version in range(3):
        eng = FakeEngine(version)
        groups, stats = sched.collect(eng, draw, version, keep_group=reject_odd(calls))
        ids = [g.prompt_id for g in groups]
        assert len(ids) == 2 and all(p % 2 == 0 for p in ids), f"collect {version}: returned {ids}"
        assert set(eng.in_flight) == {6}, f"collect {version}: in flight per step {eng.in_flight}"
        for g in groups:
            check_complete(g, 4, 16)
    assert len(calls) == len(set(calls)), f"keep_group asked twice about some group: {calls}"
    assert stats.dropped_groups >= 1, f"last collect dropped {stats.dropped_groups}: the filter was not exercised"


@pytest.mark.parametrize("enabled", [True, False])
def test_max_dropped_is_an_error(enabled):
    sched, eng = scheduler(enabled=enabled), FakeEngine()
    with pytest.raises(RuntimeError, match="rejected 4 groups"):
        sched.collect(eng, Prompts(), 0, keep_group=lambda g: False, max_dropped=3)
    assert not eng.running, f"still running after the error: {list(eng.running)}"


def test_nothing_in_flight_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="nothing in flight"):
        scheduler(concurrency=0).collect(FakeEngine(), Prompts(), 0)


# -- synchronous mode -------------------------------------------------------------------------

def test_sync_mode_runs_B_groups_to_the_end():
    sched, eng, draw = scheduler(n=4, groups=3, concurrency=2, enabled=False), FakeEngine(), Prompts()
    groups, stats = sched.collect(eng, draw, 0)
    assert draw.drawn == [0, 1, 2] and sorted(g.prompt_id for g in groups) == [0, 1, 2], \
        f"drew {draw.drawn}, returned {[g.prompt_id for g in groups]}"
    assert eng.in_flight[0] == 12 and eng.in_flight == sorted(eng.in_flight, reverse=True), \
        f"in flight per step {eng.in_flight}: all B*n=12 at once, never refilled"
    assert not eng.aborted and not sched.buffer and stats.aborted == 0, f"aborted {eng.aborted}, buffer {sched.buffer}"
    for g in groups:
        check_complete(g, 4, 16)


def test_sync_mode_with_a_filter_replaces_each_rejected_group():
    sched, eng, draw, calls = scheduler(n=4, groups=2, enabled=False), FakeEngine(), Prompts(), []
    groups, stats = sched.collect(eng, draw, 0, keep_group=reject_odd(calls))
    ids = [g.prompt_id for g in groups]
    assert len(ids) == 2 and all(p % 2 == 0 for p in ids), f"returned {ids}"
    assert stats.dropped_groups >= 1 and len(draw.drawn) == 2 + stats.dropped_groups, \
        f"drew {draw.drawn} for 2 kept and {stats.dropped_groups} dropped: one new group per rejection"
    assert max(eng.prompts_in_flight) <= 2, f"prompts in flight per step {eng.prompts_in_flight}: at most B=2"
    assert not eng.aborted and not sched.buffer, f"aborted {eng.aborted}, buffer {[g.prompt_id for g in sched.buffer]}"
    for g in groups:
        check_complete(g, 4, 16)


# -- resumable state --------------------------------------------------------------------------

def assert_same_groups(got: list[Group], want: list[Group], what: str) -> None:
    """Field by field over every Group and Trajectory field; the message names the first difference."""
    assert [g.prompt_id for g in got] == [g.prompt_id for g in want], f"{what}: groups {[g.prompt_id for g in got]}"
    for a, b in zip(got, want):
        for f in fields(Group):
            if f.name != "samples":
                assert getattr(a, f.name) == getattr(b, f.name), \
                    f"{what}: group {b.prompt_id} {f.name}: {getattr(a, f.name)!r} != {getattr(b, f.name)!r}"
        assert len(a.samples) == len(b.samples), f"{what}: group {b.prompt_id}: {len(a.samples)} samples"
        for s, t in zip(a.samples, b.samples):
            for f in fields(Trajectory):
                assert getattr(s, f.name) == getattr(t, f.name), \
                    f"{what}: group {b.prompt_id} sample {t.sample} {f.name}: " \
                    f"{getattr(s, f.name)!r} != {getattr(t, f.name)!r}"


def test_buffer_round_trip_through_json_restores_every_field_and_the_continuation():
    sched, draw = scheduler(n=3, groups=1, concurrency=5), Prompts()

    def scored(g: Group) -> bool:
        g.scores = [(float(t.sample), {"reason": "ok", "len": len(t.tokens)}) for t in g.samples]
        return True
    for version in range(2):
        groups, _ = sched.collect(FakeEngine(version), draw, version, keep_group=scored)
        for t in unfinished(sched):  # the trainer's cross-stage old log-probs
            t.old_logprobs += [lp + 0.25 for lp in t.logprobs[len(t.old_logprobs):]]
    sched.buffer.append(groups[0])  # a complete, scored group carried over (more than B completed)
    trajs = [t for g in sched.buffer for t in g.samples]
    for f in fields(Trajectory):  # every field must hold something to lose (multi-turn ones: tests/test_episodes.py)
        if f.name in ("env", "obs_spans", "calls", "pending"):
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        assert any(getattr(t, f.name) not in (default, 0) for t in trajs), f"no buffered trajectory sets {f.name}"
    assert any(g.scores for g in sched.buffer), "no buffered group has scores"

    restored = scheduler(n=3, groups=1, concurrency=5)
    restored.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    assert_same_groups(restored.buffer, sched.buffer, "after the JSON round trip")
    want = sched.collect(FakeEngine(2), Prompts(start=draw.next), 2, keep_group=scored)[0]
    got = restored.collect(FakeEngine(2), Prompts(start=draw.next), 2, keep_group=scored)[0]
    assert_same_groups(got, want, "next collect after the round trip")
    assert_same_groups(restored.buffer, sched.buffer, "buffer after the next collect")

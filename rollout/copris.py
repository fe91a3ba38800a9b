"""CoPRIS: concurrency-controlled partial rollout (Qu et al.), engine-agnostic.

collect() keeps exactly P = `concurrency` requests in flight while work remains, stops as soon as
B = `groups` groups of n samples are complete on this rank, aborts what is still running and keeps
every token it produced (accumulated from DELTA outputs, so nothing streamed before the abort is
lost) in a partial buffer, each token tagged with its sampling log-prob and the policy version
that sampled it. Next call resumes the buffered trajectories first, re-submitted as
prompt + tokens so far with max_tokens reduced by what they already hold; new prompts are drawn
only when a slot is free and nothing is waiting, so the unstarted queue never grows across steps.

Cross-stage importance sampling: each trajectory carries `old_logprobs`, one value per token,
appended stage by stage for the tokens sampled in that stage (the trainer's recomputation with
the policy that sampled them, or the engine's own values). The loss's ratio for token t is
exp(logp_t - old_t) against the policy of the stage that sampled t.

enabled=False is synchronous rollout through the same code: P = B*n and at most B groups open or
kept at any time, so every request runs to the end and nothing is aborted or buffered; a group that
keep_group rejects is replaced by a newly drawn one. In both modes more than `max_dropped`
rejections in one call is an error, and so is a state with nothing in flight and nothing to draw.

Episodes (rows whose task names an environment; `episodes`, rollout/environments.py): a request that stops on the
tool-call end token has its call run by a tool worker while the engine decodes other requests (the trajectory holds
no slot meanwhile); the answer's ids are appended as an observation (obs_spans: tokens the model did not produce,
sampling log-prob 0, never trained on) and the trajectory goes back to the queue as prompt + tokens so far. An
answer joins exactly `tool_steps` engine steps after its call (waiting if the tool is slower; jumping ahead when
nothing else runs): a fixed point in engine steps keeps a run reproducible and a resume exact. A trajectory can be
buffered at any point; one waiting for its tool keeps `pending` and its call is run again at the next collect.

The engine needs: add(req_id, prompt_ids, params), step() -> [Delta] (below), abort(req_ids),
sampling(max_tokens, temperature, top_p, seed, stop_token_ids, ignore_eos) (rollout/vllm_engine.py).
"""
import hashlib
import time
from dataclasses import dataclass, field


@dataclass
class Delta:
    """What one engine step produced for one request."""
    req_id: str
    token_ids: list[int]  # new tokens since the last step
    logprobs: list[float]  # their sampling log-probs
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None


@dataclass
class Trajectory:
    """One sample of one prompt, possibly spanning several rollout stages."""
    prompt_id: int
    sample: int  # index within its group, 0..n-1
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)  # response so far
    logprobs: list[float] = field(default_factory=list)  # engine sampling log-prob per token
    versions: list[int] = field(default_factory=list)  # policy version that sampled each token
    old_logprobs: list[float] = field(default_factory=list)  # cross-stage old log-probs (prefix of tokens)
    segments: int = 0  # times submitted to the engine
    finish_reason: str | None = None  # "stop" | "length" | "max_turns" once finished
    env: str | None = None  # its row's environment (multi-turn), or None
    obs_spans: list[list[int]] = field(default_factory=list)  # [start, end) of each observation in tokens
    calls: int = 0  # tool calls made
    pending: bool = False  # the last segment ended in a tool call that is not answered yet

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def model_mask(self) -> list[bool]:
        """(T,) True at the tokens the model produced, False inside observations."""
        mask = [True] * len(self.tokens)
        for a, b in self.obs_spans:
            mask[a:b] = [False] * (b - a)
        return mask

    def segment_start(self) -> int:
        """Where the current model segment begins (after the last observation)."""
        return self.obs_spans[-1][1] if self.obs_spans else 0


@dataclass
class Group:
    """The n samples of one prompt; complete when all are finished. `row` is the data row."""
    prompt_id: int
    row: dict
    samples: list[Trajectory]
    scores: list | None = None  # [(reward, info)] per sample once scored (keep_group may do it early)

    @property
    def complete(self) -> bool:
        return all(t.finished for t in self.samples)


def request_seed(run_seed: int, prompt_id: int, sample: int, segment: int) -> int:
    """A per-request sampling seed from (run seed, prompt, sample, segment): the same tokens
    whatever else is in the batch, which makes a resumed run repeat an uninterrupted one."""
    h = hashlib.blake2b(f"{run_seed}/{prompt_id}/{sample}/{segment}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF


@dataclass
class RolloutStats:
    """What one collect() did; the trainer logs it."""
    engine_steps: int = 0
    busy_slot_steps: int = 0  # sum over engine steps of requests in flight
    max_in_flight: int = 0
    new_tokens: int = 0  # tokens generated this call
    aborted: int = 0  # requests aborted into the buffer
    restarted_stale: int = 0
    dropped_groups: int = 0  # complete groups keep_group rejected (dynamic sampling, accuracy filter)
    tool_calls: int = 0  # tool calls answered this call
    tool_reasons: dict = field(default_factory=dict)  # their outcome: ok, malformed, unknown_tool, timeout, ...
    tool_wait_s: float = 0.0  # time the loop waited for a tool answer that was due


class CoprisScheduler:
    """Partial-rollout scheduler. `draw_prompt()` -> (prompt_id, prompt_ids, row) gives new work."""

    def __init__(self, n: int, groups: int, concurrency: int, max_response_len: int, temperature: float,
                 top_p: float, stop_token_ids: list[int], seed: int, enabled: bool = True,
                 staleness_cap: int | None = None, forced_len=None, episodes=None):
        self.n, self.groups, self.enabled = n, groups, enabled
        self.P = concurrency if enabled else groups * n
        self.max_response_len, self.temperature, self.top_p = max_response_len, temperature, top_p
        self.stop_token_ids, self.seed = stop_token_ids, seed
        self.staleness_cap = staleness_cap
        self.forced_len = forced_len  # benchmarks/tests: (prompt_id, sample) -> response length, eos ignored
        self.buffer: list[Group] = []  # groups carried over: some samples finished, some partial
        self.episodes = episodes  # rollout/environments.Episodes: tool calls and observations (None: single-turn)

    def _limit(self, t: Trajectory) -> int:
        return self.max_response_len if self.forced_len is None else self.forced_len(t.prompt_id, t.sample)

    def _submit(self, engine, t: Trajectory) -> str:
        req_id = f"p{t.prompt_id}-s{t.sample}-g{t.segments}"
        stop = self.stop_token_ids + ([self.episodes.call_end] if t.env else [])
        params = engine.sampling(self._limit(t) - len(t.tokens), self.temperature, self.top_p,
                                 request_seed(self.seed, t.prompt_id, t.sample, t.segments),
                                 stop, ignore_eos=self.forced_len is not None)
        engine.add(req_id, t.prompt_ids + t.tokens, params)
        t.segments += 1
        return req_id

    def collect(self, engine, draw_prompt, version: int, keep_group=None,
                max_dropped: int = 1000) -> tuple[list[Group], RolloutStats]:
        """Run the engine until B groups are complete and kept; returns them (group rows consecutive).
        keep_group(group) -> bool, called once per group as it completes, can reject it (dynamic
        sampling: all rewards equal; PRIME: accuracy out of range); collection goes on until B are kept.
        More than max_dropped rejections in one call is an error (the filter rejects everything)."""
        self.stats = RolloutStats()
        done, open_groups = self._resume(engine, version, keep_group, max_dropped)
        rows = {g.prompt_id: g.row for g in open_groups}
        clock, tools = 0, []  # engine steps this call; [(due step, ticket, trajectory)] awaiting a tool's answer
        for g in open_groups:  # buffered while waiting for a tool: the call runs again
            tools += [(self.episodes.tool_steps, self._call(t, g.row), t) for t in g.samples if t.pending]
        waiting = [t for g in open_groups for t in g.samples if not t.finished and not t.pending]  # resumed first
        running: dict[str, Trajectory] = {}
        while True:
            if tools and tools[0][0] <= clock:
                waiting[:0] = self._answer(tools, clock, version)  # may finish trajectories (length)
            still_open = []
            for g in open_groups:
                if not g.complete:
                    still_open.append(g)
                elif self._accept(g, keep_group, max_dropped, engine, running):
                    done.append(g)
            open_groups = still_open
            if len(done) >= self.groups:
                break
            # sync mode: a new group only while fewer than B are open or kept (a rejected one is replaced)
            while len(running) < self.P and (waiting or self.enabled or len(open_groups) + len(done) < self.groups):
                if not waiting:
                    prompt_id, prompt_ids, row = draw_prompt()
                    env = self.episodes and self.episodes.env_of(row)
                    g = Group(prompt_id, row, [Trajectory(prompt_id, i, list(prompt_ids), env=env)
                                               for i in range(self.n)])
                    open_groups.append(g)
                    rows[prompt_id] = row
                    waiting = list(g.samples)
                t = waiting.pop(0)
                running[self._submit(engine, t)] = t
            if not running:
                if tools:  # nothing to decode: jump to the next answer
                    clock = tools[0][0]
                    continue
                raise RuntimeError(f"CoPRIS collect: nothing in flight and nothing to draw with {len(done)} of "
                                   f"{self.groups} groups kept (concurrency={self.P}, {len(open_groups)} open)")
            self.stats.max_in_flight = max(self.stats.max_in_flight, len(running))
            self.stats.busy_slot_steps += len(running)
            self.stats.engine_steps += 1
            for d in engine.step():
                t = running[d.req_id]
                t.tokens += d.token_ids
                t.logprobs += d.logprobs
                t.versions += [version] * len(d.token_ids)
                self.stats.new_tokens += len(d.token_ids)
                if not d.finished:
                    continue
                del running[d.req_id]
                if t.env and d.finish_reason == "stop" and t.tokens and t.tokens[-1] == self.episodes.call_end:
                    t.calls += 1
                    if t.calls >= self.episodes.max_turns:  # no turn left to read the answer in
                        t.finish_reason = "max_turns"
                    else:
                        t.pending = True
                        tools.append((clock + self.episodes.tool_steps, self._call(t, rows[t.prompt_id]), t))
                else:
                    t.finish_reason = d.finish_reason or "stop"
            clock += 1
        engine.abort(list(running))
        for _, ticket, _ in tools:  # buffered with pending: their calls run again at the next collect
            self.episodes.discard(ticket)
        self.stats.aborted = len(running)
        self.buffer = open_groups + done[self.groups:]
        return done[:self.groups], self.stats

    def _call(self, t: Trajectory, row: dict) -> int:
        """Start the tool call that ends t's current segment; -> its ticket."""
        return self.episodes.submit(t.env, row, t.tokens[t.segment_start():])

    def _answer(self, tools: list, clock: int, version: int) -> list[Trajectory]:
        """Append the answers due by `clock` (waiting for them if needed) as observations; -> the trajectories to
        resubmit, in call order. An answer that does not fit in max_response_len ends its trajectory (length)."""
        ready = []
        while tools and tools[0][0] <= clock:
            _, ticket, t = tools.pop(0)
            t0 = time.perf_counter()
            ids, reason = self.episodes.result(ticket)
            self.stats.tool_wait_s += time.perf_counter() - t0
            self.stats.tool_calls += 1
            self.stats.tool_reasons[reason] = self.stats.tool_reasons.get(reason, 0) + 1
            t.pending = False
            if len(t.tokens) + len(ids) >= self._limit(t):
                t.finish_reason = "length"
                continue
            t.obs_spans.append([len(t.tokens), len(t.tokens) + len(ids)])
            t.tokens += ids
            t.logprobs += [0.0] * len(ids)
            t.versions += [version] * len(ids)
            ready.append(t)
        return ready

    def _resume(self, engine, version: int, keep_group, max_dropped: int) -> tuple[list[Group], list[Group]]:
        """Split the buffer into (complete and kept, open). First the unfinished trajectories are
        prepared: one whose first token is more than staleness_cap versions old restarts from
        scratch; one already at its length limit finishes as truncated, and a group that completes
        this way goes through keep_group like any other."""
        done, open_groups = [], []
        for g in self.buffer:
            if g.complete:  # kept by keep_group when it completed last call
                done.append(g)
                continue
            for t in g.samples:
                if t.finished:
                    continue
                if self.staleness_cap is not None and t.versions and version - t.versions[0] > self.staleness_cap:
                    t.tokens, t.logprobs, t.versions, t.old_logprobs = [], [], [], []
                    t.obs_spans, t.calls, t.pending = [], 0, False
                    self.stats.restarted_stale += 1
                elif len(t.tokens) >= self._limit(t) and not t.pending:
                    t.finish_reason = "length"
            if not g.complete:
                open_groups.append(g)
            elif self._accept(g, keep_group, max_dropped, engine, {}):
                done.append(g)
        self.buffer = []
        return done, open_groups

    def _accept(self, g: Group, keep_group, max_dropped: int, engine, running: dict) -> bool:
        """keep_group's verdict on a group that just completed; rejections are counted, and past
        max_dropped the call fails (after aborting what runs)."""
        if keep_group is None or keep_group(g):
            return True
        self.stats.dropped_groups += 1
        if self.stats.dropped_groups > max_dropped:
            engine.abort(list(running))
            raise RuntimeError(f"keep_group rejected {self.stats.dropped_groups} groups in one step "
                               f"(every group filtered?): check the reward or the filter range")
        return False

    # -- resumable state ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The partial buffer as plain data (JSON-safe when rows and score infos are); it shares the
        trajectories' lists, so save it before the next collect."""
        return {"buffer": [{"prompt_id": g.prompt_id, "row": g.row, "samples": [vars(t) for t in g.samples],
                            "scores": g.scores} for g in self.buffer]}

    def load_state_dict(self, state: dict) -> None:
        """Restore the buffer; scores come back as (reward, info) tuples whatever the container did."""
        self.buffer = [Group(g["prompt_id"], g["row"], [Trajectory(**t) for t in g["samples"]],
                             None if g["scores"] is None else [tuple(s) for s in g["scores"]])
                       for g in state["buffer"]]

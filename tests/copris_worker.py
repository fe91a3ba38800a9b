"""Drive CoPRIS collect() on the real CPU engine through two stages (a weight push between them) and
print what tests/test_copris.py checks as one JSON line. Run: python tests/copris_worker.py MODEL_DIR"""
import json
import math
import random
import sys

import torch
from transformers import AutoModelForCausalLM

from rollout.copris import CoprisScheduler, request_seed
from rollout.vllm_engine import EngineConfig, RolloutEngine

N, B, P, MAX_LEN = 4, 2, 8, 64


class RecordingEngine:
    """The real engine, recording requests in flight at each step and each request's tokens."""

    def __init__(self, engine):
        self.engine, self.in_flight, self.counts, self.segments = engine, set(), [], {}

    def sampling(self, *a, **k):
        return self.engine.sampling(*a, **k)

    def add(self, req_id, prompt_ids, params):
        self.in_flight.add(req_id)
        self.segments[req_id] = []
        self.engine.add(req_id, prompt_ids, params)

    def step(self):
        self.counts.append(len(self.in_flight))
        deltas = self.engine.step()
        for d in deltas:
            self.segments[d.req_id] += d.token_ids
            if d.finished:
                self.in_flight.discard(d.req_id)
        return deltas

    def abort(self, req_ids):
        self.engine.abort(req_ids)
        self.in_flight -= set(req_ids)


def forced_len(prompt_id, sample):  # long-tailed lengths, 4..MAX_LEN
    r = random.Random(request_seed(0, prompt_id, sample, -1))
    return max(4, min(MAX_LEN, int(8 * math.exp(r.gauss(0, 1.0)))))


def logp_under(model, prompt, tokens):
    with torch.no_grad():
        ids = torch.tensor([prompt + tokens])
        lp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].double(), -1)
    return lp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def main(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eng = RecordingEngine(RolloutEngine(EngineConfig(model_dir, max_model_len=128, seed=0), distributed=False))
    drawn = []

    def draw():
        pid = len(drawn)
        drawn.append(pid)
        return pid, [5 + pid % 50, 6, 7, 8], {"id": pid}

    out = {}
    sched = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, forced_len=forced_len)
    weights = {0: {n: p.clone() for n, p in model.state_dict().items()}}
    g1, s1 = sched.collect(eng, draw, version=0)
    out["stage1"] = {"groups": len(g1), "aborted": s1.aborted, "buffer_groups": len(sched.buffer),
                     "unstarted": sum(t.segments == 0 for g in sched.buffer for t in g.samples)}
    # policy version 1: perturbed weights pushed into the engine
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    weights[1] = {n: p.clone() for n, p in model.state_dict().items()}
    eng.engine.push_weights(((n, p) for n, p in model.named_parameters()))
    g2, s2 = sched.collect(eng, draw, version=1)
    out["stage2"] = {"groups": len(g2), "aborted": s2.aborted}
    out["counts_max"], out["counts_min"] = max(eng.counts), min(eng.counts)
    groups = g1 + g2
    out["groups_ok"] = all(len(g.samples) == N and g.complete and [t.sample for t in g.samples] == list(range(N))
                           and all(t.prompt_id == g.prompt_id for t in g.samples) for g in groups)
    out["lengths_ok"] = all(len(t.tokens) == forced_len(t.prompt_id, t.sample) for g in groups for t in g.samples)
    # resumed trajectories: tokens == concatenation of their segments; versions and log-probs per stage
    resumed = [t for g in g2 + sched.buffer for t in g.samples if t.segments >= 2 and 0 in t.versions and 1 in t.versions]
    out["resumed"] = len(resumed)
    out["concat_ok"] = all(t.tokens == sum((eng.segments[f"p{t.prompt_id}-s{t.sample}-g{k}"] for k in range(t.segments)), [])
                           for t in resumed)
    err = 0.0
    for v in (0, 1):
        model.load_state_dict(weights[v])
        for t in resumed:
            ref = logp_under(model, t.prompt_ids, t.tokens)
            err = max([err] + [abs(a - b) for a, b, ver in zip(ref, t.logprobs, t.versions) if ver == v])
    out["stage_logprob_max_err"] = err
    # the buffer survives a save/load round trip (the resumable state)
    state = json.loads(json.dumps(sched.state_dict()))
    other = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, forced_len=forced_len)
    other.load_state_dict(state)
    out["buffer_roundtrip_ok"] = other.state_dict() == sched.state_dict() and len(other.buffer) == len(sched.buffer)
    # staleness cap 0: partial trajectories from version 1 restart at version 3
    sched.staleness_cap = 0
    partial_before = sum(len(t.tokens) > 0 and not t.finished for g in sched.buffer for t in g.samples)
    sched.collect(eng, draw, version=3)
    out["restarted_stale"], out["partial_before"] = sched.stats.restarted_stale, partial_before
    # dynamic sampling: a filter rejecting odd prompt ids; collection goes on until B are kept, at P
    eng.counts.clear()
    dyn = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, forced_len=forced_len)
    g4, s4 = dyn.collect(eng, draw, version=4, keep_group=lambda g: g.prompt_id % 2 == 0)
    out["dynamic"] = {"groups": len(g4), "even": all(g.prompt_id % 2 == 0 for g in g4), "dropped": s4.dropped_groups,
                      "min_in_flight": min(eng.counts), "max_in_flight": max(eng.counts)}
    # synchronous mode through the same code: exactly B groups, nothing aborted, empty buffer
    sync = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, enabled=False, forced_len=forced_len)
    eng.counts.clear()
    g3, s3 = sync.collect(eng, draw, version=3)
    out["sync"] = {"groups": len(g3), "aborted": s3.aborted, "buffer": len(sync.buffer), "max_in_flight": max(eng.counts)}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

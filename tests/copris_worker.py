"""Drive CoPRIS collect() on the real CPU engine through two stages (a weight push between them) and
print raw per-group, per-sample and per-token values as one JSON line for tests/test_copris.py.
Run: python tests/copris_worker.py MODEL_DIR"""
import json
import math
import random
import sys

import torch
from transformers import AutoModelForCausalLM

import launch
from rollout.copris import CoprisScheduler, request_seed
from rollout.vllm_engine import EngineConfig, RolloutEngine

N, B, P, MAX_LEN = 4, 2, 8, 64


class RecordingEngine:
    """The real engine, recording vLLM's own count of unfinished requests at each step and the
    tokens each request streamed."""

    def __init__(self, engine):
        self.engine, self.counts, self.segments = engine, [], {}

    def sampling(self, *a, **k):
        return self.engine.sampling(*a, **k)

    def add(self, req_id, prompt_ids, params):
        self.segments[req_id] = []
        self.engine.add(req_id, prompt_ids, params)

    def step(self):
        self.counts.append(self.engine.num_unfinished())
        deltas = self.engine.step()
        for d in deltas:
            self.segments[d.req_id] += d.token_ids
        return deltas

    def abort(self, req_ids):
        self.engine.abort(req_ids)


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

    sched = CoprisScheduler(N, B, P, MAX_LEN, 1.0, 1.0, [], seed=0, forced_len=forced_len)
    weights = [{n: p.clone() for n, p in model.state_dict().items()}]
    g1, s1 = sched.collect(eng, draw, version=0)
    with torch.no_grad():  # policy version 1: perturbed weights pushed into the engine
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    weights.append({n: p.clone() for n, p in model.state_dict().items()})
    eng.engine.push_weights(((n, p) for n, p in model.named_parameters()))
    g2, s2 = sched.collect(eng, draw, version=1)
    # trajectories aborted with tokens in stage 1 and resumed in stage 2: their tokens, segments, and
    # log-probs under each version's weights
    resumed = [t for g in g2 + sched.buffer for t in g.samples
               if t.segments >= 2 and eng.segments[f"p{t.prompt_id}-s{t.sample}-g0"]]
    ref = []
    for w in weights:
        model.load_state_dict(w)
        ref.append([logp_under(model, t.prompt_ids, t.tokens) for t in resumed])
    out = {
        "P": P, "in_flight": eng.counts, "aborted": [s1.aborted, s2.aborted],
        "groups": [{"stage": stage, "prompt_id": g.prompt_id,
                    "samples": [{"prompt_id": t.prompt_id, "sample": t.sample, "len": len(t.tokens),
                                 "forced": forced_len(t.prompt_id, t.sample), "finish_reason": t.finish_reason}
                                for t in g.samples]}
                   for stage, gs in ((1, g1), (2, g2)) for g in gs],
        "resumed": [{"prompt_id": t.prompt_id, "sample": t.sample, "tokens": t.tokens, "versions": t.versions,
                     "logprobs": t.logprobs, "ref": [r[i] for r in ref],
                     "segments": [eng.segments[f"p{t.prompt_id}-s{t.sample}-g{k}"] for k in range(t.segments)]}
                    for i, t in enumerate(resumed)],
    }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

"""A real engine through multi-turn episodes next to a real FSDP2 policy; prints RESULT {json} for
tests/test_episodes.py. Run: python tests/episode_worker.py MODEL_DIR (a model whose tokenizer has the tool tokens).

A random model does not write tool calls, so the episode's call-end token is one it emits often (the most frequent
non-eos token of a few samples, handed to Episodes as call_end): every segment that ends on it is a tool call, a
tool worker answers "ok" (short()), and the answer is appended as an observation."""
import collections
import json
import sys

import torch
from transformers import AutoTokenizer

import launch
import model
from rollout.copris import CoprisScheduler
from rollout.environments import Episodes
from rollout.vllm_engine import EngineConfig, RolloutEngine


def short(env, row, segment):
    """The tool workers' function: a short answer whatever the segment says."""
    return "ok", {"reason": "ok"}


def main(model_dir):
    rank, world, device = model.init_distributed()
    policy = model.build_model(model_dir, device, trainable=True)
    engine = RolloutEngine(EngineConfig(model_dir, max_model_len=512, seed=0), distributed=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = tok.eos_token_id
    prompt = tok("Ann has 3 apples. Ann gets 4 more. How many apples now? Answer:", add_special_tokens=False)["input_ids"]
    sampled = engine.generate([prompt] * 8, [engine.sampling(48, 1.0, 1.0, i, [eos]) for i in range(8)])
    call_end = collections.Counter(t for toks, _ in sampled for t in toks if t != eos).most_common(1)[0][0]
    episodes = Episodes(tok, False, lambda row: "calculator", max_turns=3, max_obs_tokens=16, tool_steps=1,
                        timeout_s=10, workers=1, call_end=call_end, tool_fn=short)
    sched = CoprisScheduler(n=16, groups=1, concurrency=16, max_response_len=400, temperature=1.0, top_p=1.0,
                            stop_token_ids=[eos], seed=0, episodes=episodes)
    drawn = []

    def draw():
        drawn.append(len(drawn))
        return drawn[-1], prompt[:-1 - drawn[-1] % 3] + prompt[-1:], {"id": drawn[-1]}
    groups, stats = sched.collect(engine, draw, version=0)
    trajs = [t for g in groups for t in g.samples]
    logps = model.response_logprobs(policy, [model.Row(t.prompt_ids, t.tokens) for t in trajs], device, 1.0)
    out = {"call_end": call_end, "tool_reasons": stats.tool_reasons, "trajs": []}
    for t, lp in zip(trajs, logps):
        mask = torch.tensor(t.model_mask())
        engine_lp = torch.tensor(t.logprobs)
        out["trajs"].append({"spans": t.obs_spans, "calls": t.calls, "finish": t.finish_reason, "len": len(t.tokens),
                             "max_diff": float((lp.detach()[mask] - engine_lp[mask]).abs().max()),
                             "obs_logprobs_zero": bool((engine_lp[~mask] == 0).all())})
    episodes.close()
    engine.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
    launch.exit_process(0)

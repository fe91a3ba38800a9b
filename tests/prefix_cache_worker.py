"""A weight push reaches what the engine serves from its prefix cache (tests/test_prefix_cache.py): a prompt whose KV
blocks were cached under the old weights is sampled again after a push; its log-probs must be those of the pushed
policy (a trainer forward). Control: the same after new weights loaded without the cache reset, which must be off (so the
prompt does hit the cache and the check can see a stale one). Prints RESULT {json}.
Run: python tests/prefix_cache_worker.py MODEL_DIR"""
import json
import sys

import torch

import launch
import model
from rollout.vllm_engine import EngineConfig, RolloutEngine


def main(model_dir: str) -> None:
    _, _, device = model.init_distributed()
    policy = model.build_model(model_dir, device, trainable=False)
    engine = RolloutEngine(EngineConfig(model_dir, max_model_len=256, seed=0), distributed=True)
    prompt = [5 + (7 * i) % 300 for i in range(200)]  # over one KV block (128 tokens on CPU): its first is cached

    def max_diff() -> float:
        """Sample 8 tokens after `prompt`; -> the largest |engine log-prob - trainer log-prob| of them."""
        toks, lps = engine.generate([prompt], [engine.sampling(8, 1.0, 1.0, 123, [], ignore_eos=True)])[0]
        with torch.no_grad():
            (want,) = model.response_logprobs(policy, [model.Row(prompt, toks)], device, 1.0)
        return float((want.double() - torch.tensor(lps, dtype=torch.float64)).abs().max())

    def perturb() -> None:
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 0.05)

    out = {"before_push": max_diff()}  # the checkpoint's weights; the prompt's blocks are cached from here on
    perturb()
    engine.push_weights(model.full_named_tensors(policy))
    out["after_push"] = max_diff()
    perturb()
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": model.full_named_tensors(policy),
                                                        "is_checkpoint_format": True})
    out["without_reset"] = max_diff()
    engine.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
    launch.exit_process(0)  # see its docstring: a finished worker must not abort in teardown

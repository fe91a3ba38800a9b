"""trainer.py with CUDA behaviour that decides correctness emulated on CPU (a test fixture, not product code).

    python tests/gpu_semantics.py [--nproc_per_node N] --config ... [--key=value ...]   # as trainer.py

Set by environment variables (tests/test_gpu_semantics.py):
- GPU_SLEEP=1: the engine's sleep(level=2) discards its weights as vLLM's does on CUDA: they are overwritten with
  noise, and until the next push_weights any request added to the engine fails loudly ("sampling from discarded
  weights"). On a real GPU a wake without a push serves uninitialised memory; here a run that forgets the push
  either stops with that error or samples from noise.
- NONFINITE_STEPS=2,5: the policy's updates in these RL steps see a non-finite gradient norm (the update is
  skipped, as after an overflow).
"""
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open

import launch
import trainer
from rollout.vllm_engine import RolloutEngine


def discard_on_sleep() -> None:
    real_sleep, real_push, real_add = RolloutEngine.sleep, RolloutEngine.push_weights, RolloutEngine.add

    def noise(model_path: str):
        g = torch.Generator().manual_seed(1234)
        for f in sorted(Path(model_path).glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for name in st.keys():
                    yield name, torch.randn(st.get_slice(name).get_shape(), generator=g)

    def sleep(self):
        real_sleep(self)
        if self.sleep_level == 2:
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": noise(self.llm.llm_engine.model_config.model), "is_checkpoint_format": True})
            self.llm.reset_prefix_cache()
            self.discarded = True

    def push_weights(self, named_tensors):
        real_push(self, named_tensors)
        self.discarded = False

    def add(self, req_id, prompt_ids, params):
        if getattr(self, "discarded", False):
            raise RuntimeError("sampling from discarded weights: the engine slept at level 2 and nothing was pushed")
        real_add(self, req_id, prompt_ids, params)
    RolloutEngine.sleep, RolloutEngine.push_weights, RolloutEngine.add = sleep, push_weights, add


def nonfinite_updates(steps: set[int]) -> None:
    real_step, real_clip, now = trainer.rl_step, trainer.clip_grad_norm, [0]

    def rl_step(run, step):
        now[0] = step
        return real_step(run, step)

    def clip_grad_norm(model, max_norm):
        norm = real_clip(model, max_norm)
        return float("nan") if now[0] in steps else norm
    trainer.rl_step, trainer.clip_grad_norm = rl_step, clip_grad_norm


if __name__ == "__main__":
    if os.environ.get("GPU_SLEEP") == "1":
        discard_on_sleep()
    if os.environ.get("NONFINITE_STEPS"):
        nonfinite_updates({int(i) for i in os.environ["NONFINITE_STEPS"].split(",")})
    launch.exit_process(trainer.main(sys.argv[1:]))

"""Hot-path ops of the trainer (DESIGN.md section 4): Triton kernels on CUDA, torch reference paths on CPU."""
from kernels.fused_ppo import fused_logits_ppo_loss
from kernels.ppo_loss import ppo_loss
from kernels.prm_reward import discounted_returns, implicit_prm_rewards
from kernels.token_logprobs import token_logprobs

__all__ = ["token_logprobs", "ppo_loss", "implicit_prm_rewards", "discounted_returns", "fused_logits_ppo_loss"]

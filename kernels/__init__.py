"""Hot-path ops of the trainer (DESIGN.md section 4): Triton kernels on CUDA, torch reference paths on CPU.

token_logprobs, ppo_loss, implicit_prm_rewards, discounted_returns: the section 4 contract.
fused_logits_ppo_loss: logits -> PPO loss (+ entropy bonus) with dlogits written in the forward kernel.
fused_linear_ppo_loss, linear_token_logprobs: hidden states + lm_head weight -> PPO loss / log-probs, chunked,
never materialising the (N, V) logits; token_weights: the aggregation weights of packed tokens.
impl="auto" picks Triton for CUDA tensors and the torch path otherwise; "triton" also runs on CPU tensors
(Triton's interpreter) on a machine without CUDA.
"""
from kernels.fused_linear import fused_linear_ppo_loss, linear_token_logprobs
from kernels.fused_ppo import fused_logits_ppo_loss
from kernels.ppo_loss import ppo_loss, token_weights
from kernels.prm_reward import discounted_returns, implicit_prm_rewards
from kernels.token_logprobs import token_logprobs

__all__ = ["token_logprobs", "ppo_loss", "implicit_prm_rewards", "discounted_returns", "fused_logits_ppo_loss",
           "fused_linear_ppo_loss", "linear_token_logprobs", "token_weights"]

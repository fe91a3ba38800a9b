"""RL post-training for LLMs in one file: a colocated vLLM rollout engine and an FSDP2 policy per rank.

    python trainer.py --nproc_per_node N --config configs/X.yaml [--key=value ...]    # launcher (launch.py)
    torchrun --nproc_per_node N trainer.py --config configs/X.yaml [--key=value ...]  # the same, plain torchrun

One RL step (rl_step, top to bottom): push the policy's weights into the engine if they changed -> CoPRIS rollout
(partial, concurrency-controlled; or synchronous) -> engine sleeps -> rewards in a worker pool -> old log-probs
(cross-stage: earlier stages keep their values) -> advantages (GRPO, RLOO, PRIME, or GAE with a critic) -> PPO-clip
update over packed micro-batches -> metrics, checkpoint. `mode: sft` trains on prompt/completion pairs; `mode: eval`
only evaluates.

Engine groups (G = world / engine.tensor_parallel_size, t consecutive ranks each, one vLLM engine sharded over
them) own disjoint prompts and collect batch_groups / G groups in lockstep; a group (n samples of one prompt)
never spans ranks in training: each rank trains batch_groups / world whole groups. Parsing is in config.py, rows in
data/rows.py, logs and plots in report.py, the launcher in launch.py.
"""
import functools
import itertools
import json
import math
import os
import random
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import config  # before torch, transformers and vLLM load: --help, and the OpenMP wait

if __name__ == "__main__" and {"--help", "-h"} & set(sys.argv[1:]):
    config.print_help(__file__)
config.openmp_wait()  # before torch loads OpenMP: spin on a quiet machine, sleep beside other jobs
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import AutoConfig

import launch
import report
from config import ConfigError, CriticConfig, RewardConfig
from launch import check_run_dir, load_checkpoint, save_checkpoint, start_run_dir
from data.rows import (PromptSource, check_chat_template, load_rows, load_tokenizer, serving_tokenizer, tokenize_prompts,
                       tokenize_sft)
from kernels import fused_linear_ppo_loss
from kernels.ppo_loss import token_weights
from model import (DUMMY, EngineGroup, Row, adapter_disabled, all_gather_list, all_max, all_sum, build_model,
                   check_lockstep, clip_grad_norm, compute_dtype, engine_group, export_hf, init_distributed,
                   make_optimizer, mean_nll, micro_batches, packed_forward, push_adapter, push_full, response_logprobs,
                   rng_state, set_rng_state, shared_map, split_rows, sum_over_ranks, targets_of, trainable_state)
from rewards.advantages import Overlong, accuracy_filter, grpo_advantages, rloo_advantages
from rewards.critic import Critic, hold_policy
from rewards.models import RewardModels
from rewards.pool import RewardPool
from rewards.prime import Prime
from rewards.sandbox import SandboxUnavailable, require_isolation
from rewards.user import check_imports, component_metrics, context, reward_pool
from tasks import NOT_SCORED, UNTRUSTED_TASKS, env_of, preflight as reward_preflight
from rollout import mismatch
from rollout.copris import CoprisScheduler, Trajectory
from rollout.environments import Episodes, Observations, TemplateError

if typing.TYPE_CHECKING:
    from rollout.vllm_engine import RolloutEngine

# ---------------------------------------------------------------------------------------------
# Config: every knob, with its default and what it does (parsing and checks: config.py)
# ---------------------------------------------------------------------------------------------


@dataclass
class EngineConfig:
    max_num_seqs: int = 256  # vLLM's running-batch limit; must be >= copris.concurrency
    gpu_memory_utilization: float = 0.4  # CUDA: share of GPU memory vLLM takes while awake
    enforce_eager: bool = True  # no CUDA graphs / compile: fast start; set false for long GPU runs
    tensor_parallel_size: int = 1  # t: ranks sharing one vLLM engine (tensor parallel); world / t engine groups


@dataclass
class CoprisConfig:
    enabled: bool = True  # false: synchronous rollout, every request runs to the end
    concurrency: int = 64  # P: requests in flight per engine (the paper's default is 1024 per node)
    staleness_cap: int | None = None  # restart a partial trajectory sampled more than k versions ago; null = never
    old_logprob_source: Literal["trainer", "rollout"] = "trainer"  # trainer: the FSDP policy per stage | rollout: engine's
    dynamic_sampling: bool = False  # drop complete groups whose rewards are all equal and keep collecting


@dataclass
class PrimeConfig:
    enabled: bool = False  # PRIME implicit process rewards with an online PRM (Cui et al.)
    beta: float = 0.05  # r_t = beta * (log pi_prm(y_t) - log pi_ref(y_t))
    lr: float = 1e-6  # PRM AdamW learning rate (paper: 1e-6; policy 5e-7)
    ref: Literal["frozen", "policy"] = "frozen"  # frozen: a frozen copy of the initial policy | policy: old log-probs
    update: Literal["after", "before"] = "after"  # after: rewards from the pre-update PRM (one forward) | before
    filter_low: float = 0.2  # keep groups whose accuracy is >= filter_low (and draw more until B are kept)
    filter_high: float = 0.8  # keep groups whose accuracy is <= filter_high
    outcome_coef: float = 1.0  # weight of the outcome RLOO advantage
    process_coef: float = 1.0  # weight of the process (implicit reward) advantage
    gamma: float = 1.0  # discount of the process returns


@dataclass
class CorrectionConfig:  # rollout-training mismatch (rollout/mismatch.py): TIS, MIS/IcePop, Seq-TIS/Seq-MIS
    mode: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask",
                  "sequence_geo_mask"] = "none"  # weight per token or sequence from the engine/trainer ratio; none = off
    threshold: float = 2.0  # C: truncate at C; mask above C (sequence modes: the product of the token ratios)
    low: float = 0.5  # mask modes: below this is masked too (sequence_geo_mask: bounds near 1, e.g. 0.999 / 1.001)


@dataclass
class ToolsConfig:  # rows whose task names an environment run as multi-turn episodes (rollout/environments.py)
    max_turns: int = 4  # model segments per episode; a tool call in the last one ends it (finish_reason max_turns)
    max_obs_tokens: int = 256  # a tool's output beyond this many tokens is cut, and the model is told so
    tool_steps: int = 1  # an answer joins its trajectory this many engine steps after the call (reproducible runs)
    timeout_s: float = 30.0  # wall limit per tool call; over it the model reads a timeout error
    workers: int = 2  # tool worker processes per rank


@dataclass
class OverlongConfig:  # DAPO's overlong handling (Yu et al. 2025; rewards/advantages.py)
    buffer: int = 0  # L_cache: reward -= 0..1 over the last L_cache tokens of max_response_len (1 if cut); 0 = off
    filter: bool = False  # responses cut at max_response_len contribute no loss (TRL's mask_truncated_completions)
    penalty_factor: float = 1.0  # the penalty's scale: reward += factor * (0..-1) (verl overlong_buffer.penalty_factor)


@dataclass
class LoraConfig:
    rank: int = 0  # r of the policy's LoRA adapters (PEFT); 0 = off: full fine-tuning
    alpha: float = 16.0  # the adapter's update is (alpha / r) B A x
    dropout: float = 0.0  # dropout on the adapter's input, in the update's (gradient) forwards only
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])  # modules given adapters
    # (attention and MLP; lm_head is refused)
    export_merged: bool = False  # also export export/merged: a full HF folder with the adapter folded in


@dataclass
class Config:
    mode: Literal["rl", "sft", "eval"] = "rl"  # eval: held-out metrics of model_path on eval_data, nothing trained
    model_path: str = ""  # local HF model folder (config.json, safetensors, tokenizer files)
    train_data: str = ""  # .jsonl or .parquet; rl rows: prompt + the task's keys, or verl's layout; sft: prompt, completion
    eval_data: str = ""  # held-out rows like train_data (per data_source metrics); "" = no evaluation
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    chat_template_file: str = ""  # a jinja chat template for training and the export (replaces the tokenizer's)
    run_dir: str = "runs/default"  # metrics.jsonl, config.yaml, train.log, checkpoints/, export/ and plot.png
    overwrite: bool = False  # delete an existing run in run_dir first (without it, a used run_dir is refused)
    seed: int = 0  # data order, sampling seeds, init
    max_prompt_len: int = 256  # prompts longer than this (tokens) are skipped and counted
    max_response_len: int = 512  # tokens per response; the engine's max_model_len is the sum
    n_samples: int = 8  # K: samples per prompt (group size)
    batch_groups: int = 16  # B: prompt groups per RL step over all ranks (divisible by the world size)
    temperature: float = 1.0  # sampling temperature; the loss's log-probs use the same one
    top_p: float = 1.0  # nucleus sampling (< 1 is refused with a mismatch correction or rollout old log-probs)
    top_k: int = -1  # sample from the k likeliest tokens; -1 = off (refused like top_p < 1: docs/algorithms.md)
    min_p: float = 0.0  # drop tokens below min_p x the likeliest one's probability; 0 = off (refused like top_k)
    steps: int = 100  # RL steps, or SFT optimizer steps when sft_epochs is 0
    lr: float = 1e-6  # AdamW learning rate (peak)
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warmup over this many `steps`, then lr_schedule
    lr_schedule: Literal["auto", "constant", "linear", "cosine"] = "auto"  # after warmup: linear / cosine decay to
    # 10% of lr at the last step; auto = constant (RL), cosine (SFT). It advances once per RL step (verl's unit:
    # every pass and mini-batch of a step take its lr) and once per SFT optimizer step
    grad_clip: float = 1.0  # max global grad norm
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # the update's compute dtype, and the engine's and weight
    # push's: bf16 = fp32 weights, grads and AdamW state, bf16 forward/backward (FSDP2 mixed precision; CPU autocast
    # in one CPU process); auto: bf16 on CUDA and on CPUs with bf16 instructions for hidden size >= 512, else fp32
    # (docs/speed.md)
    token_budget: int = 8192  # micro-batch size in real tokens (rows packed, no padding; a shared prompt counts once)
    mini_batches: int = 1  # optimizer steps per pass over an RL batch (1 = on-policy up to partial rollout); split
    # evenly, at most the rows a rank trains per step (batch_groups / ranks x n_samples)
    ppo_epochs: int = 1  # passes over each RL batch (TRL num_iterations, verl ppo_epochs); later ones reshuffled
    advantage: Literal["grpo", "rloo", "gae"] = "grpo"  # group baseline, or gae: PPO with a critic (critic.*);
    # PRIME, when on, replaces grpo / rloo
    scale_std: Literal["group", "batch", "none"] = "group"  # GRPO: divide by the std of the group's or batch's rewards
    clip_low: float = 0.2  # PPO clip: ratio >= 1 - clip_low
    clip_high: float = 0.28  # PPO clip: ratio <= 1 + clip_high (asymmetric, DAPO clip-higher)
    dual_clip: float | None = None  # dual clip c (e.g. 3 or 10) for negative advantages; null = off
    kl_coef: float = 0.0  # k3 KL to a frozen reference copy of the initial policy; 0 = no reference
    objective: Literal["ppo", "gspo", "gspo_token", "cispo"] = "ppo"  # policy term (docs/algorithms.md)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",  # over all ranks; -norm: Dr. GRPO
                      "seq-mean-token-sum-norm"] = "token-mean"
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * aggregated token entropy
    sft_epochs: int = 1  # SFT passes over train_data (0: run `steps` optimizer steps)
    sft_batch_rows: int = 64  # SFT rows per optimizer step over all ranks
    eval_every: int = 10  # evaluate every k RL steps (and before the first and after the last); 0 = ends only
    eval_samples: int = 4  # k sampled completions per eval prompt for mean@k / pass@k (plus one greedy)
    log_samples: int = 0  # RL: write this many of each step's completions (rank 0's) to run_dir/samples.jsonl
    export_every: int = 0  # HF export every k steps; 0 = at the end only
    export_dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # the export's weights; auto: bf16 on CUDA, else fp32
    save_every: int = 10  # resumable checkpoint every k steps, after the last one and on SIGTERM/SIGINT; 0 = not periodic
    keep_checkpoints: int = 2  # complete checkpoints kept (oldest deleted)
    resume: str = "off"  # off | auto (newest complete checkpoint in run_dir, if any) | path to a checkpoint
    max_skipped_updates: int = 3  # stop with an error after this many consecutive non-finite updates
    dist_timeout_s: float = 3600.0  # a rank waiting longer than this for the others (a slow reward, a big export) fails
    # the run; NCCL's default is 10 min, gloo's 30: RL steps with long Triton scoring need more
    tensorboard: bool = False  # also log to run_dir/tb (needs tensorboard installed)
    wandb_project: str = ""  # also log to this wandb project ("" = off; needs wandb installed)
    peak_tflops: float = 989.0  # per-GPU dense bf16 peak for MFU (H100/H200 SXM: 989)
    reward_workers: int = 1  # reward processes per rank
    reward_timeout_s: float = 10.0  # wall limit per sample; over it scores 0 and is counted
    sandbox_opt_out: bool = False  # run code/triton rewards without bubblewrap (rlimits only): accept the risk
    engine: EngineConfig = field(default_factory=EngineConfig)
    copris: CoprisConfig = field(default_factory=CoprisConfig)
    prime: PrimeConfig = field(default_factory=PrimeConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite updates): printed without a traceback, exit code 3."""


def load_config(argv: list[str], world: int | None = None) -> Config:
    """--config file.yaml then --key=value overrides -> a checked Config (config.py); world defaults to WORLD_SIZE."""
    cfg = config.load(Config, argv, world or int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.correction.mode != "none" and cfg.copris.old_logprob_source == "rollout":
        raise ConfigError("correction.mode needs copris.old_logprob_source: trainer (with rollout old log-probs "
                          "there is no second distribution to correct against)")
    return cfg


# ---------------------------------------------------------------------------------------------
# Run state: built once per mode; state_dict() holds everything a resume needs
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    cfg: Config
    rank: int
    world: int
    device: torch.device
    run_dir: Path
    tok: typing.Any  # transformers tokenizer
    policy: torch.nn.Module | None = None  # FSDP2 policy (None in eval mode)
    optim: torch.optim.Optimizer | None = None
    sched: torch.optim.lr_scheduler.LambdaLR | None = None
    ref: torch.nn.Module | None = None  # frozen FSDP2 copy of the initial policy (k3 KL, PRIME); LoRA: the policy
    engine: "RolloutEngine | None" = None
    eg: EngineGroup | None = None  # this rank's engine group (setup() builds it; None: t = 1)
    pool: RewardPool | None = None
    reward_models: RewardModels | None = None  # reward.models: frozen replicas on this rank (None: none)
    episodes: Episodes | None = None  # multi-turn rows: tool calls and observations (None: every row single-turn)
    scheduler: CoprisScheduler | None = None
    prompts: PromptSource | None = None
    eval_rows: list = field(default_factory=list)
    # strategies picked at setup (rl_step calls them; none compares a config string)
    push: typing.Callable | None = None  # weight push to the engine: every tensor, or with LoRA the adapter alone
    keep_group: typing.Callable | None = None  # CoPRIS group filter: dynamic sampling, PRIME's accuracy range
    fill_old: typing.Callable | None = None  # old log-probs: trainer (upfront or from the update) or rollout
    advantages: typing.Callable | None = None  # GRPO, RLOO, PRIME (a Prime object) or GAE (rewards/critic.py: a Critic)
    correct: typing.Callable | None = None  # mismatch correction weights, or None
    overlong: typing.Callable | None = None  # DAPO's overlong shaping / filtering (rewards.advantages.Overlong)
    fresh: bool = False  # trainer old log-probs: the first mini-batch takes this version's tokens on-policy (ratio 1)
    agg: typing.Callable | None = None  # loss_agg's token weights (kernels.ppo_loss.token_weights)
    sft_data: list = field(default_factory=list)  # SFT: (prompt ids, completion ids, assistant-token mask or None)
    sft_order: list = field(default_factory=list)  # SFT: row indices not yet drawn this epoch
    sft_gen: torch.Generator = field(default_factory=torch.Generator)  # SFT: epoch shuffles
    policy_version: int = 0  # optimizer steps taken
    engine_version: int = 0  # policy version the engine's weights hold
    counters: dict = field(default_factory=dict)  # run totals (reward timeouts, skipped updates...)
    sinks: list = field(default_factory=list)  # rank 0: extra metric sinks (tensorboard, wandb): f(metrics)
    compute: torch.dtype = torch.float32  # precision's dtype (model.compute_dtype): the update's, engine's and push's

    # fields state_dict() leaves out on purpose: rebuilt from the config, or derived (tests check the list)
    STATELESS = ("cfg", "rank", "world", "device", "run_dir", "tok", "ref", "engine", "eg", "pool", "reward_models",
                 "episodes", "eval_rows", "keep_group", "push", "fill_old", "correct", "overlong", "fresh", "agg",
                 "sft_data", "engine_version", "sinks", "compute")

    def __post_init__(self):
        """Strategies that follow from the config alone."""
        self.agg = self.agg or functools.partial(token_weights, agg=self.cfg.loss_agg,
                                                 max_len=self.cfg.max_response_len)
        self.push = self.push or (push_adapter if self.cfg.lora.rank else push_full)
        self.eg = self.eg or EngineGroup(self.rank, self.world, 0, 1, None)  # t = 1: every rank its own engine

    def state_dict(self, step: int) -> tuple[dict, dict, dict]:
        """-> (sharded: model and optimizer states for torch.distributed.checkpoint, this rank's: RNG, and on the
        first rank of an engine group the group's prompt cursor and CoPRIS buffer (identical on its ranks: saved
        once), shared: step, versions, counters, LR schedule and SFT order)."""
        model, optim = get_state_dict(self.policy, self.optim, options=trainable_state(self.policy))
        sharded = {"policy": model, "optim": optim}
        if isinstance(self.advantages, Prime):
            sharded["prime"] = self.advantages.state_dict()
        if isinstance(self.advantages, Critic):  # advantage: gae
            sharded["critic"] = self.advantages.state_dict()
        mine = rng_state(self.device)
        if self.eg.member == 0:
            mine.update(prompts=self.prompts and self.prompts.state_dict(),
                        scheduler=self.scheduler and self.scheduler.state_dict())
        shared = {"step": step, "world": self.world, "tensor_parallel_size": self.eg.size,
                  "policy_version": self.policy_version, "counters": self.counters,
                  "sched": self.sched.state_dict(), "sft_order": self.sft_order,
                  "sft_gen": self.sft_gen.get_state().tolist()}
        return sharded, mine, shared

    def load_state_dict(self, sharded: dict, mine: dict, shared: dict) -> int:
        """Inverse of state_dict (sharded already filled in place by dcp.load); -> the step it was taken after."""
        set_state_dict(self.policy, self.optim, model_state_dict=sharded["policy"], optim_state_dict=sharded["optim"],
                       options=trainable_state(self.policy))
        if isinstance(self.advantages, Prime):
            self.advantages.load_state_dict(sharded["prime"])
        if isinstance(self.advantages, Critic):
            self.advantages.load_state_dict(sharded["critic"])
        set_rng_state(mine, self.device)
        if self.prompts:
            self.prompts.load_state_dict(mine["prompts"])
        if self.scheduler:
            self.scheduler.load_state_dict(mine["scheduler"])
        self.policy_version, self.counters = shared["policy_version"], shared["counters"]
        self.sched.load_state_dict(shared["sched"])
        self.sft_order = shared["sft_order"]
        self.sft_gen.set_state(torch.tensor(shared["sft_gen"], dtype=torch.uint8))
        return shared["step"]


def optimizer_step(run: Run) -> tuple[float, bool]:
    """Clip, check finite, step (not the LR schedule: once per RL step). -> (grad norm, applied). A non-finite grad
    skips the update."""
    norm = clip_grad_norm(run.policy, run.cfg.grad_clip)
    applied = math.isfinite(norm)
    if applied:
        run.optim.step()
        run.policy_version += 1
        run.counters["consecutive_skips"] = 0
    else:
        run.counters["skipped_updates"] = run.counters.get("skipped_updates", 0) + 1
        run.counters["consecutive_skips"] = run.counters.get("consecutive_skips", 0) + 1
        if run.counters["consecutive_skips"] >= run.cfg.max_skipped_updates:
            raise TrainingError(f"{run.counters['consecutive_skips']} consecutive updates had a non-finite "
                                f"gradient norm ({norm}); stopping. Lower lr, check the data, or resume from "
                                f"the last checkpoint with different settings.")
    run.optim.zero_grad(set_to_none=True)
    return norm, applied


# ---------------------------------------------------------------------------------------------
# RL step, top to bottom
# ---------------------------------------------------------------------------------------------


def rl_step(run: Run, step: int) -> dict:
    """One RL step, its phases in order (DESIGN.md section 2); -> this step's metrics (every rank's figures)."""
    t, mem = report.Timer(), report.MemoryPeaks(run.device)
    with t("weight_push"):  # 1. the engine samples with the current policy
        pushed = push_weights_if_stale(run)
    version, lr = run.policy_version, run.sched.get_last_lr()[0]  # the update's learning rate (lr_schedule)
    with t("rollout"):  # 2. until B/G groups are complete (and kept) on this engine; the rest waits in the buffer
        groups, rstats = run.scheduler.collect(run.engine, run.prompts.draw, version=version, keep_group=run.keep_group)
    groups = training_share(run, groups)  # B/world whole groups: the engine group's ranks train disjoint ones
    mem.peak("rollout_peak")
    run.engine.sleep()  # 3. the engine gives the accelerator back to training
    mem.now("asleep")
    with t("reward"):  # 4. one reward per sample, (B,) in group order (a group filter scored them already)
        rewards, reasons = score_groups(run, groups)
        rewards, rm = run.reward_models(groups, rewards, lambda tr: model_text(run.tok, tr)) if run.reward_models \
            else (rewards, {})  # reward.models: + sum_j w_j score_j, every rank in lockstep
    stop_if_rewards_failed(run, step, groups)
    trajs = [tr for g in groups for tr in g.samples]
    with t("rank_wait"):  # the ranks meet: the time this rank waits for the slowest one's rollout and reward
        dist.barrier()
    with t("old_logprobs"):  # 5. cross-stage old log-probs of the trained and the buffered trajectories
        run.fill_old(run, trajs, [tr for g in run.scheduler.buffer for tr in g.samples])
    rows = [Row(tr.prompt_ids, tr.tokens, old_logprobs_of(tr),
                fresh=torch.tensor(tr.versions, dtype=torch.long) == version if run.fresh else None,
                mask=torch.tensor(tr.model_mask()) if tr.obs_spans else None) for tr in trajs]
    with t("advantages"):  # 6. advantages per token (GRPO / RLOO: a sample's; PRIME, gae: steps its PRM / critic)
        shaped, overlong = run.overlong(rows, rewards, [tr.finish_reason == "length" for tr in trajs]) \
            if run.overlong else (rewards, {})  # DAPO: length penalty added, truncated responses filtered out
        adv_stats = run.advantages(rows, shaped)
    if run.correct:  # rollout-training mismatch correction weights (TIS / MIS) of the model's tokens, detached
        for r, tr in zip(rows, trajs):
            m = model_tokens(r)
            r.weight = torch.zeros(len(r.response)).index_put_((m,), run.correct(r.old_logp[m],
                                                                                  torch.tensor(tr.logprobs)[m]))
            if not torch.isfinite(r.weight).all():  # nan: the old log-probs were not computed before the update
                raise RuntimeError("mismatch correction weights are not finite: old log-probs missing before the "
                                   "update (old_logprob_strategy must compute them upfront with a correction)")
    with t("update"):  # 7. PPO over mini_batches optimizer steps; fills the old log-probs the update computed
        ustats = hold_policy(run, rows) if getattr(run.advantages, "warming", False) else policy_update(run, rows)
    mem.peak("train_peak")
    report.write_samples(run, step, groups, lambda tr: model_text(run.tok, tr)) if run.cfg.log_samples else None
    return {"step": step, "push_bytes": pushed, **step_metrics(run, version, trajs, rewards, reasons, rstats, t.s),
            **ustats, **adv_stats, **overlong, **rm, **mismatch_metrics(run, rows, trajs), **mem.metrics,
            **component_metrics(run.pool, [i for g in groups for _, i in g.scores], all_sum, run.device),
            "lr": lr, **{f"time/{k}": v for k, v in t.s.items()}}  # 8. metrics


def push_weights_if_stale(run: Run) -> int:
    """Wake the engine and push the policy into it if stale (run.push: every weight or the LoRA adapter): its version
    is older, or a level-2 sleep discarded its weights (after eval, a skipped update or a resume alike); -> bytes."""
    stale = run.engine_version != run.policy_version or not run.engine.holds_weights
    pushed = run.push(run.policy, run.engine, None if run.compute == torch.float32 else run.compute) if stale else 0
    run.engine_version = run.policy_version
    run.engine.wake()
    return pushed


def training_share(run: Run, groups: list) -> list:
    """Check that the engine group's ranks collected the same tokens (one hash per rank, buffer included); -> this
    rank's share of the group's B/G groups: B/world consecutive whole groups (the groups as they are when t = 1)."""
    check_lockstep([[tr.prompt_id, *tr.tokens] for g in groups + run.scheduler.buffer for tr in g.samples], run.eg)
    k = len(groups) // run.eg.size
    return groups[run.eg.member * k:(run.eg.member + 1) * k]


def model_tokens(r: Row) -> torch.Tensor:
    """(T,) bool: the row's tokens the model produced (observations are context: no loss, KL or mismatch figure)."""
    return torch.ones(len(r.response), dtype=torch.bool) if r.mask is None else r.mask


def model_text(tok, tr: Trajectory) -> str:
    """What the model wrote: its segments decoded one by one and joined by newlines (observations left out, so a
    tool's output cannot earn the reward)."""
    bounds = [0, *[x for span in tr.obs_spans for x in span], len(tr.tokens)]
    return "\n".join(tok.decode(tr.tokens[a:b], skip_special_tokens=True) for a, b in zip(bounds[::2], bounds[1::2]))


def score_groups(run: Run, groups, eg: EngineGroup | None = None) -> tuple[torch.Tensor, dict]:
    """Score every sample not yet scored (one pool call); -> rewards (B,) in group order, reason counts. eg: groups
    the engine group's ranks all hold (in collect): each scores 1/t of the samples, all-gathered (scored once)."""
    todo = [g for g in groups if g.scores is None]
    flat = shared_map([(g.row, model_text(run.tok, t), context(g.row, t.env and episode_turns(run.tok, t), t.tokens,
                                                               run.policy_version, run.cfg))
                       for g in todo for t in g.samples], run.pool.score, eg)  # context: for reward.funcs
    for i, g in enumerate(todo):
        g.scores = flat[i * len(g.samples):(i + 1) * len(g.samples)]
    reasons: dict[str, int] = {}
    for g in groups:
        for _, info in g.scores:
            reasons[info["reason"]] = reasons.get(info["reason"], 0) + 1
    return torch.tensor([sc for g in groups for sc, _ in g.scores], dtype=torch.float32), reasons


def stop_if_rewards_failed(run: Run, step: int, groups) -> None:
    """Print one line (rank 0: console and train.log) when some reward of the step failed (report.failure_line). A
    step in which every sample's reward failed (on every rank) is a data or code bug, not a score: stop with the
    first failure and its data row rather than train on all-zero rewards."""
    line = report.failure_line(step, all_gather_list([report.reward_failures([i for g in groups for _, i in g.scores])]))
    report.say(run.rank, line)
    failed = [(g.row, info) for g in groups for _, info in g.scores if info["reason"] in NOT_SCORED]
    n_failed, n = all_sum([len(failed), sum(len(g.scores) for g in groups)], run.device)
    if n and n_failed == n:
        row, info = failed[0] if failed else ({}, {})
        fix = "that reward function" if "failed" in info else "the rows' answers or tests and the task's scorer (tasks.py)"
        raise TrainingError(f"every reward of this step failed ({int(n)} samples), e.g. {row.get('_where', '?')} "
                            f"(task {row.get('task')}): {info.get('reason')}: {info.get('error') or info.get('detail')}"
                            f"; check {fix}")


def informative_group(run: Run, group) -> bool:
    """Dynamic sampling's keep_group: score the group as it completes; keep it unless every sample got the
    same reward (its advantages would all be 0)."""
    score_groups(run, [group], run.eg)
    return len({sc for sc, _ in group.scores}) > 1


def accuracy_in_range(run: Run, group) -> bool:
    """PRIME's keep_group: score the group as it completes; keep it if its accuracy lies in
    [prime.filter_low, prime.filter_high] (CoPRIS then keeps collecting until B groups pass)."""
    score_groups(run, [group], run.eg)
    r = torch.tensor([sc for sc, _ in group.scores])
    return bool(accuracy_filter(r, len(r), run.cfg.prime.filter_low, run.cfg.prime.filter_high)[0])


def old_logprobs_of(tr: Trajectory) -> torch.Tensor:
    """(T,) a trajectory's old log-probs so far, nan for the tokens the update's own forward will supply."""
    old = torch.full((len(tr.tokens),), float("nan"))
    old[:len(tr.old_logprobs)] = torch.tensor(tr.old_logprobs[:len(tr.tokens)])
    return old


@torch.no_grad()
def fill_old_logprobs(run: Run, trajs: list[Trajectory], shared: list[Trajectory]) -> None:
    """Append to each trajectory's old_logprobs the values of the tokens sampled since its last fill, computed
    by the current policy (the one that sampled them, before the update). Earlier stages keep theirs. `shared` (the
    buffer, the same on the engine group's ranks): each computes 1/t of it with `trajs`, the new values all-gathered."""
    start = [len(t.old_logprobs) for t in shared]
    need = [t for t in trajs + shared[run.eg.member::run.eg.size] if len(t.old_logprobs) < len(t.tokens)]
    rows = [Row(t.prompt_ids, t.tokens) for t in need]
    for mb in micro_batches(rows, run.cfg.token_budget, run.device):
        logps = response_logprobs(run.policy, [rows[i] for i in mb], run.device, run.cfg.temperature)
        for i, logp in zip(mb, logps):
            need[i].old_logprobs += logp[len(need[i].old_logprobs):].tolist()
    tails = shared_map(list(zip(shared, start)), lambda share: [t.old_logprobs[s:] for t, s in share], run.eg)
    for t, s, tail in zip(shared, start, tails):
        t.old_logprobs[s:] = tail  # the values the group's rank that computed them got


def old_from_update(run: Run, trained: list[Trajectory], buffered: list[Trajectory]) -> None:
    """copris.old_logprob_source: trainer, mini_batches 1: tokens the current policy sampled get their old
    log-probs from the update's own forward (which runs before the policy changes); only the buffered partial
    trajectories need a forward now, since the policy will have changed when they are trained."""
    fill_old_logprobs(run, [], buffered)


def old_upfront(run: Run, trained: list[Trajectory], buffered: list[Trajectory]) -> None:
    """copris.old_logprob_source: trainer, when the values are needed before the update (mini_batches > 1, PRIME
    with ref: policy, a mismatch correction): one forward over every trajectory's new tokens."""
    fill_old_logprobs(run, trained, buffered)


def old_from_rollout(run: Run, trained: list[Trajectory], buffered: list[Trajectory]) -> None:
    """copris.old_logprob_source: rollout: the engine's sampling log-probs are the old log-probs."""
    for t in trained + buffered:
        t.old_logprobs = list(t.logprobs)


def old_logprob_strategy(cfg: Config) -> tuple[typing.Callable, bool]:
    """-> (fill_old, fresh): where old log-probs come from, and whether the first pass over the tokens the current
    policy sampled takes them on-policy (ratio exactly 1, from the update's own forward: trainer source only).
    Upfront when the values are needed before the update (mini_batches > 1, a correction, PRIME's ref: policy) or
    the update's forward is perturbed (LoRA dropout: stored values, metrics and corrections must not be)."""
    if cfg.copris.old_logprob_source == "rollout":
        return old_from_rollout, False
    upfront = cfg.mini_batches > 1 or cfg.correction.mode != "none" or (cfg.prime.enabled and cfg.prime.ref == "policy") \
        or (cfg.lora.rank > 0 and cfg.lora.dropout > 0)
    return (old_upfront if upfront else old_from_update), True


def group_advantages(estimator, group_size: int):
    """GRPO / RLOO as an advantage strategy: each sample's advantage (B,) broadcast over its tokens."""
    def advantages(rows: list[Row], rewards: torch.Tensor) -> dict:
        for r, a in zip(rows, estimator(rewards, group_size)):  # (B,)
            r.adv = a.expand(len(r.response))
        return {}
    return advantages


def policy_reference(run: Run, batch: list[Row]) -> list[torch.Tensor]:
    """PRIME ref: policy: the rollout policy's old log-probs (filled before the update), on the run's device (the
    PRM's log-probs are there: the reward kernel refuses a mix)."""
    return [r.old_logp.to(run.device) for r in batch] if batch else [torch.zeros(1, device=run.device)]


def frozen_reference(run: Run, batch: list[Row]) -> list[torch.Tensor]:
    """Log-probs of the frozen copy of the initial policy, or of the LoRA policy with its adapter disabled: the base
    model (runs for an empty batch too: FSDP)."""
    with adapter_disabled(run.ref):
        return response_logprobs(run.ref, batch, run.device, run.cfg.temperature)


def loss_weights(run: Run, rows: list[Row]) -> list[torch.Tensor]:
    """Per row (T_i,) the weight of each token in the loss: loss_agg's aggregation weight over the kept tokens of
    every rank (kernels.ppo_loss.token_weights with global denominators) times the mismatch-correction weight; a
    masked token (weight 0) leaves numerator and denominator. Times world: FSDP averages gradients over ranks."""
    corr = [(torch.ones(len(r.response)) if r.weight is None else r.weight) * model_tokens(r)
            for r in rows]  # (T_i,) each: 0 at observation tokens
    if not rows:
        return []
    kept = torch.cat(corr) > 0  # (N,)
    lens = torch.tensor([len(r.response) for r in rows])
    n_kept = torch.zeros(len(rows)).index_add_(0, torch.repeat_interleave(torch.arange(len(rows)), lens), kept.float())
    tokens, seqs, n = all_sum([float(kept.sum()), float((n_kept > 0).sum()), float(len(rows))], run.device)
    w = run.agg(lens, mask=kept, n_tokens=max(tokens, 1.0), n_seqs=max(seqs, 1.0), n_rows=n)  # (N,)
    w = w * torch.cat(corr) * run.world
    return split_rows(w, rows)


def policy_update(run: Run, rows: list[Row]) -> dict:
    """PPO-clip over `ppo_epochs` passes of `mini_batches` optimizer steps, each a set of packed micro-batches; a
    token's old log-prob (the ratio's denominator) is its sampling stage's in every pass. Token weights come from
    the global (all-rank) denominators of loss_agg; masked tokens (correction weight 0) leave numerator and
    denominator. Tokens whose old log-prob is nan take it from this forward (the policy has not changed yet);
    the values computed are written back into row.old_logp. -> loss, clip_frac, approx_kl, entropy, ratio_max,
    grad_norm: means over the step's trained tokens of every pass (loss and grad_norm: over optimizer steps)."""
    cfg = run.cfg
    sums = dict.fromkeys(("loss", "clip_frac", "approx_kl", "entropy", "tokens", "grad_norm"), 0.0)
    ratio_max, steps = 0.0, cfg.ppo_epochs * cfg.mini_batches
    for e, m in itertools.product(range(cfg.ppo_epochs), range(cfg.mini_batches)):  # passes x mini-batches
        if e > 0 and m == 0:  # pass 1 in rollout order; later ones reshuffled by torch's generator (checkpointed)
            rows = [rows[i] for i in torch.randperm(len(rows)).tolist()]
        mini = rows[m * len(rows) // cfg.mini_batches:(m + 1) * len(rows) // cfg.mini_batches]  # sizes differ by <= 1
        w = loss_weights(run, mini)
        for mb in micro_batches(mini, cfg.token_budget, run.device):
            batch = [mini[i] for i in mb] or [DUMMY]
            cat = (lambda xs: torch.cat(xs).to(run.device)) if mb else (lambda xs: torch.zeros(1, device=run.device))
            old, adv, wt = cat([r.old_logp for r in batch]), cat([r.adv for r in batch]), cat([w[i] for i in mb])
            fresh = cat([r.fresh if e == m == 0 and r.fresh is not None else torch.zeros(len(r.response), dtype=torch.bool)
                         for r in batch]).bool()  # (N,)
            ref = torch.cat(frozen_reference(run, batch)) if cfg.kl_coef > 0 else None
            lens = torch.tensor([len(r.response) for r in batch], device=run.device)  # (S,) the packed rows' lengths
            out = packed_forward(run.policy, batch, run.device, ppo_head(cfg, targets_of(batch, run.device), lens, old,
                                                                           adv, wt, ref, torch.isnan(old) | fresh))
            loss, logp, s = out
            loss.backward()
            for r, lp in zip(batch if mb else [], split_rows(logp, batch)):
                r.old_logp = torch.where(torch.isnan(r.old_logp), lp.cpu(), r.old_logp)
            for k in ("clip_frac", "approx_kl", "entropy", "tokens"):
                sums[k] += s[k]
            sums["loss"] += loss.item() / run.world / steps
            ratio_max = max(ratio_max, s["ratio_max"])
        sums["grad_norm"] += optimizer_step(run)[0] / steps
    run.sched.step()  # once per RL step, whatever ppo_epochs x mini_batches
    loss, clip, kl, ent, n = all_sum([sums[k] for k in ("loss", "clip_frac", "approx_kl", "entropy", "tokens")],
                                     run.device)
    return {"loss": loss, "clip_frac": clip / max(n, 1), "approx_kl": kl / max(n, 1), "entropy": ent / max(n, 1),
            "ratio_max": all_max(float(ratio_max), run.device), "grad_norm": sums["grad_norm"]}


def ppo_head(cfg: Config, targets, lens, old, adv, w, ref, on_policy):
    """A packed_forward fn: (h (N, H), weight (V, H)) -> (loss = sum_t w_t (l_t - entropy_coef * ent_t), logp (N,)
    detached, sums over tokens with w > 0 of clip/kl/entropy) through kernels.fused_linear_ppo_loss with the run's
    objective (l_t: PPO's token clip, GSPO's sequence term over the rows of lens (S,), CISPO's): no (N, V) logits.
    on_policy (N,) bool: tokens whose old log-prob is this forward's own (ratio exactly 1): those old is nan for,
    and the first pass over tokens the current policy sampled."""
    def fn(h, weight):
        loss, logp, _, s = fused_linear_ppo_loss(h, weight, targets, old, adv, w, cfg.clip_low, cfg.clip_high,
                                                 cfg.dual_clip, ref, cfg.kl_coef, cfg.temperature, cfg.entropy_coef,
                                                 on_policy=on_policy, objective=cfg.objective, seq_lens=lens)
        n = float((w > 0).sum())
        return loss, logp, {"clip_frac": s["clip_frac"] * n, "approx_kl": s["approx_kl"] * n,
                            "entropy": s["entropy"] * n, "ratio_max": s["ratio_max"], "tokens": n}
    return fn


def step_metrics(run: Run, version: int, trajs, rewards, reasons: dict, rstats, seconds: dict) -> dict:
    """Rollout and reward figures of one step, summed over ranks (an engine's figures: over engine groups)."""
    lengths = [len(tr.tokens) for tr in trajs]
    off_policy = sum(v != version and m for tr in trajs for v, m in zip(tr.versions, tr.model_mask()))  # model tokens
    # sampled by an older policy
    buffered = sum(len(tr.tokens) for g in run.scheduler.buffer for tr in g.samples)
    t = run.eg.size  # each of an engine group's t ranks adds 1/t of the engine's figures
    failures = sorted(NOT_SCORED)  # each reason's count too: reward_errors/<reason>
    (reward, n, tokens, truncated, new_tokens, off_policy, timeouts, errors, buffered, dropped, *failed) = all_sum(
        [float(rewards.sum()), len(rewards), sum(lengths), sum(tr.finish_reason == "length" for tr in trajs),
         rstats.new_tokens / t, off_policy, reasons.get("timeout", 0),
         sum(n for k, n in reasons.items() if k in NOT_SCORED or k == "crash"),
         buffered / t, rstats.dropped_groups / t, *[reasons.get(k, 0) for k in failures]], run.device)
    every = sorted(all_gather_list(lengths))
    out = {"reward": reward / n, "response_len": tokens / n, "response_len_p50": every[len(every) // 2],
           "response_len_p90": every[int(len(every) * 0.9)], "response_len_max": every[-1],
           "truncated_frac": truncated / n, "rollout_tokens": new_tokens,
           "off_policy_token_frac": off_policy / max(1, tokens),
           "reward_timeouts": timeouts, "reward_errors": errors, "buffer_tokens": buffered, "dropped_groups": dropped,
           "rollout_tok_per_s": new_tokens / max(1e-9, seconds["rollout"]), "max_in_flight": rstats.max_in_flight,
           **{f"reward_errors/{k}": c for k, c in zip(failures, failed) if c}}
    if run.device.type == "cuda":  # model FLOPs: 6 N per trained token, 2 N per generated / re-scored token
        n_params = sum(p.numel() for p in run.policy.parameters())
        flops = n_params * (6 * tokens + 2 * (new_tokens + tokens))
        out["mfu"] = flops / (sum(seconds.values()) * run.world * run.cfg.peak_tflops * 1e12)
    return {**out, **(tool_metrics(run, trajs, rstats) if run.episodes else {})}


TOOL_REASONS = ("ok", "malformed", "unknown_tool", "tool_error", "timeout", "crash", "truncated", "no_sandbox")


def tool_metrics(run: Run, trajs, rstats) -> dict:
    """Multi-turn figures of the step, over ranks: turns per trained trajectory (mean, max), the share that called a
    tool, the share of their tokens that are observations, episodes ended by max_turns; tool calls answered during
    the rollout by outcome, and the seconds the rollout waited on a tool."""
    t = run.eg.size
    turns = [tr.calls + (tr.finish_reason != "max_turns") for tr in trajs]
    obs = sum(b - a for tr in trajs for a, b in tr.obs_spans)
    sums = all_sum([sum(turns), len(turns), sum(tr.calls > 0 for tr in trajs), obs, sum(len(tr.tokens) for tr in trajs),
                    sum(tr.finish_reason == "max_turns" for tr in trajs), rstats.tool_wait_s / t,
                    *[rstats.tool_reasons.get(k, 0) / t for k in TOOL_REASONS]], run.device)
    n = max(sums[1], 1.0)
    return {"tools/turns_mean": sums[0] / n, "tools/turns_max": all_max(max(turns, default=0), run.device),
            "tools/call_rate": sums[2] / n, "tools/obs_token_frac": sums[3] / max(sums[4], 1.0),
            "tools/max_turns_frac": sums[5] / n, "tools/wait_s": sums[6],
            **{f"tools/{k}": v for k, v in zip(TOOL_REASONS, sums[7:])}}


def mismatch_metrics(run: Run, rows: list[Row], trajs) -> dict:
    """rollout/mismatch.py figures over the step's trained model tokens of every rank (old vs the engine's
    log-probs; observation tokens have no sampling log-prob and are left out)."""
    masks = [model_tokens(r) for r in rows]
    old = [r.old_logp[m] for r, m in zip(rows, masks)]
    roll = [torch.tensor(tr.logprobs)[m] for tr, m in zip(trajs, masks)]
    local = mismatch.token_sums(old, roll, [None if r.weight is None else r.weight[m] for r, m in zip(rows, masks)])
    total = dict(zip(local, all_sum(list(local.values()), run.device)))
    total["prob_diff_max"] = all_max(local["prob_diff_max"], run.device)
    return mismatch.metrics(total, all_gather_list(mismatch.sequence_ratios(old, roll)), run.correct is not None)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(run: Run, samples_out: Path | None = None) -> dict:
    """Held-out accuracy per data_source and overall: greedy, mean@k and pass@k (unbiased), with
    k = eval_samples completions sampled at `temperature`, and reward.models' mean raw scores. Each engine group
    generates its share of the rows; its ranks score every t-th. samples_out: rank 0 writes every completion with
    its score (and reward models' scores) there (jsonl)."""
    k, eg = run.cfg.eval_samples, run.eg
    if run.policy is not None:
        push_weights_if_stale(run)
    rows = run.eval_rows[eg.index::eg.count]
    completions = (eval_episodes if run.episodes else eval_completions)(run, rows)  # per row: greedy, k samples
    texts = [c[0] for i in range(eg.member, len(rows), eg.size) for c in completions[i]]
    turns = [c[1] for i in range(eg.member, len(rows), eg.size) for c in completions[i]]
    rows = rows[eg.member::eg.size]
    scores = run.pool.score([(rows[i // (k + 1)], t, context(rows[i // (k + 1)], turns[i], None, run.policy_version, run.cfg))
                             for i, t in enumerate(texts)])
    run.engine.sleep()
    rm, rm_means = run.reward_models.held_out([(rows[i // (k + 1)]["prompt"], t) for i, t in enumerate(texts)]) \
        if run.reward_models else ([], {})  # reward.models' view of the same completions
    sources = sorted({r["data_source"] for r in run.eval_rows})
    if samples_out is not None:
        mine = [{"id": row.get("id"), "data_source": row["data_source"], "task": row["task"], "name": row.get("name"),
                 "kind": "greedy" if j == 0 else "sample",
                 "completion": texts[i * (k + 1) + j], "score": scores[i * (k + 1) + j][0],
                 "reason": scores[i * (k + 1) + j][1]["reason"],
                 **({"turns": turns[i * (k + 1) + j]} if turns[i * (k + 1) + j] else {}),
                 **({"reward_models": rm[i * (k + 1) + j]} if rm_means else {})}
                for i, row in enumerate(rows) for j in range(k + 1)]
        every = all_gather_list(mine)
        if run.rank == 0:
            samples_out.write_text("".join(json.dumps(r) + "\n" for r in every))
    out = {**report.eval_metrics(all_sum(report.eval_sums(rows, [s for s, _ in scores], k, sources), run.device),
                                 sources, k), **rm_means}
    if run.episodes:  # the share of held-out completions (greedy and sampled) that called a tool
        called, n = all_sum([sum(any(x["role"] == "tool" for x in t) for t in turns), len(turns)], run.device)
        out["eval/tool_call_rate"] = called / max(n, 1.0)
    return out


def eval_completions(run: Run, rows: list[dict]) -> list[list[tuple[str, list]]]:
    """Single-turn evaluation: per row [(text, [])] for the greedy completion and k samples, one engine batch; seeds
    from the row's index in eval_rows, so the samples are the same at any world size."""
    cfg, k, eg, eos = run.cfg, run.cfg.eval_samples, run.eg, [run.tok.eos_token_id]
    prompts, params = [], []
    for i, row in enumerate(rows):
        prompts += [row["prompt_ids"]] * (k + 1)
        params.append(run.engine.sampling(cfg.max_response_len, 0.0, 1.0, None, eos))
        params += [run.engine.sampling(cfg.max_response_len, cfg.temperature, cfg.top_p,
                                       cfg.seed * 7919 + (eg.index + i * eg.count) * 131 + j, eos) for j in range(k)]
    bar = report.progress(run.rank, len(prompts), "eval")
    texts = [run.tok.decode(toks, skip_special_tokens=True)
             for toks, _ in run.engine.generate(prompts, params, on_finish=bar.update)]
    bar.close()
    return [[(t, []) for t in texts[i * (k + 1):(i + 1) * (k + 1)]] for i in range(len(rows))]


def eval_episodes(run: Run, rows: list[dict]) -> list[list[tuple[str, list]]]:
    """Evaluation when rows may be episodes: the same environments, through CoprisScheduler in synchronous mode
    (greedy, then k samples per row); -> per row [(what the model wrote, every turn as {role, text})]."""
    cfg, k, eg = run.cfg, run.cfg.eval_samples, run.eg
    out = [[] for _ in rows]
    for temperature, n, seed in ((0.0, 1, cfg.seed * 7919), (cfg.temperature, k, cfg.seed * 7919 + 1)):
        sched = CoprisScheduler(n=n, groups=len(rows), concurrency=1, max_response_len=cfg.max_response_len,
                                temperature=temperature, top_p=cfg.top_p if temperature else 1.0,
                                stop_token_ids=[run.tok.eos_token_id], seed=seed, enabled=False,
                                episodes=run.episodes)
        todo = iter(range(len(rows)))

        def draw():  # prompt id: the row's index in eval_rows (the same at any world size)
            i = next(todo)
            return eg.index + i * eg.count, rows[i]["prompt_ids"], rows[i]
        groups, _ = sched.collect(run.engine, draw, run.policy_version)
        for g in groups:
            out[(g.prompt_id - eg.index) // eg.count] += [(model_text(run.tok, t), episode_turns(run.tok, t))
                                                          for t in g.samples]
    return out


def episode_turns(tok, tr: Trajectory) -> list[dict]:
    """An episode as [{"role": "model" | "tool", "text"}] in order."""
    bounds = [0, *[x for span in tr.obs_spans for x in span], len(tr.tokens)]
    return [{"role": "tool" if i % 2 else "model", "text": tok.decode(tr.tokens[a:b])}
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]


# ---------------------------------------------------------------------------------------------
# Resumable checkpoints (atomic: a tmp folder renamed once complete, with a manifest); the export: model.export_hf
# ---------------------------------------------------------------------------------------------


def resume_or_start(run: Run, ckpt: Path | None, step0) -> int:
    """Restore `ckpt` and say so (-> its step), or, starting fresh, log step 0: step0() -> its metrics (-> 0)."""
    if ckpt is None:
        log(run, {"step": 0, **step0()})
        return 0
    start = load_checkpoint(run, ckpt)
    if run.rank == 0:
        print(f"resumed from {ckpt} (step {start})")
    return start


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------


def setup(cfg: Config, trainable: bool = True) -> tuple[Run, Path | None]:
    """Process group, run_dir, logging, tokenizer, and (trainable) the FSDP2 policy; -> (run, checkpoint to resume)."""
    rank, world, device = init_distributed(cfg.dist_timeout_s)
    check_run_dir(cfg, world)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed + rank)
    ckpt = start_run_dir(cfg, rank)
    report.setup_logging(Path(cfg.run_dir), rank)
    tok = load_tokenizer(cfg.model_path, cfg.chat_template_file)
    run = Run(cfg, rank, world, device, Path(cfg.run_dir), tok, eg=engine_group(cfg.engine.tensor_parallel_size, cfg.dist_timeout_s),
              sinks=report.metric_sinks(cfg, Path(cfg.run_dir)) if rank == 0 else [],
              compute=compute_dtype(cfg.precision, device, AutoConfig.from_pretrained(cfg.model_path).hidden_size))
    if trainable:
        run.policy = build_model(cfg.model_path, device, trainable=True, lora=cfg.lora, precision=cfg.precision)
        run.optim, run.sched = make_optimizer(cfg, run.policy, cfg.steps)
    return run, ckpt


def start_engine(run: Run):
    """This rank's vLLM engine on model_path (max length = prompt + response); a start failure says what to change."""
    from rollout.vllm_engine import EngineConfig as VllmConfig, EngineStartError, RolloutEngine
    cfg = run.cfg
    if run.device.type == "cpu" and run.eg.size > 1 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        # vLLM's CPU tensor-parallel all-reduce keeps /dev/shm segments under names fixed by the group's ranks (the
        # same for every run on this machine); a run killed with SIGKILL leaves them behind, and the next engine
        # would then fail to start (EEXIST): remove them (two such runs at once on one machine collide anyway)
        for stale in Path("/dev/shm").glob("*-cpushm_*"):
            stale.unlink(missing_ok=True)
    dist.barrier()
    spec = VllmConfig(cfg.model_path, cfg.max_prompt_len + cfg.max_response_len, seed=cfg.seed,
                      dtype=str(run.compute).removeprefix("torch."), top_k=cfg.top_k, min_p=cfg.min_p,
                      gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
                      max_num_seqs=cfg.engine.max_num_seqs, enforce_eager=cfg.engine.enforce_eager,
                      lora_rank=cfg.lora.rank, tensor_parallel_size=cfg.engine.tensor_parallel_size)
    try:
        with report.native_stderr_to(run.run_dir / report.LOG_NAME):  # vLLM's C++ warnings: the log, not the console
            engine = RolloutEngine(spec, distributed=True)
    except EngineStartError as e:
        raise ConfigError(str(e)) from None
    report.quiet_library_loggers()
    return engine


def log(run: Run, metrics: dict) -> None:
    if run.rank == 0:
        report.log_metrics(run.run_dir, run.sinks, metrics)


def data_counts(run: Run, name: str, total: int, skipped: int, why: str) -> dict:
    """Print (rank 0) how many rows were usable; warn when over 10% were skipped; -> metrics for the step-0 line."""
    if run.rank == 0:
        print(f"{name}: {total - skipped} of {total} rows used, {skipped} skipped ({why})")
        if skipped > 0.1 * total:
            print(f"warning: {skipped / total:.0%} of {name} rows were skipped: raise the limits or check the data")
    return {f"data/{name}_rows": total - skipped, f"data/{name}_skipped": skipped}


def train_loop(run: Run, start: int, steps: int, step_fn, desc: str, evaluate_at=None) -> float | None:
    """steps start+1..steps of step_fn(run, step) -> metrics; checkpoint every save_every steps, after the last
    one and on SIGTERM/SIGINT (then return None early); evaluate_at(step) -> extra metrics or {}; export at the
    end. -> the loop's seconds."""
    cfg, stop, t_start = run.cfg, launch.StopSignal(), time.time()
    bar = report.progress(run.rank, steps, desc)
    bar.update(start)
    for step in range(start + 1, steps + 1):
        m = step_fn(run, step)
        m.update(evaluate_at(step) if evaluate_at else {}, elapsed_s=time.time() - t_start)
        log(run, m)
        bar.set_postfix({k.split("/")[-1]: f"{v:.3f}" for k, v in m.items() if k in ("reward", "response_len",
                         "sft_loss") or (k.startswith("eval/") and k.count("/") == 1 and k != "eval/rows")})
        bar.update()
        stopping = stop.agreed(run.device)
        if stopping or step == steps or (cfg.save_every and step % cfg.save_every == 0):
            path = save_checkpoint(run, step)
        if stopping:
            if run.rank == 0:
                print(f"\nstopped by signal after step {step}; checkpoint {path}; continue with --resume=auto")
            return None
        if cfg.export_every and step % cfg.export_every == 0 and step != steps:
            export(run)
    bar.close()
    export(run)
    return time.time() - t_start


def export(run: Run) -> None:
    """The policy as an HF folder in run_dir/export (model.export_hf), in export_dtype."""
    dtype = {"auto": torch.bfloat16 if run.device.type == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
             "float32": torch.float32}[run.cfg.export_dtype]
    export_hf(run.policy, serving_tokenizer(run.tok, run.cfg.chat_template), run.run_dir / "export",
              run.cfg.lora.export_merged, dtype)


def start_episodes(run: Run, rows: list[dict]) -> Episodes | None:
    """Tool workers and the observation format when some row's task names an environment (else None). A tokenizer
    or chat template the episodes cannot use exactly is a ConfigError that says what to change."""
    if not any(env_of(r) for r in rows):
        return None
    c = run.cfg.tools
    try:
        return Episodes(run.tok, run.cfg.chat_template, env_of, c.max_turns, c.max_obs_tokens, c.tool_steps,
                        c.timeout_s, c.workers)
    except TemplateError as e:
        raise ConfigError(f"model_path {run.cfg.model_path}: {e}") from None


def start_rewards(cfg: Config, rows: list[dict]) -> RewardPool:
    """The rank's reward pool, once it scored a known answer where the rows' rewards can fail on this rank's device
    (tasks.preflight: the Triton reward's sandbox without CUDA, a reference over its time)."""
    pool = reward_pool(cfg)
    if problem := reward_preflight(pool, rows):
        pool.close()
        raise TrainingError(problem)
    return pool


def close_workers(run: Run) -> None:
    """Reward and tool workers, then the engine (before the process group goes)."""
    run.pool.close()
    if run.episodes:
        run.episodes.close()
    run.engine.shutdown()


def check_sandbox(cfg: Config, rows: list[dict]) -> None:
    """Rows whose reward runs model-written code (code, triton) need the sandbox's isolation (rewards/sandbox.py)."""
    if any(r["task"] in UNTRUSTED_TASKS for r in rows):
        try:
            require_isolation(cfg.sandbox_opt_out)
        except SandboxUnavailable as e:
            raise ConfigError(str(e)) from None


def train_rl(cfg: Config) -> None:
    rows = load_rows(cfg.train_data, "rl")
    eval_rows = load_rows(cfg.eval_data, "rl") if cfg.eval_data else []
    check_sandbox(cfg, rows + eval_rows)
    run, ckpt = setup(cfg)
    rows, skipped = tokenize_prompts(rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    counts = data_counts(run, "train", len(rows) + skipped, skipped, f"prompt over max_prompt_len={cfg.max_prompt_len}")
    run.eval_rows, skipped = tokenize_prompts(eval_rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    counts.update(data_counts(run, "eval", len(eval_rows), skipped, "prompt over max_prompt_len") if eval_rows else {})
    config.check_one_batch(cfg, len(rows), "usable prompts")  # batch_groups >= the engine groups: each draws one
    run.prompts = PromptSource(rows, cfg.seed, run.eg.index, run.eg.count)
    if cfg.kl_coef > 0 or (cfg.prime.enabled and cfg.prime.ref == "frozen"):
        run.ref = run.policy if cfg.lora.rank else build_model(cfg.model_path, run.device, trainable=False,
                                                                 precision=cfg.precision)
    every_rank = functools.partial(sum_over_ranks, device=run.device)
    estimator = {"grpo": lambda r, k: grpo_advantages(r, k, cfg.scale_std, reduce=every_rank),
                 "rloo": rloo_advantages}.get(cfg.advantage)
    reference = policy_reference if cfg.prime.ref == "policy" else frozen_reference
    prime = Prime(cfg, run.device, lambda batch: reference(run, batch)) if cfg.prime.enabled else None
    run.advantages = Critic(cfg, run.device, prime) if cfg.advantage == "gae" \
        else prime or group_advantages(estimator, cfg.n_samples)  # PRIME's PRM: in its own advantages or the critic's
    run.keep_group = (accuracy_in_range if cfg.prime.enabled else informative_group if cfg.copris.dynamic_sampling
                      else None)
    run.keep_group = run.keep_group and (lambda g, f=run.keep_group: f(run, g))
    run.fill_old, run.fresh = old_logprob_strategy(cfg)
    run.correct = mismatch.correction(cfg.correction.mode, cfg.correction.low, cfg.correction.threshold)
    o = cfg.overlong
    run.overlong = Overlong(cfg.max_response_len, o.buffer, o.filter, every_rank, o.penalty_factor) if o.buffer or o.filter else None
    run.episodes = start_episodes(run, rows + run.eval_rows)
    run.reward_models = RewardModels(cfg.reward, run.device, run.compute, cfg.token_budget) if cfg.reward.models else None
    run.pool, run.engine = start_rewards(cfg, rows + run.eval_rows), start_engine(run)
    run.scheduler = CoprisScheduler(
        n=cfg.n_samples, groups=cfg.batch_groups // run.eg.count, concurrency=cfg.copris.concurrency,
        max_response_len=cfg.max_response_len, temperature=cfg.temperature, top_p=cfg.top_p,
        stop_token_ids=[run.tok.eos_token_id], seed=cfg.seed, enabled=cfg.copris.enabled,
        staleness_cap=cfg.copris.staleness_cap, episodes=run.episodes)
    try:
        start = resume_or_start(run, ckpt, lambda: {**counts, **(evaluate(run) if run.eval_rows else {})})

        def evaluate_at(step: int) -> dict:
            due = (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps
            return evaluate(run) if run.eval_rows and due else {}
        seconds = train_loop(run, start, cfg.steps, rl_step, "rl", evaluate_at)
        if run.rank == 0 and seconds is not None:
            report.report_rl(run.run_dir, cfg.eval_samples, seconds, cfg.steps, start)
    finally:
        close_workers(run)


def sft_step(run: Run, step: int) -> dict:
    """One SFT optimizer step over sft_batch_rows rows (this rank's share): loss = global mean over completion
    tokens of -log p."""
    cfg = run.cfg
    if len(run.sft_order) < cfg.sft_batch_rows:
        run.sft_order += torch.randperm(len(run.sft_data), generator=run.sft_gen).tolist()
    batch, run.sft_order = run.sft_order[:cfg.sft_batch_rows], run.sft_order[cfg.sft_batch_rows:]
    mine = [Row(p, c, mask=None if m is None else torch.tensor(m)) for p, c, m in
            (run.sft_data[i] for i in batch[run.rank::run.world])]
    tokens = all_sum([sum(float(model_tokens(r).sum()) for r in mine)], run.device)[0]
    loss_sum = 0.0
    for mb in micro_batches(mine, cfg.token_budget, run.device):
        logp = torch.cat(response_logprobs(run.policy, [mine[i] for i in mb], run.device, 1.0))  # (N,)
        keep = torch.cat([model_tokens(mine[i]) for i in mb]).to(logp.device) if mb else torch.zeros_like(logp)
        loss = -(logp * keep).sum() * run.world / tokens
        loss.backward()
        loss_sum += loss.item() / run.world
    lr, (norm, _) = run.sched.get_last_lr()[0], optimizer_step(run)  # the lr this step used
    run.sched.step()
    return {"step": step, "sft_loss": all_sum([loss_sum], run.device)[0], "grad_norm": norm, "lr": lr}


def train_sft(cfg: Config) -> None:
    """Supervised fine-tuning on prompt/completion rows: loss on completion + eos tokens only (a demonstration given
    as turns: on the assistant's tokens only, the tool turns being observations as episodes append them)."""
    rows = load_rows(cfg.train_data, "sft")
    run, ckpt = setup(cfg)
    observation = None
    if any(isinstance(r["completion"], list) for r in rows):
        try:
            obs = Observations(run.tok, cfg.chat_template, cfg.max_response_len)
        except TemplateError as e:
            raise ConfigError(f"model_path {cfg.model_path}: {e}") from None
        observation = lambda text: obs.ids(text)[0]  # noqa: E731
    run.sft_data, skipped = tokenize_sft(rows, run.tok, cfg.max_prompt_len, cfg.max_response_len, cfg.chat_template,
                                         observation)
    held_out = [Row(p, c, mask=None if m is None else torch.tensor(m)) for p, c, m in tokenize_sft(
        load_rows(cfg.eval_data, "sft"), run.tok, cfg.max_prompt_len, cfg.max_response_len, cfg.chat_template,
        observation)[0][run.rank::run.world]] if cfg.eval_data else []
    counts = data_counts(run, "train", len(rows), skipped, "prompt or completion over max_prompt_len/max_response_len")
    if cfg.sft_batch_rows < run.world or len(run.sft_data) < cfg.sft_batch_rows:
        raise ConfigError(f"sft_batch_rows={cfg.sft_batch_rows} needs >= {run.world} and <= {len(run.sft_data)} usable rows")
    steps = cfg.sft_epochs * (len(run.sft_data) // cfg.sft_batch_rows) if cfg.sft_epochs else cfg.steps
    run.optim, run.sched = make_optimizer(cfg, run.policy, steps)
    run.sft_gen.manual_seed(cfg.seed)

    def validation(step: int) -> dict:  # eval_data's loss before the first step, every eval_every and after the last
        due = cfg.eval_data and (step == 0 or (cfg.eval_every and step % cfg.eval_every == 0) or step == steps)
        return {"eval/val_loss": mean_nll(run.policy, held_out, run.device, cfg.token_budget)} if due else {}
    start = resume_or_start(run, ckpt, lambda: {**counts, **validation(0)})
    seconds = train_loop(run, start, steps, sft_step, "sft", validation)
    if run.rank == 0 and seconds is not None:
        print(f"sft: {report.steps_done(start, steps)} in {seconds:.0f} s; export: {run.run_dir / 'export'}")


def run_eval(cfg: Config) -> None:
    """mode: eval. Held-out metrics of model_path on eval_data: a table, eval_summary.json and every
    completion with its score in eval_samples.jsonl (both in run_dir)."""
    rows = load_rows(cfg.eval_data, "rl")
    check_sandbox(cfg, rows)
    run, _ = setup(cfg, trainable=False)
    run.eval_rows, skipped = tokenize_prompts(rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    counts = data_counts(run, "eval", len(rows), skipped, f"prompt over max_prompt_len={cfg.max_prompt_len}")
    run.episodes = start_episodes(run, run.eval_rows)
    run.pool, run.engine = start_rewards(cfg, run.eval_rows), start_engine(run)
    run.reward_models = RewardModels(cfg.reward, run.device, run.compute, cfg.token_budget) if cfg.reward.models else None
    try:
        metrics = {**evaluate(run, samples_out=run.run_dir / "eval_samples.jsonl"), **counts}
        if run.rank == 0:
            (run.run_dir / "eval_summary.json").write_text(json.dumps(metrics, indent=1))
            report.print_eval_table(metrics, cfg.eval_samples)
            print(f"samples: {run.run_dir / 'eval_samples.jsonl'}")
    finally:
        close_workers(run)


def preflight(argv: list[str], world: int) -> None:
    """What can be checked before any rank starts (the launcher runs it): config, run_dir, rows, chat template,
    reward files."""
    cfg = load_config(argv, world)
    check_run_dir(cfg, world)
    for path in ([cfg.train_data] if cfg.mode != "eval" else []) + ([cfg.eval_data] if cfg.eval_data else []):
        rows = load_rows(path, "sft" if cfg.mode == "sft" else "rl")
        check_sandbox(cfg, rows if cfg.mode != "sft" else [])
        check_chat_template(cfg, rows)  # chat_template_file compiles, and renders every row's prompt
        if path == cfg.train_data:
            config.check_one_batch(cfg, len(rows))
    check_imports(cfg)  # reward.funcs' files import, in a reward worker


def main(argv: list[str]) -> int:
    if argv[:1] == ["--plot"] and len(argv) == 2:  # python trainer.py --plot RUN_DIR
        try:
            print(report.plot_run(Path(argv[1])))
            return 0
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if launch.wants_launcher(argv):  # python trainer.py --nproc_per_node N ...
        return launch.run(argv, preflight)
    try:
        cfg = load_config(argv)
        {"sft": train_sft, "rl": train_rl, "eval": run_eval}[cfg.mode](cfg)
    except ConfigError as e:  # said by whichever rank found it, once per node (launch.say_once)
        launch.say_once(f"config error: {e}")
        return 2
    except TrainingError as e:
        launch.say_once(f"training stopped: {e}")
        return 3
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    launch.exit_process(main(sys.argv[1:]))

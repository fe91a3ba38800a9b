"""RL post-training for LLMs in one file: a colocated vLLM rollout engine and an FSDP2 policy per rank.

    torchrun --nproc_per_node N trainer.py --config configs/X.yaml [--key=value ...] [--section.key=value]

One RL step (rl_step, top to bottom): push the policy's weights into the engine if they changed ->
CoPRIS rollout (partial, concurrency-controlled; or synchronous) -> engine sleeps -> rewards in a
worker pool -> old log-probs (cross-stage: earlier stages keep their values) -> advantages (GRPO or
RLOO) -> PPO-clip update over token-budget micro-batches -> metrics, export.
`mode: sft` trains on prompt/completion pairs with the same model code.

Ranks own disjoint prompts; a group (n samples of one prompt) never spans ranks; every rank
collects batch_groups / world groups, so all ranks train on the same number of rows.
"""
import argparse
import contextlib
import dataclasses
import difflib
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from rewards.advantages import grpo_advantages, prime_advantages, rloo_advantages

# ---------------------------------------------------------------------------------------------
# Config: one dataclass tree, yaml presets, --key=value overrides (type-checked, unknown keys fail)
# ---------------------------------------------------------------------------------------------


@dataclass
class EngineConfig:
    max_num_seqs: int = 256  # vLLM's running-batch limit; must be >= copris.concurrency
    gpu_memory_utilization: float = 0.4  # CUDA: share of GPU memory vLLM takes while awake
    enforce_eager: bool = True  # no CUDA graphs / compile: fast start; set false for long GPU runs


@dataclass
class CoprisConfig:
    enabled: bool = True  # false: synchronous rollout, every request runs to the end
    concurrency: int = 64  # P: requests in flight per rank (the paper's default is 1024 per node)
    staleness_cap: int | None = None  # restart a partial trajectory sampled more than k versions ago; null = never
    old_logprob_source: str = "trainer"  # trainer: recompute per stage with the FSDP policy | rollout: engine's values
    dynamic_sampling: bool = False  # drop complete groups whose rewards are all equal and keep collecting


@dataclass
class PrimeConfig:
    enabled: bool = False  # PRIME implicit process rewards with an online PRM (Cui et al.)
    beta: float = 0.05  # r_t = beta * (log pi_prm(y_t) - log pi_ref(y_t))
    lr: float = 1e-6  # PRM AdamW learning rate (paper: 1e-6; policy 5e-7)
    ref: str = "frozen"  # frozen: a frozen copy of the initial policy | policy: the rollout policy's old log-probs
    update: str = "after"  # after: rewards from the pre-update PRM (one forward, the paper's default) | before
    filter_low: float = 0.2  # keep groups whose accuracy is in [filter_low, filter_high], draw more until full
    filter_high: float = 0.8
    outcome_coef: float = 1.0  # weight of the outcome RLOO advantage
    process_coef: float = 1.0  # weight of the process (implicit reward) advantage
    gamma: float = 1.0  # discount of the process returns


@dataclass
class Config:
    mode: str = "rl"  # rl | sft | eval (held-out metrics of model_path on eval_data, nothing trained)
    model_path: str = ""  # local HF model folder (config.json, safetensors, tokenizer files)
    train_data: str = ""  # .jsonl or .parquet; rl rows: prompt, answer (task: math) or verl's layout; sft: prompt, completion
    eval_data: str = ""  # held-out rows like train_data (per data_source metrics); "" = no evaluation
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    run_dir: str = "runs/default"  # metrics.jsonl, config.yaml, export/ and plots go here
    seed: int = 0  # data order, sampling seeds, init
    max_prompt_len: int = 256  # prompts longer than this (tokens) are skipped and counted
    max_response_len: int = 512  # tokens per response; the engine's max_model_len is the sum
    n_samples: int = 8  # K: samples per prompt (group size)
    batch_groups: int = 16  # B: prompt groups per RL step over all ranks (divisible by the world size)
    temperature: float = 1.0  # sampling temperature; the loss's log-probs use the same one
    top_p: float = 1.0  # nucleus sampling
    steps: int = 100  # RL steps, or SFT optimizer steps when sft_epochs is 0
    lr: float = 1e-6  # AdamW learning rate (peak)
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warmup, then constant (RL) or cosine to 10% (SFT)
    grad_clip: float = 1.0  # max global grad norm
    token_budget: int = 8192  # micro-batch size in tokens: rows x padded length
    mini_batches: int = 1  # optimizer steps per RL batch (1 = on-policy up to partial rollout)
    advantage: str = "grpo"  # grpo | rloo
    scale_std: bool = True  # GRPO: divide by the group's std
    clip_low: float = 0.2  # PPO clip: ratio >= 1 - clip_low
    clip_high: float = 0.28  # PPO clip: ratio <= 1 + clip_high (asymmetric, DAPO clip-higher)
    dual_clip: float | None = None  # dual clip c (e.g. 3 or 10) for negative advantages; null = off
    kl_coef: float = 0.0  # k3 KL to a frozen reference copy of the initial policy; 0 = no reference
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * aggregated token entropy
    sft_epochs: int = 1  # SFT passes over train_data (0: run `steps` optimizer steps)
    sft_batch_rows: int = 64  # SFT rows per optimizer step over all ranks
    eval_every: int = 10  # evaluate every k RL steps (and before the first and after the last); 0 = ends only
    eval_samples: int = 4  # k sampled completions per eval prompt for mean@k / pass@k (plus one greedy)
    export_every: int = 0  # HF export every k steps; 0 = at the end only
    save_every: int = 10  # resumable checkpoint every k RL steps (and on SIGTERM/SIGINT); 0 = only on signals
    keep_checkpoints: int = 2  # complete checkpoints kept (oldest deleted)
    resume: str = "off"  # off | auto (newest complete checkpoint in run_dir, if any) | path to a checkpoint
    max_skipped_updates: int = 3  # stop with an error after this many consecutive non-finite updates
    tensorboard: bool = False  # also log to run_dir/tb (needs tensorboard installed)
    wandb_project: str = ""  # also log to this wandb project ("" = off; needs wandb installed)
    peak_tflops: float = 989.0  # per-GPU dense bf16 peak for MFU (H100/H200 SXM: 989)
    reward_workers: int = 1  # reward processes per rank
    reward_timeout_s: float = 10.0  # wall limit per sample; over it scores 0 and is counted
    engine: EngineConfig = field(default_factory=EngineConfig)
    copris: CoprisConfig = field(default_factory=CoprisConfig)
    prime: PrimeConfig = field(default_factory=PrimeConfig)


CHOICES = {"mode": {"rl", "sft", "eval"}, "advantage": {"grpo", "rloo"},
           "loss_agg": {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"},
           "copris.old_logprob_source": {"trainer", "rollout"}, "prime.ref": {"frozen", "policy"},
           "prime.update": {"after", "before"}}


class ConfigError(ValueError):
    """A user error in the config: printed without a traceback."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite updates): printed without a traceback."""


def _parse_value(text: str, tp, key: str):
    """A CLI string -> the field's type (bool, int, float, str, or X | None)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if text.lower() in ("null", "none", "~"):
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"{key}: expected true/false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    try:
        return tp(text)
    except ValueError:
        raise ConfigError(f"{key}: expected {tp.__name__}, got {text!r}") from None


def _check_type(value, tp, key: str):
    """A yaml value must already have the field's type (an int is accepted for a float)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None:
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _apply(obj, key: str, value, from_cli: bool, prefix: str = "") -> None:
    head, _, rest = key.partition(".")
    hints = typing.get_type_hints(type(obj))
    if head not in hints:
        near = difflib.get_close_matches(head, list(hints), n=1)
        raise ConfigError(f"unknown config key {prefix + head!r}" + (f" (did you mean {prefix + near[0]!r}?)" if near else ""))
    tp, full = hints[head], prefix + head
    if dataclasses.is_dataclass(tp):
        if rest:
            return _apply(getattr(obj, head), rest, value, from_cli, full + ".")
        if not isinstance(value, dict):
            raise ConfigError(f"{full}: expected a mapping of its keys, got {value!r}")
        for k, v in value.items():
            _apply(getattr(obj, head), str(k), v, from_cli, full + ".")
        return
    if rest:
        raise ConfigError(f"unknown config key {key!r}: {full} has no sub-keys")
    value = _parse_value(value, tp, full) if from_cli else _check_type(value, tp, full)
    if full in CHOICES and value not in CHOICES[full]:
        raise ConfigError(f"{full}: must be one of {sorted(CHOICES[full])}, got {value!r}")
    setattr(obj, head, value)


def load_config(argv: list[str]) -> Config:
    """--config file.yaml (optional) then --key=value / --section.key=value overrides."""
    ap = argparse.ArgumentParser(description="RL post-training trainer", add_help=True)
    ap.add_argument("--config", type=str, default=None, help="yaml preset")
    args, rest = ap.parse_known_args(argv)
    cfg = Config()
    if args.config:
        if not Path(args.config).is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        data = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{args.config}: expected a mapping of config keys")
        for k, v in data.items():
            _apply(cfg, str(k), v, from_cli=False)
    for item in rest:
        if not item.startswith("--") or "=" not in item:
            raise ConfigError(f"bad argument {item!r}: expected --key=value")
        k, v = item[2:].split("=", 1)
        _apply(cfg, k, v, from_cli=True)
    validate_config(cfg)
    return cfg


def validate_config(cfg: Config) -> None:
    """Impossible settings fail here, before anything expensive starts."""
    if not cfg.model_path:
        raise ConfigError("model_path is required (a local HF model folder)")
    if not (Path(cfg.model_path) / "config.json").is_file():
        raise ConfigError(f"model_path {cfg.model_path!r}: no config.json there (not a local HF model folder)")
    for key in (() if cfg.mode == "eval" else ("train_data",)) + (("eval_data",) if cfg.eval_data else ()):
        if not Path(getattr(cfg, key)).is_file():
            raise ConfigError(f"{key} {getattr(cfg, key)!r}: no such file")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.prime.enabled and not 0 <= cfg.prime.filter_low <= cfg.prime.filter_high <= 1:
        raise ConfigError(f"prime.filter_low/high must satisfy 0 <= low <= high <= 1, got "
                          f"{cfg.prime.filter_low}/{cfg.prime.filter_high}")
    if cfg.prime.enabled and cfg.n_samples < 2:
        raise ConfigError("prime.enabled needs n_samples >= 2 (RLOO baselines)")
    if cfg.mode == "eval" and not cfg.eval_data:
        raise ConfigError("mode: eval needs eval_data")
    if cfg.mode == "rl" and cfg.batch_groups % world:
        raise ConfigError(f"batch_groups={cfg.batch_groups} is not divisible by the {world} ranks")
    if cfg.mode == "rl" and cfg.copris.enabled and cfg.copris.concurrency > cfg.engine.max_num_seqs:
        raise ConfigError(f"copris.concurrency={cfg.copris.concurrency} exceeds engine.max_num_seqs="
                          f"{cfg.engine.max_num_seqs}: the engine could not run them all at once")
    for key in ("n_samples", "batch_groups", "max_prompt_len", "max_response_len", "token_budget", "mini_batches"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.resume not in ("off", "auto") and not (Path(cfg.resume) / "manifest.json").is_file():
        raise ConfigError(f"resume={cfg.resume!r}: not off, auto, or a complete checkpoint folder (no manifest.json)")
    max_pos = json.loads((Path(cfg.model_path) / "config.json").read_text()).get("max_position_embeddings")
    if max_pos and cfg.max_prompt_len + cfg.max_response_len > max_pos:
        raise ConfigError(f"max_prompt_len + max_response_len = {cfg.max_prompt_len + cfg.max_response_len} exceeds "
                          f"the model's max_position_embeddings={max_pos}")
    if cfg.token_budget < cfg.max_prompt_len + cfg.max_response_len:
        raise ConfigError(f"token_budget={cfg.token_budget} is below one full row "
                          f"(max_prompt_len + max_response_len = {cfg.max_prompt_len + cfg.max_response_len})")


# ---------------------------------------------------------------------------------------------
# Distributed setup
# ---------------------------------------------------------------------------------------------


def init_distributed() -> tuple[int, int, torch.device]:
    """Process group from torchrun's env (a 1-rank group when run as plain python)."""
    if "RANK" not in os.environ:  # plain `python trainer.py`: a world of one, same code path
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def all_sum(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(value, device):
    """Max over ranks of an int or float, returned as the same type."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return type(value)(t.item())


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

REQUIRED_KEYS = {"rl": ("prompt",), "sft": ("prompt", "completion")}
TASK_KEYS = {"math": ("answer",), "code": ("tests",), "triton": ("reference_code",)}


def read_records(path: str):
    """(line or row number, record) from a .jsonl or .parquet file; bad JSON names its line."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        yield from enumerate(pq.read_table(path).to_pylist(), 1)
        return
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def normalize_row(row, where: str, mode: str) -> dict:
    """Our layout {prompt, answer | tests | reference_code, task} or verl's {prompt: [chat messages],
    reward_model: {ground_truth}, data_source} -> ours (prompt may stay a message list).
    Anything malformed is an error naming `where` (file:line) and the problem."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected an object, got {type(row).__name__}")
    if "reward_model" in row:
        rm = row["reward_model"]
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ConfigError(f"{where}: reward_model must be an object with 'ground_truth' (verl layout)")
        row = {**row, "answer": str(rm["ground_truth"])}
    task = row.get("task", "math")
    if mode == "rl" and task not in TASK_KEYS:
        raise ConfigError(f"{where}: unknown task {task!r} (one of {sorted(TASK_KEYS)})")
    for k in REQUIRED_KEYS[mode] + (TASK_KEYS[task] if mode == "rl" else ()):
        if k not in row:
            raise ConfigError(f"{where}: missing key {k!r}")
    prompt = row["prompt"]
    is_chat = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if not (isinstance(prompt, str) and prompt) and not is_chat:
        raise ConfigError(f"{where}: 'prompt' must be a non-empty string or a list of {{role, content}} messages")
    return {**row, "task": task, "data_source": str(row.get("data_source", "default"))}


def load_rows(path: str, mode: str) -> list[dict]:
    """Rows of a .jsonl or .parquet file, normalised; a malformed row is an error naming file and row."""
    rows = [normalize_row(rec, f"{path}:{n}", mode) for n, rec in read_records(path)]
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def prompt_text(prompt, tok, chat_template: bool) -> str:
    """A string prompt, or chat messages, as the text the model sees: through the tokenizer's chat
    template when it has one and `chat_template` is on; otherwise messages' contents joined."""
    if chat_template and getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def tokenize_prompts(rows: list[dict], tok, max_len: int, chat_template: bool) -> tuple[list[dict], int]:
    """Adds row['prompt_ids']; drops rows whose prompt is over max_len tokens. -> (kept, skipped)."""
    kept = []
    for row in rows:
        ids = tok(prompt_text(row["prompt"], tok, chat_template), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_len:
            kept.append({**row, "prompt_ids": ids})
    return kept, len(rows) - len(kept)


class PromptSource:
    """This rank's share of a seeded per-epoch shuffle: draw() -> (prompt_id, prompt_ids, row).
    prompt_id is a unique draw number (epoch * N + index): it seeds sampling and names requests."""

    def __init__(self, rows: list[dict], seed: int, rank: int, world: int):
        self.rows, self.seed, self.rank, self.world = rows, seed, rank, world
        self.cursor = 0  # draws made by this rank

    def draw(self):
        per_epoch = len(self.rows) // self.world
        epoch, i = divmod(self.cursor, per_epoch)
        order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + epoch))
        idx = int(order[i * self.world + self.rank])
        self.cursor += 1
        row = self.rows[idx]
        return epoch * len(self.rows) + idx, row["prompt_ids"], row


# ---------------------------------------------------------------------------------------------
# Model: HF causal LM, FSDP2 per decoder layer + root, token-budget micro-batches
# ---------------------------------------------------------------------------------------------


def build_model(path: str, device, trainable: bool):
    """AutoModelForCausalLM from a local folder, fully_shard on every decoder layer and the root.
    fp32 parameters; on CUDA the forward runs in bf16 (MixedPrecisionPolicy), grads reduce in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM
    import importlib.util
    attn = "flash_attention_2" if device.type == "cuda" and importlib.util.find_spec("flash_attn") else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn).to(device)
    if trainable:
        model.gradient_checkpointing_enable() if device.type == "cuda" else None
    else:
        model.requires_grad_(False)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda" \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def full_named_tensors(model, dtype=None):
    """(name, full tensor) per parameter, gathering FSDP2 shards (a collective: all ranks iterate)."""
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield name, (t.detach() if dtype is None else t.detach().to(dtype))


@dataclass
class Row:
    """One training sequence: prompt + response, with what the loss needs per response token."""
    prompt_ids: list[int]
    response: list[int]
    old_logp: list[float] | None = None  # (T_i,) old log-probs (RL)
    adv: float | list[float] = 0.0  # sequence advantage, or (T_i,) per-token advantages (PRIME)

    def __len__(self):
        return len(self.prompt_ids) + len(self.response)


def token_budget_batches(rows: list[Row], budget: int, device) -> list[list[int]]:
    """Row indices grouped so rows x padded length <= budget (longest first, so padding stays small).
    Every rank gets the same number of micro-batches (FSDP needs matching collectives): a rank with
    fewer gets empty ones, which run a dummy forward with zero loss."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    batches, cur, cur_max = [], [], 0
    for i in order:
        m = max(cur_max, len(rows[i]))
        if cur and m * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, m = [], len(rows[i])
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    return batches + [[] for _ in range(all_max(len(batches), device) - len(batches))]


def response_window(model, rows: list[Row], device):
    """Left-padded forward over prompt+response, keeping only the last K+1 logits (K = longest
    response): each row's response is right-aligned in a (b, K) window.
    -> logits (b, K, V) predicting targets (b, K), mask (b, K) of real response tokens.
    An empty `rows` (a rank's padding micro-batch) runs a 1-token dummy forward: FSDP's collectives
    must match across ranks."""
    if not rows:
        logits = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device)).logits  # (1, 1, V)
        return logits, torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, 1, device=device)
    L = max(len(r) for r in rows)
    K = max(1, max(len(r.response) for r in rows))
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    attn = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), K)
    for i, r in enumerate(rows):
        seq = r.prompt_ids + r.response
        ids[i, L - len(seq):] = torch.tensor(seq)
        attn[i, L - len(seq):] = 1
        mask[i, K - len(r.response):] = 1
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # (b, L) positions restart at each row's first real token
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=K + 1).logits
    return logits[:, :K], ids[:, L - K:], mask  # (b, K, V), (b, K), (b, K)


def response_logprobs(model, rows: list[Row], device, temperature: float, with_entropy: bool = False):
    """-> logp (b, K), entropy (b, K) or None, mask (b, K): log-probs of each row's response tokens
    at the sampling temperature, right-aligned (see response_window)."""
    from kernels import token_logprobs
    logits, targets, mask = response_window(model, rows, device)
    logp, ent = token_logprobs(logits, targets, temperature=temperature, with_entropy=with_entropy)
    return logp, ent, mask


def right_aligned(values: list[list[float]], K: int, device) -> torch.Tensor:
    """Per-row lists -> (b, K) tensor, each row right-aligned (matches response_logprobs)."""
    out = torch.zeros(len(values), K)
    for i, v in enumerate(values):
        if v:
            out[i, K - len(v):] = torch.tensor(v)
    return out.to(device)


# ---------------------------------------------------------------------------------------------
# Run state
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    cfg: Config
    rank: int
    world: int
    device: torch.device
    tok: typing.Any
    policy: typing.Any
    optim: torch.optim.Optimizer
    sched: typing.Any
    run_dir: Path
    ref: typing.Any = None  # frozen FSDP2 copy of the initial policy (k3 KL, PRIME reference)
    prm: typing.Any = None  # PRIME's implicit PRM (FSDP2) and its optimizer
    prm_optim: typing.Any = None
    engine: typing.Any = None
    scheduler: typing.Any = None  # CoprisScheduler
    prompts: PromptSource | None = None
    pool: typing.Any = None  # RewardPool
    eval_rows: list = field(default_factory=list)
    policy_version: int = 0  # optimizer steps taken
    engine_version: int = 0  # policy version the engine's weights hold
    counters: dict = field(default_factory=dict)  # run totals (reward timeouts, skipped updates...)
    sinks: list = field(default_factory=list)  # rank 0: extra metric sinks (tensorboard, wandb): f(metrics)


def make_optimizer(cfg: Config, model, total_steps: int):
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                              weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    cosine = cfg.mode == "sft"

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if not cosine:
            return 1.0
        frac = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return optim, torch.optim.lr_scheduler.LambdaLR(optim, lr_at)


def clip_grad_norm(model, max_norm: float) -> float:
    """Clip the model's gradients to a global norm; -> the norm before clipping (FSDP2: all shards)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def optimizer_step(run: Run) -> tuple[float, bool]:
    """Clip, check finite, step. -> (grad norm, applied). A non-finite grad skips the update."""
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
    run.sched.step()
    return norm, applied


class Timer:
    """with t("phase"): ... accumulates seconds per phase into t.s."""

    def __init__(self):
        self.s: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# RL step, top to bottom
# ---------------------------------------------------------------------------------------------


def push_weights_if_stale(run: Run) -> None:
    """Wake the engine and load the policy's current weights into it (all ranks, in lockstep)."""
    if run.engine_version != run.policy_version:
        dtype = torch.bfloat16 if run.device.type == "cuda" else None
        run.engine.push_weights(full_named_tensors(run.policy, dtype))
        run.engine_version = run.policy_version
    run.engine.wake()


def score_groups(run: Run, groups) -> tuple[torch.Tensor, dict]:
    """Score every sample not yet scored (one pool call); -> rewards (B,) in group order, reason counts."""
    todo = [g for g in groups if g.scores is None]
    flat = run.pool.score([(g.row, run.tok.decode(t.tokens, skip_special_tokens=True)) for g in todo for t in g.samples])
    for i, g in enumerate(todo):
        g.scores = flat[i * len(g.samples):(i + 1) * len(g.samples)]
    reasons: dict[str, int] = {}
    for g in groups:
        for _, info in g.scores:
            reasons[info.get("reason", "?")] = reasons.get(info.get("reason", "?"), 0) + 1
    return torch.tensor([sc for g in groups for sc, _ in g.scores], dtype=torch.float32), reasons


def informative_group(run: Run):
    """keep_group for dynamic sampling: score the group as it completes, keep it unless every
    sample got the same reward (its advantages would all be 0)."""
    def keep(group) -> bool:
        score_groups(run, [group])
        return len({sc for sc, _ in group.scores}) > 1
    return keep


@torch.no_grad()
def fill_old_logprobs(run: Run, trajectories) -> None:
    """Cross-stage old log-probs: for each trajectory, append values for the tokens sampled since
    its last fill, computed by the policy that sampled them (the current one, before the update),
    or taken from the engine (copris.old_logprob_source: rollout). Earlier stages keep theirs."""
    if run.cfg.copris.old_logprob_source == "rollout":
        for t in trajectories:
            t.old_logprobs = list(t.logprobs)
        return
    need = [t for t in trajectories if len(t.old_logprobs) < len(t.tokens)]
    rows = [Row(t.prompt_ids, t.tokens) for t in need]
    for mb in token_budget_batches(rows, run.cfg.token_budget, run.device):
        logp, _, _ = response_logprobs(run.policy, [rows[i] for i in mb], run.device, run.cfg.temperature)
        for j, i in enumerate(mb):
            T = len(rows[i].response)
            new = logp[j, logp.shape[1] - T:].tolist()
            need[i].old_logprobs += new[len(need[i].old_logprobs):]


def accuracy_in_range(run: Run):
    """keep_group for PRIME: score the group as it completes; keep it if its accuracy lies in
    [prime.filter_low, prime.filter_high] (CoPRIS then keeps collecting until B groups pass)."""
    from rewards.advantages import accuracy_filter

    def keep(group) -> bool:
        score_groups(run, [group])
        r = torch.tensor([sc for sc, _ in group.scores])
        return bool(accuracy_filter(r, len(r), run.cfg.prime.filter_low, run.cfg.prime.filter_high)[0])
    return keep


def prime_step(run: Run, rows: list[Row], outcome: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """PRIME: token rewards r_t = beta * (log pi_prm - log pi_ref) and one PRM update with
    BCE(sigmoid(beta * sum_t (log pi_prm - log pi_ref)), outcome). update=after: the rewards come from
    the same (pre-update) forward; update=before: update first, then recompute them.
    -> (B, T) right-aligned token rewards, stats."""
    from kernels import implicit_prm_rewards
    cfg, p = run.cfg, run.cfg.prime
    T = max(len(r.response) for r in rows)
    token_r = torch.zeros(len(rows), T)
    n_rows = all_sum([len(rows)], run.device)[0]
    stats = {"prm_loss": 0.0, "prm_acc": 0.0}

    def ref_logp(batch: list[Row], K: int) -> torch.Tensor:
        if p.ref == "policy":  # the rollout policy's old log-probs
            return right_aligned([r.old_logp for r in batch], K, run.device)
        return reference_logprobs(run, batch)

    def forward(with_grad: bool) -> None:
        for mb in token_budget_batches(rows, cfg.token_budget, run.device):
            batch = [rows[i] for i in mb]
            with torch.no_grad():
                ref = ref_logp(batch, max([len(r.response) for r in batch], default=1))
            with torch.set_grad_enabled(with_grad):
                prm, _, mask = response_logprobs(run.prm, batch, run.device, cfg.temperature)  # (b, K)
                r = implicit_prm_rewards(prm, ref, mask, p.beta)  # (b, K)
                if not batch:
                    if with_grad:
                        (r.sum() * 0.0).backward()
                    continue
                y = outcome[mb].to(run.device)  # (b,)
                seq = r.sum(1)  # (b,) implicit sequence reward
                loss = torch.nn.functional.binary_cross_entropy_with_logits(seq, y, reduction="sum")
                if with_grad:
                    (loss * run.world / n_rows).backward()  # FSDP averages over ranks: global mean
                    stats["prm_loss"] += loss.item() / n_rows
                    stats["prm_acc"] += ((seq > 0).float() == (y > 0.5).float()).sum().item() / n_rows
            for j, i in enumerate(mb):
                token_r[i, T - len(rows[i].response):] = r[j, r.shape[1] - len(rows[i].response):].detach().cpu()
    forward(with_grad=True)
    norm = clip_grad_norm(run.prm, cfg.grad_clip)
    if math.isfinite(norm):
        run.prm_optim.step()
    run.prm_optim.zero_grad(set_to_none=True)
    if p.update == "before":
        forward(with_grad=False)
    valid = torch.cat([token_r[i, T - len(r.response):] for i, r in enumerate(rows)])
    stats["prm_loss"], stats["prm_acc"] = all_sum([stats["prm_loss"], stats["prm_acc"]], run.device)
    s1, s2, n = all_sum([float(valid.sum()), float((valid ** 2).sum()), valid.numel()], run.device)
    stats.update(process_reward_mean=s1 / n, process_reward_std=math.sqrt(max(0.0, s2 / n - (s1 / n) ** 2)),
                 prm_grad_norm=norm)
    return token_r, stats


def policy_update(run: Run, rows: list[Row]) -> dict:
    """PPO-clip over `mini_batches` optimizer steps; each is a set of token-budget micro-batches
    whose losses are scaled so the gradient is that of the global (all-rank) aggregate. The loss runs
    through kernels.fused_logits_ppo_loss: on CUDA one Triton pass computes logp, entropy, the
    clipped loss and dlogits; on CPU it falls back to token_logprobs + ppo_loss."""
    from kernels import fused_logits_ppo_loss
    cfg = run.cfg
    stats = dict.fromkeys(("loss", "clip_frac", "approx_kl", "ratio_max", "entropy", "grad_norm"), 0.0)
    per_mini = math.ceil(len(rows) / cfg.mini_batches)
    for m in range(cfg.mini_batches):
        mini = rows[m * per_mini:(m + 1) * per_mini]
        tokens, seqs = all_sum([sum(len(r.response) for r in mini), len(mini)], run.device)
        denom = tokens if cfg.loss_agg == "token-mean" else seqs
        for mb in token_budget_batches(mini, cfg.token_budget, run.device):
            batch = [mini[i] for i in mb]
            ref = reference_logprobs(run, batch) if cfg.kl_coef > 0 else None  # (b, K)
            logits, targets, mask = response_window(run.policy, batch, run.device)
            if not batch:
                (logits.sum() * 0.0).backward()
                continue
            K = targets.shape[1]
            old = right_aligned([r.old_logp for r in batch], K, run.device)  # (b, K)
            adv = right_aligned([r.adv for r in batch], K, run.device) if isinstance(batch[0].adv, list) \
                else torch.tensor([r.adv for r in batch], device=run.device)  # (b, K) or (b,)
            n_local = mask.sum().item() if cfg.loss_agg == "token-mean" else len(batch)
            scale = n_local * run.world / denom  # this micro-batch's share; FSDP averages grads over ranks
            loss, s = fused_logits_ppo_loss(logits, targets, old, adv, mask, cfg.clip_low, cfg.clip_high,
                                            cfg.dual_clip, ref, cfg.kl_coef, cfg.loss_agg, cfg.temperature,
                                            entropy_coef=cfg.entropy_coef, grad_scale=scale)
            (loss * scale).backward()
            stats["loss"] += loss.item() * scale / run.world
            for k in ("clip_frac", "approx_kl", "entropy"):  # token-weighted over all ranks
                stats[k] += s[k] * mask.sum().item() / tokens
            stats["ratio_max"] = max(stats["ratio_max"], s["ratio_max"])
        norm, _ = optimizer_step(run)
        stats["grad_norm"] += norm / cfg.mini_batches
    summed = all_sum([stats[k] for k in ("loss", "clip_frac", "approx_kl", "entropy")], run.device)
    stats.update(zip(("loss", "clip_frac", "approx_kl", "entropy"), summed))
    stats["ratio_max"] = all_max(float(stats["ratio_max"]), run.device)
    return stats


@torch.no_grad()
def reference_logprobs(run: Run, batch: list[Row]) -> torch.Tensor:
    """(b, K) log-probs of the frozen reference policy (k3 KL term), right-aligned like the policy's.
    Runs for a rank's empty padding micro-batch too, keeping FSDP's collectives in step."""
    return response_logprobs(run.ref, batch, run.device, run.cfg.temperature)[0]


def rl_step(run: Run, step: int, advantage_fn) -> dict:
    cfg, t = run.cfg, Timer()
    # 1. weights: the engine samples with the current policy
    with t("weight_push"):
        push_weights_if_stale(run)
    # 2. rollout: until B/world groups are complete on this rank; the rest waits in the buffer
    version = run.policy_version
    keep = accuracy_in_range(run) if cfg.prime.enabled else informative_group(run) if cfg.copris.dynamic_sampling else None
    with t("rollout"):
        groups, rstats = run.scheduler.collect(run.engine, run.prompts.draw, version=version, keep_group=keep)
    # 3. the engine gives the accelerator back to training
    run.engine.sleep()
    # 4. rewards, one per sample (B,) in group order (dynamic sampling scored them already)
    with t("reward"):
        rewards, reasons = score_groups(run, groups)
    # 5. old log-probs for the finished samples and the buffered partial ones (cross-stage)
    trajs = [tr for g in groups for tr in g.samples]
    with t("old_logprobs"):
        fill_old_logprobs(run, trajs + [tr for g in run.scheduler.buffer for tr in g.samples])
    rows = [Row(tr.prompt_ids, tr.tokens, tr.old_logprobs[:len(tr.tokens)]) for tr in trajs]
    # 6. advantages: PRIME (token rewards from the online PRM, which takes a step on the outcomes;
    #    per-token advantages) or GRPO / RLOO (one per sample, broadcast over its tokens)
    prm_stats = {}
    if cfg.prime.enabled:
        with t("prm"):
            token_r, prm_stats = prime_step(run, rows, rewards)  # (B, T) right-aligned
        mask = right_aligned([[1.0] * len(r.response) for r in rows], token_r.shape[1], "cpu")  # (B, T)
        adv_t = prime_advantages(rewards, token_r, mask, cfg.n_samples, cfg.prime.gamma, cfg.prime.outcome_coef,
                                 cfg.prime.process_coef)  # (B, T)
        for i, r in enumerate(rows):
            r.adv = adv_t[i, adv_t.shape[1] - len(r.response):].tolist()
    else:
        for r, a in zip(rows, advantage_fn(rewards, cfg.n_samples)):  # (B,)
            r.adv = float(a)
    # 7. policy update
    with t("update"):
        ustats = policy_update(run, rows)
    # 8. metrics (all ranks)
    return {"step": step, **step_metrics(run, version, trajs, rewards, reasons, rstats, t.s),
            **ustats, **prm_stats, **{f"time/{k}": v for k, v in t.s.items()}}


def step_metrics(run: Run, version: int, trajs, rewards, reasons: dict, rstats, seconds: dict) -> dict:
    """Rollout and reward figures of one step, summed over ranks."""
    lengths = [len(tr.tokens) for tr in trajs]
    off_policy = sum(v != version for tr in trajs for v in tr.versions)  # tokens sampled by an older policy
    buffered = sum(len(tr.tokens) for g in run.scheduler.buffer for tr in g.samples)
    (reward, n, tokens, truncated, new_tokens, off_policy, timeouts, errors, buffered, dropped) = all_sum(
        [float(rewards.sum()), len(rewards), sum(lengths), sum(tr.finish_reason == "length" for tr in trajs),
         rstats.new_tokens, off_policy, reasons.get("timeout", 0), reasons.get("crash", 0) + reasons.get("error", 0),
         buffered, rstats.dropped_groups], run.device)
    every = [None] * run.world
    dist.all_gather_object(every, lengths)
    every = sorted(x for part in every for x in part)
    out = {"reward": reward / n, "response_len": tokens / n, "response_len_p50": every[len(every) // 2],
           "response_len_p90": every[int(len(every) * 0.9)], "response_len_max": every[-1],
           "truncated_frac": truncated / n, "rollout_tokens": new_tokens,
           "off_policy_token_frac": off_policy / max(1, tokens),
           "reward_timeouts": timeouts, "reward_errors": errors, "buffer_tokens": buffered, "dropped_groups": dropped,
           "rollout_tok_per_s": new_tokens / max(1e-9, seconds["rollout"]), "max_in_flight": rstats.max_in_flight}
    if run.device.type == "cuda":  # model FLOPs: 6 N per trained token, 2 N per generated / re-scored token
        n_params = sum(p.numel() for p in run.policy.parameters())
        flops = n_params * (6 * tokens + 2 * (new_tokens + tokens))
        out["mfu"] = flops / (sum(seconds.values()) * run.world * run.cfg.peak_tflops * 1e12)
        out["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


@torch.no_grad()
def evaluate(run: Run, samples_out: Path | None = None) -> dict:
    """Held-out accuracy per data_source and overall: greedy, mean@k and pass@k (unbiased), with
    k = eval_samples completions sampled at `temperature`. Each rank evaluates its share of the rows.
    samples_out: rank 0 writes every completion with its score there (jsonl)."""
    cfg, k = run.cfg, run.cfg.eval_samples
    push_weights_if_stale(run)
    rows = run.eval_rows[run.rank::run.world]
    eos = [run.tok.eos_token_id]
    prompts, params = [], []
    for i, row in enumerate(rows):
        prompts += [row["prompt_ids"]] * (k + 1)
        params.append(run.engine.sampling(cfg.max_response_len, 0.0, 1.0, None, eos))
        params += [run.engine.sampling(cfg.max_response_len, cfg.temperature, cfg.top_p, cfg.seed * 7919 + i * 131 + j,
                                       eos) for j in range(k)]
    texts = [run.tok.decode(toks, skip_special_tokens=True) for toks, _ in run.engine.generate(prompts, params)]
    scores = run.pool.score([(rows[i // (k + 1)], t) for i, t in enumerate(texts)])
    sources = sorted({r["data_source"] for r in run.eval_rows})
    sums = [0.0] * (4 * len(sources))  # per source: greedy, sampled correct, pass@k, rows
    for i, row in enumerate(rows):
        s = scores[i * (k + 1):(i + 1) * (k + 1)]
        c = sum(x for x, _ in s[1:])
        base = 4 * sources.index(row["data_source"])
        for j, v in enumerate((s[0][0], c, pass_at_k(k, int(c), k), 1)):
            sums[base + j] += v
    tot = all_sum(sums, run.device)
    if samples_out is not None:
        mine = [{"id": row.get("id"), "data_source": row["data_source"], "kind": "greedy" if j == 0 else "sample",
                 "completion": texts[i * (k + 1) + j], "score": scores[i * (k + 1) + j][0],
                 "reason": scores[i * (k + 1) + j][1].get("reason")} for i, row in enumerate(rows) for j in range(k + 1)]
        gathered = [None] * run.world
        dist.all_gather_object(gathered, mine)
        if run.rank == 0:
            samples_out.write_text("".join(json.dumps(r) + "\n" for part in gathered for r in part))
    run.engine.sleep()

    def acc(t: list[float], prefix: str) -> dict:
        n = max(t[3], 1)
        return {f"{prefix}greedy_acc": t[0] / n, f"{prefix}mean@{k}": t[1] / (n * k), f"{prefix}pass@{k}": t[2] / n}
    per = {src: tot[4 * i:4 * i + 4] for i, src in enumerate(sources)}
    out = acc([sum(v[j] for v in per.values()) for j in range(4)], "eval/")
    if len(sources) > 1:
        for src, t in per.items():
            out.update(acc(t, f"eval/{src}/"))
    out["eval/rows"] = sum(v[3] for v in per.values())
    return out


def print_eval_table(metrics: dict, k: int) -> None:
    """One line per data source (and 'all'): greedy, mean@k, pass@k."""
    print(f"{'source':24} {'greedy':>8} {f'mean@{k}':>8} {f'pass@{k}':>8}")
    keys = sorted({key[5:-len('greedy_acc') - 1] for key in metrics if key.endswith("/greedy_acc") and key != "eval/greedy_acc"})
    for name, prefix in [("all", "eval/")] + [(src, f"eval/{src}/") for src in keys]:
        print(f"{name:24} {metrics[prefix + 'greedy_acc']:8.3f} {metrics[prefix + f'mean@{k}']:8.3f} "
              f"{metrics[prefix + f'pass@{k}']:8.3f}")


# ---------------------------------------------------------------------------------------------
# Export, metrics, plots
# ---------------------------------------------------------------------------------------------


def export_hf(run: Run, out: Path) -> None:
    """HF folder (config, model.safetensors, tokenizer) that transformers and vLLM load. All ranks call."""
    from safetensors.torch import save_file
    state = {n: t.cpu().contiguous() for n, t in full_named_tensors(run.policy)}
    if run.rank == 0:
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if getattr(run.policy.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        run.policy.config.save_pretrained(tmp)
        run.tok.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    dist.barrier()


def log_metrics(run: Run, metrics: dict) -> None:
    """Rank 0: append to metrics.jsonl (always), then tensorboard / wandb when configured."""
    if run.rank == 0:
        with open(run.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        for sink in run.sinks:
            sink(metrics)


def metric_sinks(cfg: Config, run_dir: Path) -> list:
    """Optional loggers, imported only when configured; a missing package is a config error."""
    sinks = []
    if cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("tensorboard: true needs the tensorboard package (pip install tensorboard)") from None
        writer = SummaryWriter(str(run_dir / "tb"))
        sinks.append(lambda m: [writer.add_scalar(k, v, m["step"]) for k, v in m.items()
                                if isinstance(v, (int, float)) and k != "step"] and writer.flush())
    if cfg.wandb_project:
        try:
            import wandb
        except ImportError:
            raise ConfigError("wandb_project is set but wandb is not installed (pip install wandb)") from None
        wb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), config=dataclasses.asdict(cfg))
        sinks.append(lambda m: wb.log({k: v for k, v in m.items() if k != "step"}, step=m["step"]))
    return sinks


def plot_run(run_dir: Path) -> Path:
    """metrics.jsonl -> plot.png: training reward, held-out accuracy, response length, time per phase.
    Also a command: python trainer.py --plot RUN_DIR"""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    train = [r for r in rows if "reward" in r]
    evals = [r for r in rows if "eval/greedy_acc" in r]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    steps = [r["step"] for r in train]
    ax[0, 0].plot(steps, [r["reward"] for r in train], label="train reward (mean)")
    for key in sorted({k for r in evals for k in r if k.startswith("eval/") and k.count("/") == 1 and k != "eval/rows"}):
        ax[0, 1].plot([r["step"] for r in evals], [r[key] for r in evals], marker="o", label=key[5:])
    for key in ("response_len", "response_len_p90", "response_len_max"):
        ax[1, 0].plot(steps, [r.get(key, float("nan")) for r in train], label=key)
    phases = sorted({k for r in train for k in r if k.startswith("time/")})
    ax[1, 1].stackplot(steps, *[[r.get(p, 0.0) for r in train] for p in phases], labels=[p[5:] for p in phases])
    for a, title in zip(ax.flat, ("training reward", "held-out accuracy", "response length (tokens)",
                                  "seconds per step, by phase")):
        a.set_title(title), a.set_xlabel("step"), a.legend(fontsize=8)
    fig.tight_layout()
    out = run_dir / "plot.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------
# Resumable checkpoints: atomic (tmp folder renamed once complete, with a manifest)
# ---------------------------------------------------------------------------------------------


def save_checkpoint(run: Run, step: int) -> Path:
    """Model + optimizer (torch.distributed.checkpoint, sharded), per-rank RNG / data cursor / partial
    buffer, and the run's step, LR schedule and counters. Written to step_N.tmp, renamed to step_N
    when every rank is done: a folder without manifest.json is never taken for a checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    root = run.run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f"step_{step:06d}.tmp"
    if run.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(run.policy, run.optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    torch.save({"torch_rng": torch.get_rng_state(), "py_rng": random.getstate(), "cursor": run.prompts.cursor,
                "rollout": run.scheduler.state_dict()}, tmp / f"rank{run.rank}.pt")
    dist.barrier()
    if run.rank == 0:
        (tmp / "manifest.json").write_text(json.dumps({
            "step": step, "world": run.world, "policy_version": run.policy_version, "counters": run.counters,
            "lr_sched": run.sched.state_dict(), "time": time.time()}))
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        for old in complete_checkpoints(root)[:-run.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (half-written .tmp folders are ignored)."""
    return sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp") and (p / "manifest.json").is_file())


def load_checkpoint(run: Run, path: Path) -> int:
    """Restore everything save_checkpoint wrote; -> the step it was taken after."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest["world"] != run.world:
        raise ConfigError(f"checkpoint {path} was written by {manifest['world']} ranks; this run has {run.world}")
    model_sd, optim_sd = get_state_dict(run.policy, run.optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(run.policy, run.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = torch.load(path / f"rank{run.rank}.pt", weights_only=False)  # our own file
    torch.set_rng_state(mine["torch_rng"])
    random.setstate(mine["py_rng"])
    run.prompts.cursor = mine["cursor"]
    run.scheduler.load_state_dict(mine["rollout"])
    run.sched.load_state_dict(manifest["lr_sched"])
    run.policy_version, run.counters = manifest["policy_version"], manifest["counters"]
    return manifest["step"]


def resume_point(cfg: Config) -> Path | None:
    if cfg.resume == "off":
        return None
    if cfg.resume != "auto":
        return Path(cfg.resume)
    found = complete_checkpoints(Path(cfg.run_dir) / "checkpoints")
    return found[-1] if found else None


def truncate_metrics(run: Run, step: int) -> None:
    """Drop metric lines written after the checkpoint's step (they will be produced again)."""
    if run.rank == 0:
        path = run.run_dir / "metrics.jsonl"
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


class StopSignal:
    """SIGTERM / SIGINT set a flag; the loop finishes its step, checkpoints and exits 0."""

    def __init__(self):
        self.raised = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.raised = True

    def agreed(self, device) -> bool:
        """True on every rank once any rank got a signal."""
        return all_max(int(self.raised), device) > 0


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------


def setup(cfg: Config) -> Run:
    rank, world, device = init_distributed()
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed + rank)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(cfg.model_path)
    run_dir = Path(cfg.run_dir)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        if resume_point(cfg) is None:
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    sinks = metric_sinks(cfg, run_dir) if rank == 0 else []
    if cfg.mode == "eval":  # the engine serves model_path as it is: no policy, no optimizer
        return Run(cfg, rank, world, device, tok, None, None, None, run_dir, sinks=sinks)
    policy = build_model(cfg.model_path, device, trainable=True)
    optim, sched = make_optimizer(cfg, policy, cfg.steps)
    return Run(cfg, rank, world, device, tok, policy, optim, sched, run_dir, sinks=sinks)


def start_engine(run: Run):
    """This rank's vLLM engine on model_path (max length = prompt + response)."""
    from rollout.vllm_engine import EngineConfig as VllmConfig, RolloutEngine
    cfg = run.cfg
    return RolloutEngine(VllmConfig(cfg.model_path, cfg.max_prompt_len + cfg.max_response_len, seed=cfg.seed,
                                    dtype="bfloat16" if run.device.type == "cuda" else "float32",
                                    gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
                                    max_num_seqs=cfg.engine.max_num_seqs, enforce_eager=cfg.engine.enforce_eager),
                         distributed=True)


def progress(run: Run, total: int, desc: str):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=run.rank != 0, dynamic_ncols=True, file=sys.stdout)


def train_rl(cfg: Config) -> None:
    from rewards.pool import RewardPool
    from rollout.copris import CoprisScheduler
    rows = load_rows(cfg.train_data, "rl")
    eval_rows = load_rows(cfg.eval_data, "rl") if cfg.eval_data else []
    run = setup(cfg)
    rows, skipped = tokenize_prompts(rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    run.eval_rows, _ = tokenize_prompts(eval_rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    if len(rows) < run.world:
        raise ConfigError(f"{cfg.train_data}: {len(rows)} usable prompts ({skipped} over max_prompt_len) "
                          f"for {run.world} ranks")
    run.counters["prompts_skipped_too_long"] = skipped
    run.prompts = PromptSource(rows, cfg.seed, run.rank, run.world)
    run.pool = RewardPool(cfg.reward_workers, cfg.reward_timeout_s)
    if cfg.kl_coef > 0 or (cfg.prime.enabled and cfg.prime.ref == "frozen"):
        run.ref = build_model(cfg.model_path, run.device, trainable=False)
    if cfg.prime.enabled:  # the PRM starts from the same checkpoint as the policy, with its own AdamW
        run.prm = build_model(cfg.model_path, run.device, trainable=True)
        run.prm_optim = torch.optim.AdamW(run.prm.parameters(), lr=cfg.prime.lr, weight_decay=0.0)
    run.engine = start_engine(run)
    run.scheduler = CoprisScheduler(
        n=cfg.n_samples, groups=cfg.batch_groups // run.world, concurrency=cfg.copris.concurrency,
        max_response_len=cfg.max_response_len, temperature=cfg.temperature, top_p=cfg.top_p,
        stop_token_ids=[run.tok.eos_token_id], seed=cfg.seed, enabled=cfg.copris.enabled,
        staleness_cap=cfg.copris.staleness_cap)
    advantage_fn = (lambda r, k: grpo_advantages(r, k, cfg.scale_std)) if cfg.advantage == "grpo" else rloo_advantages
    start = 0
    ckpt = resume_point(cfg)
    if ckpt is not None:
        start = load_checkpoint(run, ckpt)
        truncate_metrics(run, start)
        if run.rank == 0:
            print(f"resumed from {ckpt} (step {start})")
    stop = StopSignal()
    try:
        t_start = time.time()
        if run.eval_rows and start == 0:
            log_metrics(run, {"step": 0, **evaluate(run)})
        bar = progress(run, cfg.steps, "rl")
        bar.update(start)
        for step in range(start + 1, cfg.steps + 1):
            m = rl_step(run, step, advantage_fn)
            m["elapsed_s"] = time.time() - t_start
            if run.eval_rows and ((cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps):
                m.update(evaluate(run))
            log_metrics(run, m)
            bar.set_postfix(reward=f"{m['reward']:.3f}", len=f"{m['response_len']:.0f}",
                            **{k[5:]: f"{v:.3f}" for k, v in m.items() if k.startswith("eval/") and k.count("/") == 1
                               and k != "eval/rows"})
            bar.update()
            stopping = stop.agreed(run.device)
            if stopping or (cfg.save_every and step % cfg.save_every == 0 and step != cfg.steps):
                path = save_checkpoint(run, step)
            if cfg.export_every and step % cfg.export_every == 0 and step != cfg.steps:
                export_hf(run, run.run_dir / "export")
            if stopping:
                if run.rank == 0:
                    print(f"\nstopped by signal after step {step}; checkpoint {path}; continue with --resume=auto")
                return
        bar.close()
        export_hf(run, run.run_dir / "export")
        if run.rank == 0:
            report_run(run, time.time() - t_start, cfg.steps - start)
    finally:
        run.pool.close()
        run.engine.shutdown()


def report_run(run: Run, seconds: float, steps: int) -> None:
    """Plot, and print held-out accuracy before (first eval) and after (last eval)."""
    plot_run(run.run_dir)
    evals = [r for r in map(json.loads, open(run.run_dir / "metrics.jsonl")) if "eval/greedy_acc" in r]
    if evals:
        k = run.cfg.eval_samples
        a, b = evals[0], evals[-1]
        print(f"held-out accuracy: greedy {a['eval/greedy_acc']:.3f} -> {b['eval/greedy_acc']:.3f}, "
              f"mean@{k} {a[f'eval/mean@{k}']:.3f} -> {b[f'eval/mean@{k}']:.3f}  (steps {a['step']} -> {b['step']}; "
              f"{steps} steps in {seconds:.0f} s, {steps / max(seconds, 1e-9):.3f} steps/s)")
    print(f"metrics: {run.run_dir / 'metrics.jsonl'}  plot: {run.run_dir / 'plot.png'}  export: {run.run_dir / 'export'}")


def train_sft(cfg: Config) -> None:
    """Supervised fine-tuning on prompt/completion rows: loss on completion + eos tokens only."""
    rows = load_rows(cfg.train_data, "sft")
    run = setup(cfg)
    eos = run.tok.eos_token_id
    data = []
    for r in rows:
        p = run.tok(prompt_text(r["prompt"], run.tok, cfg.chat_template), add_special_tokens=False)["input_ids"]
        c = run.tok(r["completion"], add_special_tokens=False)["input_ids"] + [eos]
        if len(p) <= cfg.max_prompt_len and len(c) <= cfg.max_response_len:
            data.append(Row(p, c))
    per_step = cfg.sft_batch_rows // run.world
    if per_step < 1 or len(data) < cfg.sft_batch_rows:
        raise ConfigError(f"sft_batch_rows={cfg.sft_batch_rows} needs >= {run.world} and <= {len(data)} usable rows")
    steps = cfg.sft_epochs * (len(data) // cfg.sft_batch_rows) if cfg.sft_epochs else cfg.steps
    run.optim, run.sched = make_optimizer(cfg, run.policy, steps)
    g = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    bar = progress(run, steps, "sft")
    t0 = time.time()
    for step in range(1, steps + 1):
        if len(order) < cfg.sft_batch_rows:
            order += torch.randperm(len(data), generator=g).tolist()
        batch, order = order[:cfg.sft_batch_rows], order[cfg.sft_batch_rows:]
        mine = [data[i] for i in batch[run.rank::run.world]]
        tokens = all_sum([sum(len(r.response) for r in mine)], run.device)[0]
        loss_sum = 0.0
        for mb in token_budget_batches(mine, cfg.token_budget, run.device):
            logp, _, mask = response_logprobs(run.policy, [mine[i] for i in mb], run.device, 1.0)
            loss = -(logp * mask).sum() * run.world / tokens
            loss.backward()
            loss_sum += loss.item() / run.world
        norm, _ = optimizer_step(run)
        loss_sum = all_sum([loss_sum], run.device)[0]
        log_metrics(run, {"step": step, "sft_loss": loss_sum, "grad_norm": norm, "lr": run.sched.get_last_lr()[0],
                          "elapsed_s": time.time() - t0})
        bar.set_postfix(loss=f"{loss_sum:.3f}")
        bar.update()
    bar.close()
    export_hf(run, run.run_dir / "export")
    if run.rank == 0:
        print(f"sft: {steps} steps in {time.time() - t0:.0f} s, final loss {loss_sum:.3f}; export: {run.run_dir / 'export'}")


def run_eval(cfg: Config) -> None:
    """mode: eval. Held-out metrics of model_path on eval_data: a table, eval_summary.json and every
    completion with its score in eval_samples.jsonl (both in run_dir)."""
    from rewards.pool import RewardPool
    if not cfg.eval_data:
        raise ConfigError("mode: eval needs eval_data")
    rows = load_rows(cfg.eval_data, "rl")
    run = setup(cfg)
    run.eval_rows, skipped = tokenize_prompts(rows, run.tok, cfg.max_prompt_len, cfg.chat_template)
    run.pool, run.engine = RewardPool(cfg.reward_workers, cfg.reward_timeout_s), start_engine(run)
    try:
        metrics = evaluate(run, samples_out=run.run_dir / "eval_samples.jsonl")
        if run.rank == 0:
            metrics["prompts_skipped_too_long"] = skipped
            (run.run_dir / "eval_summary.json").write_text(json.dumps(metrics, indent=1))
            print_eval_table(metrics, cfg.eval_samples)
            print(f"{int(metrics['eval/rows'])} prompts ({skipped} skipped: over max_prompt_len); "
                  f"samples: {run.run_dir / 'eval_samples.jsonl'}")
    finally:
        run.pool.close()
        run.engine.shutdown()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--plot"] and len(argv) == 2:  # python trainer.py --plot RUN_DIR
        print(plot_run(Path(argv[1])))
        return 0
    try:
        cfg = load_config(argv)
        {"sft": train_sft, "rl": train_rl, "eval": run_eval}[cfg.mode](cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"training stopped: {e}", file=sys.stderr)
        return 3
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

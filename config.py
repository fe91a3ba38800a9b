"""Config parsing for the dataclasses at the top of trainer.py: a yaml preset, then `--key=value` /
`--section.key=value` overrides, each value type-checked against its field; `Literal[...]` fields take only
their listed values; an unknown key is an error with a did-you-mean hint; the cross-field checks in validate().
`--help` lists every key with its type, default and the comment next to its field. yaml numbers such as `1e-5` load
as floats (YAML 1.2's rule; PyYAML's 1.1 one reads them as strings).

    cfg = load(Config, ["--config", "configs/demo.yaml", "--lr=1e-5"], world=2)
"""
import argparse
import ast
import dataclasses
import difflib
import importlib.util
import inspect
import io
import json
import math
import os
import re
import struct
import sys
import time
import tokenize
import types
import typing
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A user error in the config or the data: printed without a traceback, exit code 2."""


# ---- sections defined here rather than in trainer.py (trainer.Config holds them like its own) ----


@dataclasses.dataclass
class RewardConfig:  # your reward functions (rewards/user.py) and reward models (rewards/models.py); docs/data.md
    funcs: list[str] = dataclasses.field(default_factory=lambda: [])  # "file.py:function" entries (or "task": the row's
    # own scorer); the reward is their weighted sum, each logged as reward/<function>; [] = the rows' tasks
    weights: list[float] = dataclasses.field(default_factory=lambda: [])  # one per entry of funcs; [] = 1 each
    sandbox: bool = False  # run the functions in the bubblewrap sandbox (rewards/sandbox.py): no network, no files
    models: list[str] = dataclasses.field(default_factory=lambda: [])  # learned reward models (rewards/models.py):
    # local HF sequence-classification folders (num_labels 1); reward += sum_j model_weights[j] * score_j, each
    # logged as reward/<folder name>
    model_weights: list[float] = dataclasses.field(default_factory=lambda: [])  # one per entry of models; [] = 1 each
    models_normalize: bool = False  # standardise each model's scores over the step's samples (every rank) first
    models_shard: bool = False  # FSDP2-shard each reward model over the ranks (1/world of its weights on each) instead
    # of a full replica per rank; every rank then runs as many forwards as the one with the most


@dataclasses.dataclass
class CriticConfig:  # advantage: gae, PPO with a learned value function (rewards/critic.py; docs/algorithms.md)
    model_path: str = ""  # the value model's body: a local HF causal-LM folder with the policy's tokenizer; "" = the
    # policy's initial weights (model_path); a fresh scalar head nn.Linear(H, 1) is added either way
    lr: float = 1e-5  # the critic's AdamW learning rate (verl's critic.optim.lr default); constant
    warmup_steps: int = 0  # the first k RL steps train the critic only, not the policy (verl's critic_warmup)
    cliprange_value: float = 0.5  # c: v_clip = V_old + clamp(v - V_old, -c, c); loss 0.5 max((v-R)^2, (v_clip-R)^2)
    ppo_epochs: int = 1  # passes over each RL batch for the critic (mini_batches optimizer steps each)
    whiten: bool = True  # advantages (A - mean) / std over the model tokens of every rank
    gamma: float = 1.0  # discount: delta_t = r_t + gamma V_{t+1} - V_t (verl's algorithm.gamma)
    lam: float = 1.0  # GAE's lambda: A_t = sum_l (gamma lam)^l delta_{t+l} (verl's algorithm.lam)


# objective -> its paper's values of the keys a run leaves unset (a key the yaml or the command line sets wins)
PAPER_DEFAULTS = {
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},  # GSPO (Zheng et al.), 5.1
    "gspo_token": {"clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},  # the same paper
    "cispo": {"clip_low": 1.0},  # MiniMax-M1: no lower bound on the IS weight; it tunes the upper one, prints none
}


# TRL's and verl's names (docs/from-trl-and-verl.md's tables; tests/test_config.py checks every name there): an
# unknown key that is one of them, or ends in one (verl's dotted paths: actor_rollout_ref.actor.optim.lr), is answered
# with ours; NOT_HERE: the names with no key here, answered with why
OTHER_NAMES = {
    # batch and sampling
    "num_generations": "n_samples", "rollout.n": "n_samples", "train_batch_size": "batch_groups",
    "per_device_train_batch_size": ("batch_groups", "token_budget"), "gradient_accumulation_steps": "batch_groups",
    "steps_per_generation": "mini_batches", "ppo_mini_batch_size": "mini_batches", "num_iterations": "ppo_epochs",
    "use_dynamic_bsz": "token_budget", "ppo_max_token_len_per_gpu": "token_budget",
    "max_prompt_length": "max_prompt_len", "max_completion_length": "max_response_len",
    "max_response_length": "max_response_len", "chat_template_path": "chat_template_file",
    "apply_chat_template_kwargs": "chat_template_file", "filter_groups": "copris.dynamic_sampling",
    "filter_groups.enable": "copris.dynamic_sampling",
    # loss and advantages
    "beta": "kl_coef", "kl_loss_coef": "kl_coef", "use_kl_loss": "kl_coef", "kl_loss_type": "kl_coef",
    "epsilon": "clip_low", "epsilon_high": "clip_high", "clip_ratio_low": "clip_low", "clip_ratio_high": "clip_high",
    "delta": "dual_clip", "clip_ratio_c": "dual_clip", "loss_type": ("loss_agg", "objective"),
    "loss_agg_mode": "loss_agg", "scale_rewards": "scale_std", "norm_adv_by_std_in_grpo": "scale_std",
    "adv_estimator": "advantage", "entropy_coeff": "entropy_coef", "importance_sampling_level": "objective",
    "policy_loss": "objective", "loss_mode": "objective",
    "mask_truncated_completions": ("overlong.filter", "overlong.buffer"),
    "vllm_importance_sampling_correction": "correction.mode", "vllm_importance_sampling_mode": "correction.mode",
    "vllm_importance_sampling_cap": "correction.threshold", "rollout_correction": "correction.mode",
    "rollout_is": "correction.mode", "rollout_is_threshold": "correction.threshold", "rollout_rs": "correction.mode",
    "reward_funcs": "reward.funcs", "reward_weights": "reward.weights", "custom_reward_function": "reward.funcs",
    "custom_reward_function.path": "reward.funcs", "custom_reward_function.name": "reward.funcs",
    "reward_model": "reward.models", "reward_model.enable": "reward.models", "reward_model.model.path": "reward.models",
    "reward_pretrain": "reward.models",
    # PPO with a critic (verl's algorithm.* and critic.*, OpenRLHF's, TRL's PPOConfig)
    "gamma": "critic.gamma", "lam": "critic.lam", "lambd": "critic.lam", "critic.optim.lr": "critic.lr",
    "critic_learning_rate": "critic.lr", "critic.model.path": "critic.model_path",
    "critic_pretrain": "critic.model_path",
    "critic_warmup": "critic.warmup_steps", "cliprange_value": "critic.cliprange_value",
    "value_clip": "critic.cliprange_value",
    # optimizer and model
    "learning_rate": "lr", "optim.lr": "lr", "lr_warmup_steps": "warmup_steps", "warmup_ratio": "warmup_steps",
    "lr_scheduler_type": "lr_schedule", "min_lr_ratio": "lr_schedule", "max_grad_norm": "grad_clip",
    "model_name_or_path": "model_path", "model.path": "model_path", "peft_config": ("lora.rank", "lora.alpha"),
    "lora_rank": "lora.rank", "lora_alpha": "lora.alpha", "target_modules": "lora.target_modules",
    # engine
    "vllm_gpu_memory_utilization": "engine.gpu_memory_utilization",
    "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "engine.tensor_parallel_size",
    "tensor_model_parallel_size": "engine.tensor_parallel_size", "max_num_seqs": "engine.max_num_seqs",
    "enforce_eager": "engine.enforce_eager",
    # run, evaluation, checkpoints
    "max_steps": "steps", "total_training_steps": "steps", "output_dir": "run_dir", "default_local_dir": "run_dir",
    "save_steps": "save_every", "save_freq": "save_every", "save_total_limit": "keep_checkpoints",
    "max_actor_ckpt_to_keep": "keep_checkpoints", "resume_from_checkpoint": "resume", "resume_mode": "resume",
    "resume_from_path": "resume", "eval_steps": "eval_every", "test_freq": "eval_every",
    "val_kwargs.n": "eval_samples", "report_to": ("tensorboard", "wandb_project"),
    "trainer.logger": ("tensorboard", "wandb_project"), "log_completions": "log_samples",
    "num_completions_to_print": "log_samples", "log_val_generations": "log_samples",
    "eval_strategy": ("eval_data", "eval_every"), "eval_dataset": "eval_data",
    "bf16": "precision", "fsdp_config": "precision",
}
NOT_HERE = {
    "vf_coef": "the critic has its own AdamW (critic.lr): a weight on its loss would only rescale its gradients",
    "gradient_checkpointing": "on CUDA the layers are always checkpointed, on CPU never (docs/speed.md)",
    "enable_gradient_checkpointing": "on CUDA the layers are always checkpointed, on CPU never (docs/speed.md)",
    "use_vllm": "always one colocated vLLM engine per rank or engine group",
    "vllm_mode": "always one colocated vLLM engine per rank or engine group",
    "rollout.name": "always one colocated vLLM engine per rank or engine group",
    "vllm_enable_sleep_mode": "on CUDA the engine always sleeps while the policy trains",
    "free_cache_engine": "on CUDA the engine always sleeps while the policy trains",
    "n_gpus_per_node": "python trainer.py --nproc_per_node N (or torchrun --nproc_per_node N)",
    "nnodes": "torchrun --nnodes M (docs/running.md: several nodes)",
}


def other_name_hint(key: str, ours: set[str]) -> str | None:
    """The hint for an unknown top-level key that is TRL's or verl's (OTHER_NAMES, NOT_HERE), or whose dotted tail
    is theirs or ours (`ours`: every key here, dotted for a section); None when it is none of them."""
    parts = key.split(".")
    for tail in (".".join(parts[i:]) for i in range(len(parts))):
        said = OTHER_NAMES.get(tail, tail if tail in ours and tail != key else None)
        if said:
            return "here it is " + " or ".join(repr(k) for k in ((said,) if isinstance(said, str) else said))
        if tail in NOT_HERE:
            return f"not a key here: {NOT_HERE[tail]}"
    return None


def keys_of(cls, prefix: str = "") -> set[str]:
    """Every key of the dataclass cls, a section's as section.key."""
    out = set()
    for name, tp in typing.get_type_hints(cls).items():
        out |= keys_of(tp, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else {prefix + name}
    return out


class _Loader(yaml.SafeLoader):
    """safe_load with YAML 1.2's floats: 1e-5 and 3E+2 are numbers (PyYAML's 1.1 rule wants a dot: 1.0e-5)."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _unwrap_optional(tp):
    """X | None -> (X, True); X -> (X, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


def _convert(value, tp, key: str, from_cli: bool):
    """A CLI string or a yaml value -> the field's type (bool, int, float, str, list[str], Literal, X | None)."""
    tp, optional = _unwrap_optional(tp)
    if optional and (value is None or (from_cli and value.lower() in ("null", "none", "~"))):
        return None
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {list(allowed)}, got {value!r}")
        return value
    if typing.get_origin(tp) is list:
        item = typing.get_args(tp)[0]  # str or float
        if from_cli:
            value = [_convert(v, item, key, True) for v in value.split(",") if v]
        if isinstance(value, list) and item is float:
            value = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            raise ConfigError(f"{key}: expected a list of {item.__name__}s, got {value!r}")
        return value
    if from_cli:
        if tp is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError(f"{key}: expected true/false, got {value!r}")
            return value.lower() in ("true", "1", "yes")
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}") from None
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
        theirs = None if prefix else other_name_hint(key, keys_of(type(obj)))
        theirs = theirs or (f"here it is {OTHER_NAMES[prefix + key]!r}" if prefix + key in OTHER_NAMES else None)
        hint = (f" (TRL's / verl's name; {theirs}: docs/from-trl-and-verl.md)" if theirs
                else f" (did you mean {prefix + near[0]!r}?)" if near else "")
        raise ConfigError(f"unknown config key {prefix + key if theirs else prefix + head!r}{hint}")
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
    setattr(obj, head, _convert(value, tp, full, from_cli))


def read_yaml(path: str) -> dict:
    """A yaml preset as a mapping; a missing, unreadable or malformed file is a ConfigError naming it."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), _Loader)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot be read ({e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def load(cls, argv: list[str], world: int):
    """--config file.yaml (optional) then --key=value overrides -> a validated cls() for `world` ranks."""
    ap = argparse.ArgumentParser(prog="trainer.py", add_help=False)
    ap.add_argument("--config", type=str, default=None)
    ap.add_argument("--help", "-h", action="store_true")
    args, rest = ap.parse_known_args(argv)
    if args.help:
        print_help(inspect.getsourcefile(cls), cls.__name__)
    cfg, given = cls(), set()  # given: the keys the yaml and the command line set
    if args.config:
        for k, v in read_yaml(args.config).items():
            try:
                _apply(cfg, str(k), v, from_cli=False)
            except ConfigError as e:
                raise ConfigError(f"{args.config}: {e}") from None
            given.add(str(k))
    for item in rest:
        if not item.startswith("--") or "=" not in item:
            raise ConfigError(f"bad argument {item!r}: expected --key=value")
        k, v = item[2:].split("=", 1)
        _apply(cfg, k, v, from_cli=True)
        given.add(k)
    said = paper_defaults(cfg, given)
    validate(cfg, world)
    if said and os.environ.get("RANK", "0") == "0" and not os.environ.get("RL_PAPER_DEFAULTS_SAID"):
        print(said, file=sys.stderr, flush=True)
        os.environ["RL_PAPER_DEFAULTS_SAID"] = "1"  # the launcher's ranks inherit it: said once per run
    return cfg


def paper_defaults(cfg, given: set[str]) -> str:
    """Give the keys of PAPER_DEFAULTS[cfg.objective] that are not in `given` their paper's values; -> one line saying
    which ("" when none)."""
    unset = {k: v for k, v in PAPER_DEFAULTS.get(getattr(cfg, "objective", None), {}).items() if k not in given}
    for k, v in unset.items():
        setattr(cfg, k, v)
    return unset and (f"objective {cfg.objective}: its paper's " + ", ".join(f"{k}={v}" for k, v in unset.items())
                      + " (keys you did not set; set them to override)")


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """line number -> (the comment on it, whether the line holds nothing else)."""
    out = {}
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.COMMENT:
            out[t.start[0]] = (t.string.lstrip("#").strip(), not t.line[:t.start[1]].strip())
    return out


def _annotation_name(node) -> str:
    """A field's annotation as --help shows it: int, float|null, frozen|policy (a Literal's values), list."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return "|".join(_annotation_name(n) for n in (node.left, node.right))
    if isinstance(node, ast.Constant) and node.value is None:
        return "null"
    if isinstance(node, ast.Subscript):
        if ast.unparse(node.value) == "Literal":
            return "|".join(str(ast.literal_eval(n)) for n in getattr(node.slice, "elts", [node.slice]))
        return ast.unparse(node.value)
    return ast.unparse(node)


def _default(node):
    """A field's default: a literal, field(default=<literal>) or field(default_factory=lambda: <literal>)."""
    if isinstance(node, ast.Call):
        kw = {k.arg: k.value for k in node.keywords}
        node = kw["default"] if "default" in kw else kw["default_factory"].body
    return ast.literal_eval(node)


def help_text(source: str | Path, top: str = "Config") -> str:
    """Every key of the dataclass `top` in the Python file `source`, grouped by section: --key=<type> (default) and
    the comments on the field's lines and the comment lines right after it. The file is parsed, not imported, so
    `python trainer.py --help` prints without importing torch or the engine."""
    classes, comments = {}, {}
    for path in (__file__, source):  # the sections defined here (RewardConfig...) and the file's own
        text = Path(path).read_text(encoding="utf-8")
        notes = _comments(text)
        for c in ast.parse(text).body:
            if isinstance(c, ast.ClassDef):
                classes[c.name], comments[c.name] = c, notes
    lines = ["usage: python trainer.py [--nproc_per_node=N] [--config FILE.yaml] [--key=value ...]",
             "       torchrun --nproc_per_node N trainer.py [--config FILE.yaml] [--key=value ...]",
             "       python trainer.py --plot RUN_DIR       (plot.png and the summary of a run's metrics.jsonl)",
             "launcher flags (python trainer.py, as torchrun's): --nproc_per_node=N (ranks on this node; starts the",
             "  launcher: config and data checked before any rank starts), --nnodes=M, --node_rank=R, --master_addr=A,",
             "  --master_port=P (several nodes).",
             "A data row's `task` picks its scorer, row check and environment in tasks.py (the task table); the manual is",
             "docs/ (README.md links every page).",
             "objective gspo / gspo_token / cispo: each of these keys left unset takes its paper's value (set it to "
             "override): " + "; ".join(f"{o}: " + ", ".join(f"{k}={v}" for k, v in d.items())
                                        for o, d in PAPER_DEFAULTS.items()), ""]

    def walk(cls: ast.ClassDef, prefix: str):
        fields = [f for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]
        notes = comments[cls.name]
        about = notes.get(cls.lineno, ("", False))[0]
        lines.append(f"[{prefix[:-1] or 'top level'}]" + (f"  {about}" if about and prefix else ""))
        sections = []
        for f in fields:
            kind = _annotation_name(f.annotation)
            if kind in classes:
                sections.append((classes[kind], prefix + f.target.id + "."))
                continue
            said, n = [notes[i][0] for i in range(f.lineno, f.end_lineno + 1) if i in notes], f.end_lineno + 1
            while n in notes and notes[n][1]:  # a comment continued on the lines below the field
                said.append(notes[n][0])
                n += 1
            lines.append(f"  --{prefix}{f.target.id}=<{kind}>  (default: {json.dumps(_default(f.value))})")
            lines.append(f"      {' '.join(said)}")
        lines.append("")
        for sub, p in sections:
            walk(sub, p)
    walk(classes[top], "")
    return "\n".join(lines)


SPIN_COUNT = "30000"  # GOMP_SPINCOUNT on a quiet machine: about 0.3 ms of spinning before a waiting thread sleeps


def idle_cpus(window_s: float = 0.2, stat: str = "/proc/stat") -> float | None:
    """How many CPUs were idle over the next window_s seconds (/proc/stat's first line: idle + iowait over all
    jiffies, times the CPUs counted); None where /proc/stat is unreadable."""
    def sample() -> tuple[list[int], int]:  # (the first line's jiffies, the cpuN lines)
        with open(stat) as f:
            lines = f.read().splitlines()
        return [int(x) for x in lines[0].split()[1:]], sum(ln[:3] == "cpu" and ln[3:4].isdigit() for ln in lines)
    try:
        a, _ = sample()
        time.sleep(window_s)
        b, cpus = sample()
    except (OSError, ValueError, IndexError):
        return None
    d = [y - x for x, y in zip(a, b)]
    return cpus * (d[3] + d[4]) / sum(d) if sum(d) > 0 else None


def openmp_wait(idle: typing.Callable[[], float | None] = idle_cpus) -> str:
    """How OpenMP threads wait at the end of a parallel region, set before torch loads libgomp (which reads it once)
    and only where the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT (a child process inherits the choice).
    Spinning is fastest on a quiet machine and slowest beside other jobs (a thread spins away the time slice its
    partner waits for), so by measurement (docs/speed.md, "The OpenMP wait, chosen by measurement"): with at least
    this process's threads (CPUs / LOCAL_WORLD_SIZE) idle less half a CPU, GOMP_SPINCOUNT=SPIN_COUNT; else, or where
    the load cannot be read, OMP_WAIT_POLICY=PASSIVE (sleep at once). -> "VAR=value", what was set or kept."""
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if var in os.environ:
            return f"{var}={os.environ[var]} (yours)"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux: taskset
    threads = max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    free = idle()
    var, value = ("GOMP_SPINCOUNT", SPIN_COUNT) if free is not None and free >= threads - 0.5 else \
        ("OMP_WAIT_POLICY", "PASSIVE")
    os.environ[var] = value
    return f"{var}={value} ({'?' if free is None else f'{free:.1f}'} of {threads} CPUs idle)"


def checkpoint_numel(model_path: str) -> int | None:
    """Elements of every tensor in model_path's *.safetensors, read from their headers (8-byte little-endian length,
    then JSON {name: {dtype, shape, data_offsets}}), no data read; None where there is no safetensors file."""
    files, n = sorted(Path(model_path).glob("*.safetensors")), 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            n += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
        except (OSError, struct.error, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{f}: not a readable safetensors header ({type(e).__name__}: {e})") from None
    return n if files else None


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), None where it is not there."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


def sleep_backup_problem(cfg, local_ranks: int, available: int | None) -> str | None:
    """LoRA on CUDA: the engine sleeps at level 1 (rollout/vllm_engine.py: nothing pushes the base back), which backs
    its bf16 weights up in pinned host memory while the policy trains: numel x 2 B / engine.tensor_parallel_size per
    rank, local_ranks of them on this host. A lower bound: the sleep also backs up the engine's other allocations
    tagged as weights (buffers, and CUDA-graph memory with engine.enforce_eager false), not measured without a GPU
    and not counted; the message says so. -> why the host cannot hold that, or None (it can, or a figure is
    unknown)."""
    numel = checkpoint_numel(cfg.model_path)
    if numel is None or available is None:
        return None
    t = cfg.engine.tensor_parallel_size
    per_rank = numel * 2 / t
    need = local_ranks * per_rank
    if need <= available:
        return None
    return (f"lora.rank={cfg.lora.rank}: on CUDA the engine sleeps at level 1, which keeps a copy of its bf16 "
            f"weights in pinned host memory: {local_ranks} ranks x {per_rank / 1e9:.1f} GB = {need / 1e9:.1f} GB on "
            f"this host (the weights alone: the buffers and CUDA-graph memory the sleep also copies are not counted), "
            f"but only {available / 1e9:.1f} GB is available (MemAvailable): use fewer ranks per host, "
            f"a host with more memory, or shard the engine (engine.tensor_parallel_size={2 * t} halves each copy)")


def print_help(source: str | Path, top: str = "Config") -> None:
    """Print help_text and exit 0; a reader that stops early (`--help | head`) ends it quietly, not in a
    BrokenPipeError."""
    try:
        print(help_text(source, top), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush writes here
    raise SystemExit(0)


def check_one_batch(cfg, rows: int, what: str = "rows") -> None:
    """A train file with fewer rows than one step takes is refused (RL would draw each prompt several times in a
    step, as separate groups; SFT has no whole batch)."""
    key = "sft_batch_rows" if cfg.mode == "sft" else "batch_groups"
    if rows < getattr(cfg, key):
        raise ConfigError(f"train_data {cfg.train_data}: {rows} {what}, fewer than one step takes ({key}="
                          f"{getattr(cfg, key)}): lower {key} or add rows")


def validate(cfg, world: int) -> None:
    """Impossible settings fail here, before anything expensive starts."""
    if not cfg.model_path:
        raise ConfigError("model_path is required (a local HF model folder)")
    config_json = Path(cfg.model_path) / "config.json"
    if not config_json.is_file():
        raise ConfigError(f"model_path {cfg.model_path!r}: no config.json there (not a local HF model folder)")
    try:
        model_cfg = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{config_json}: not a valid JSON model config ({e})") from None
    if not isinstance(model_cfg, dict):
        raise ConfigError(f"{config_json}: expected a JSON object")
    needed = (("train_data",) if cfg.mode != "eval" else ()) + (("eval_data",) if cfg.eval_data else ())
    for key in needed:
        if not Path(getattr(cfg, key)).is_file():
            raise ConfigError(f"{key} {getattr(cfg, key)!r}: no such file")
    if cfg.mode == "eval" and not cfg.eval_data:
        raise ConfigError("mode: eval needs eval_data")
    for key in ("n_samples", "batch_groups", "max_prompt_len", "max_response_len", "token_budget", "mini_batches",
                "ppo_epochs"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    tools = cfg.tools
    if tools.max_turns < 1 or tools.max_obs_tokens < 1 or tools.tool_steps < 1 or tools.workers < 1 \
            or not tools.timeout_s > 0:
        raise ConfigError(f"tools: max_turns, max_obs_tokens, tool_steps and workers must be >= 1 and timeout_s > 0, "
                          f"got {tools}")
    if not cfg.temperature > 0:
        raise ConfigError(f"temperature must be > 0, got {cfg.temperature} (the loss divides the logits by it; "
                          f"evaluation is greedy already, besides its samples at this temperature)")
    if not cfg.lr > 0 or (cfg.prime.enabled and not cfg.prime.lr > 0):
        raise ConfigError(f"lr and prime.lr must be > 0, got lr={cfg.lr} prime.lr={cfg.prime.lr}")
    if not cfg.dist_timeout_s > 0:
        raise ConfigError(f"dist_timeout_s must be > 0 seconds, got {cfg.dist_timeout_s}")
    t = cfg.engine.tensor_parallel_size
    if t < 1 or world % t:
        raise ConfigError(f"engine.tensor_parallel_size={t} does not divide the {world} ranks (they form world / t "
                          f"engine groups of t consecutive ranks, one vLLM engine each)")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # ranks on this node (torchrun and the launcher set it)
    if local % t:
        raise ConfigError(f"engine.tensor_parallel_size={t} does not divide the {local} ranks per node: an engine "
                          f"group (t consecutive ranks) would span two nodes, which is not supported: use a t that divides it")
    heads = model_cfg.get("num_attention_heads")
    if isinstance(heads, int) and heads % t:
        raise ConfigError(f"engine.tensor_parallel_size={t} does not divide the model's {heads} attention heads "
                          f"(vLLM splits them over the engine's ranks)")
    if cfg.mode == "rl" and cfg.batch_groups % world:
        raise ConfigError(f"batch_groups={cfg.batch_groups} is not divisible by the {world} ranks (each rank "
                          f"trains batch_groups / world whole groups, whatever engine.tensor_parallel_size is)")
    rows = cfg.batch_groups // world * cfg.n_samples  # the rows each rank trains per RL step
    if cfg.mode == "rl" and cfg.mini_batches > rows:
        raise ConfigError(f"mini_batches={cfg.mini_batches} exceeds the {rows} rows each rank trains per step "
                          f"(batch_groups / ranks x n_samples): some mini-batch would be empty; lower mini_batches")
    if cfg.mode == "rl" and cfg.copris.enabled and cfg.copris.concurrency > cfg.engine.max_num_seqs:
        raise ConfigError(f"copris.concurrency={cfg.copris.concurrency} exceeds engine.max_num_seqs="
                          f"{cfg.engine.max_num_seqs}: the engine could not run them all at once "
                          f"(raise engine.max_num_seqs too)")
    if cfg.prime.enabled and not 0 <= cfg.prime.filter_low <= cfg.prime.filter_high <= 1:
        raise ConfigError(f"prime.filter_low/high must satisfy 0 <= low <= high <= 1, got "
                          f"{cfg.prime.filter_low}/{cfg.prime.filter_high}")
    if cfg.prime.enabled and cfg.n_samples < 2:
        raise ConfigError("prime.enabled needs n_samples >= 2 (RLOO baselines)")
    if cfg.objective == "gspo" and (cfg.prime.enabled or cfg.correction.mode in ("token_truncate", "token_mask")):
        raise ConfigError("objective gspo takes one advantage and one weight per sequence: PRIME's per-token "
                          "advantages and token-level corrections need objective gspo_token (or a sequence correction)")
    check_objective(cfg)
    if cfg.dual_clip is not None and cfg.objective != "ppo":
        raise ConfigError(f"dual_clip bounds objective ppo's token clip; objective {cfg.objective} has none: set "
                          f"dual_clip null")
    if cfg.scale_std != "group" and (cfg.advantage != "grpo" or cfg.prime.enabled):
        raise ConfigError(f"scale_std={cfg.scale_std} scales GRPO's advantages; RLOO and PRIME have their own "
                          f"(leave scale_std at group)")
    if not 0 <= cfg.overlong.buffer < cfg.max_response_len:
        raise ConfigError(f"overlong.buffer={cfg.overlong.buffer} must be in [0, max_response_len="
                          f"{cfg.max_response_len})")
    if cfg.prime.enabled and (cfg.overlong.buffer or cfg.overlong.filter):
        raise ConfigError("overlong.buffer / overlong.filter change the outcome rewards and masks PRIME's PRM learns "
                          "from (its label is the outcome in [0, 1]): turn them off with prime.enabled")
    if not 0 <= cfg.lora.rank <= 512 or not 0 <= cfg.lora.dropout < 1 or cfg.lora.alpha <= 0:
        raise ConfigError(f"lora: rank must be in 0..512 (vLLM's largest LoRA rank), dropout in [0, 1) and alpha > 0, "
                          f"got rank={cfg.lora.rank} dropout={cfg.lora.dropout} alpha={cfg.lora.alpha}")
    if cfg.resume not in ("off", "auto") and not (Path(cfg.resume) / "manifest.json").is_file():
        raise ConfigError(f"resume={cfg.resume!r}: not off, auto, or a complete checkpoint folder (no manifest.json)")
    max_pos = model_cfg.get("max_position_embeddings")
    if isinstance(max_pos, int) and cfg.max_prompt_len + cfg.max_response_len > max_pos:
        raise ConfigError(f"max_prompt_len + max_response_len = {cfg.max_prompt_len + cfg.max_response_len} exceeds "
                          f"the model's max_position_embeddings={max_pos}")
    if cfg.token_budget < cfg.max_prompt_len + cfg.max_response_len:
        raise ConfigError(f"token_budget={cfg.token_budget} is below one full row "
                          f"(max_prompt_len + max_response_len = {cfg.max_prompt_len + cfg.max_response_len})")
    if cfg.mode == "rl" and cfg.lora.rank > 0:
        import torch
        if torch.cuda.is_available():  # the engine sleeps only on CUDA
            problem = sleep_backup_problem(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", world)), host_available_bytes())
            if problem:
                raise ConfigError(problem)
    check_critic(cfg)
    check_day_one(cfg)


def check_critic(cfg) -> None:
    """advantage: gae's settings, and what it does not run with (one line each)."""
    c = cfg.critic
    if cfg.advantage != "gae":
        return
    if cfg.prime.enabled and cfg.prime.gamma != 1.0:
        raise ConfigError("advantage: gae with prime.enabled discounts PRIME's process rewards by critic.gamma; "
                          f"prime.gamma={cfg.prime.gamma} is for PRIME's own advantages: leave it at 1")
    if cfg.lora.rank > 0:
        raise ConfigError("advantage: gae with lora.rank > 0 is not supported yet (the critic trains in full)")
    if cfg.engine.tensor_parallel_size > 1:
        raise ConfigError("advantage: gae with engine.tensor_parallel_size > 1 is untested: not supported yet")
    if not c.lr > 0 or c.warmup_steps < 0 or c.ppo_epochs < 1 or not c.cliprange_value > 0:
        raise ConfigError(f"critic: lr and cliprange_value must be > 0, warmup_steps >= 0 and ppo_epochs >= 1, got {c}")
    if not 0 <= c.gamma <= 1 or not 0 <= c.lam <= 1:
        raise ConfigError(f"critic.gamma={c.gamma} and critic.lam={c.lam} must be in [0, 1]")
    if c.model_path and not (Path(c.model_path) / "config.json").is_file():
        raise ConfigError(f"critic.model_path {c.model_path!r}: no config.json there (not a local HF model folder)")
    vocab = [json.loads((Path(p) / "config.json").read_text()).get("vocab_size") for p in (cfg.model_path,
                                                                                           c.model_path) if p]
    if len(set(vocab)) > 1:
        raise ConfigError(f"critic.model_path {c.model_path!r}: vocab_size {vocab[1]} is not the policy's {vocab[0]} "
                          f"(the critic reads the policy's token ids)")


def check_day_one(cfg) -> None:
    """The checks of reward functions, chat template file, sampling filters, schedule, samples and logging backends:
    all before any rank starts (the launcher's preflight runs validate)."""
    if cfg.reward.funcs or cfg.reward.weights:
        from rewards.user import SpecError, parse
        try:
            parse(cfg.reward.funcs, cfg.reward.weights)
        except SpecError as e:
            raise ConfigError(str(e)) from None
    if cfg.reward.sandbox and cfg.reward.funcs:
        from rewards.sandbox import SandboxUnavailable, require_isolation
        try:
            require_isolation(cfg.sandbox_opt_out)
        except SandboxUnavailable as e:
            raise ConfigError(f"reward.sandbox: {e}") from None
    if cfg.reward.models or cfg.reward.model_weights:
        from rewards.models import check
        check(cfg)
    if cfg.chat_template_file and not Path(cfg.chat_template_file).is_file():
        raise ConfigError(f"chat_template_file {cfg.chat_template_file!r}: no such file")
    if cfg.top_k == 0 or cfg.top_k < -1 or not 0 <= cfg.min_p < 1 or not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_k must be -1 (off) or >= 1, min_p in [0, 1) and top_p in (0, 1], got top_k={cfg.top_k} "
                          f"min_p={cfg.min_p} top_p={cfg.top_p}")
    if (cfg.top_p < 1 or cfg.top_k > 0 or cfg.min_p > 0) and \
            (cfg.correction.mode != "none" or cfg.copris.old_logprob_source == "rollout"):
        raise ConfigError("top_p < 1 truncates the sampler's distribution (so do top_k and min_p), and the engine's "
                          "log-probs are then not the trainer's full-vocabulary ones: leave them off with correction.mode"
                          " or rollout old log-probs (docs/algorithms.md)")
    if cfg.log_samples < 0:
        raise ConfigError(f"log_samples must be >= 0, got {cfg.log_samples}")
    for on, package, key in ((cfg.tensorboard, "tensorboard", "tensorboard: true"),
                             (cfg.wandb_project, "wandb", "wandb_project")):
        if on and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{key} needs the {package} package, which is not installed (pip install {package})")


def check_objective(cfg) -> None:
    """Clip and aggregation settings that are accepted by the arithmetic but mean nothing (docs/algorithms.md)."""
    if cfg.dual_clip is not None and not cfg.dual_clip > 1:
        raise ConfigError(f"dual_clip={cfg.dual_clip} must be > 1 (it caps a negative advantage's loss at dual_clip "
                          f"times it; at or below 1 every such token with ratio above it loses its gradient), or null")
    if cfg.clip_low < 0 or cfg.clip_high < 0:
        raise ConfigError(f"clip_low={cfg.clip_low} and clip_high={cfg.clip_high} must be >= 0 (the clip range "
                          f"[1 - clip_low, 1 + clip_high] must contain 1)")
    if cfg.objective in ("gspo", "gspo_token") and cfg.loss_agg == "seq-mean-token-sum-norm":
        raise ConfigError(f"objective {cfg.objective} with loss_agg seq-mean-token-sum-norm weights each sequence by "
                          f"its length, undoing GSPO's length normalisation: use seq-mean-token-mean (the paper's)")
    if cfg.overlong.penalty_factor < 0:
        raise ConfigError(f"overlong.penalty_factor={cfg.overlong.penalty_factor} must be >= 0 (a penalty, not a "
                          f"bonus for length)")

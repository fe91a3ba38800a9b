"""End to end with real parts: SFT then 2 RL steps on 2 torchrun ranks (FSDP2 on gloo, one vLLM
engine per rank, CoPRIS rollout, k3 KL to a frozen FSDP2 reference, dual clip); the exported HF folder holds the
trained weights, loads in transformers, and serves completions through vLLM's OpenAI-compatible server (the
command the README gives); 2 RL steps with one engine sharded over both ranks (tensor parallel 2) match the same
run on one rank."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 2 minutes: make test-slow (CI runs it after make test)
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}


def torchrun(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "trainer.py", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p.stdout


@pytest.fixture(scope="module")
def sft_then_rl(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    common = ["--max_prompt_len=64", "--max_response_len=96", "--token_budget=2048"]
    torchrun("--mode=sft", f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'sft.jsonl'}",
             f"--run_dir={out / 'sft'}", "--sft_epochs=0", "--steps=3", "--sft_batch_rows=16", "--lr=1e-3", *common)
    log = torchrun(f"--model_path={out / 'sft' / 'export'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
                   f"--eval_data={tiny / 'data' / 'eval.jsonl'}", f"--run_dir={out / 'rl'}", "--steps=2",
                   "--n_samples=4", "--batch_groups=4", "--copris.concurrency=6", "--eval_samples=2",
                   "--lr=1e-3", "--eval_every=1", "--kl_coef=0.01", "--dual_clip=3", "--entropy_coef=0.01", *common)
    return out, log


def test_sft_writes_metrics_and_export(sft_then_rl):
    out, _ = sft_then_rl
    first, *rows = [json.loads(l) for l in open(out / "sft" / "metrics.jsonl")]
    assert first["step"] == 0 and first["data/train_rows"] + first["data/train_skipped"] == 400, first
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["sft_loss"] > 0 for r in rows)
    assert (out / "sft" / "export" / "model.safetensors").is_file()


def test_rl_run_logs_steps_evals_and_plot(sft_then_rl):
    out, log = sft_then_rl
    rows = [json.loads(l) for l in open(out / "rl" / "metrics.jsonl")]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert sum("eval/greedy_acc" in r for r in rows) == 3  # before, after step 1, after step 2
    for r in steps:
        assert r["max_in_flight"] <= 6 and r["rollout_tokens"] > 0 and math_ok(r)
    assert (out / "rl" / "plot.png").stat().st_size > 1000
    assert (out / "rl" / "config.yaml").read_text().startswith("mode: rl")
    assert "held-out accuracy (" in log and "pass@2" in log


def math_ok(r):
    return all(v == v for v in r.values() if isinstance(v, float))  # no NaN


def test_export_holds_the_trained_weights(sft_then_rl):
    """The export equals the policy the last checkpoint holds (the final step), and differs from the SFT start."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM
    out, _ = sft_then_rl
    exported = load_file(str(out / "rl" / "export" / "model.safetensors"))
    dcp_to_torch_save(out / "rl" / "checkpoints" / "step_000002" / "dcp", out / "final.pt")
    final = torch.load(out / "final.pt", weights_only=False)["policy"]
    start = load_file(str(out / "sft" / "export" / "model.safetensors"))
    assert set(exported) == set(start) and set(exported) <= set(final)
    for name, t in exported.items():
        assert torch.equal(t, final[name]), f"{name}: export differs from the last checkpoint"
    assert any(not torch.equal(t, start[name]) for name, t in exported.items()), "RL changed nothing"
    model = AutoModelForCausalLM.from_pretrained(out / "rl" / "export")
    assert all(torch.isfinite(v).all() for v in model.parameters())


def documented_chat_request() -> dict:
    """docs/eval.md's chat request body (the last curl block of the page)."""
    import re
    block = (ROOT / "docs" / "eval.md").read_text().split("/v1/chat/completions")[-1]
    return json.loads(re.search(r"-d '(.*?)'", block, re.S).group(1))


def test_export_serves_completions_over_the_openai_api(sft_then_rl):
    """Completions, and docs/eval.md's chat request without --chat-template: the export carries a template that lays
    the user's message out as training did, so the greedy chat reply is the greedy completion of the same prompt."""
    from helpers import openai_server, post
    out, _ = sft_then_rl
    export = str(out / "rl" / "export")
    chat = {**documented_chat_request(), "model": export}
    with openai_server([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", export,
                        "--max-model-len", "256", "--gpu-memory-utilization", "0.1"]) as url:
        reply = post(f"{url}/v1/completions", {"model": export, "prompt": "Ann has 3 apples.", "max_tokens": 8,
                                               "temperature": 0}, timeout=60)
        said = post(f"{url}/v1/chat/completions", chat, timeout=60)
        plain = post(f"{url}/v1/completions", {"model": export, "prompt": chat["messages"][0]["content"],
                                               "max_tokens": chat["max_tokens"], "temperature": 0}, timeout=60)
    assert reply["choices"][0]["finish_reason"] in ("length", "stop") and reply["usage"]["completion_tokens"] >= 1
    assert said["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"], (said, plain)
    assert said["choices"][0]["message"]["content"] == plain["choices"][0]["text"], (said, plain)


def test_tensor_parallel_rl_matches_one_rank(tiny, tmp_path):
    """2 RL steps with one engine over both ranks (engine.tensor_parallel_size=2: G=1 group, each rank trains half
    of its groups) against the same run on one rank (t=1): the same prompts and seeds give the same tokens, so
    rewards, lengths, rollout counts and held-out figures are equal; the update's figures agree to float noise
    (the two halves, normalised globally, make the one rank's batch). A rare sampling tie flipped by TP's other float sums would
    show as a token difference here."""
    common = [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}", "--steps=2",
              "--n_samples=4", "--batch_groups=4", "--copris.concurrency=6", "--max_prompt_len=64",
              "--max_response_len=48", "--token_budget=1024", "--lr=1e-3", "--entropy_coef=0.05", "--save_every=0",
              f"--eval_data={tiny / 'data' / 'eval.jsonl'}", "--eval_samples=2", "--eval_every=0"]
    torchrun(*common, f"--run_dir={tmp_path / 'tp'}", "--engine.tensor_parallel_size=2")
    assert not list(Path("/dev/shm").glob("*-cpushm_*"))  # each rank removed its all-reduce segment on exit
    p = subprocess.run([sys.executable, "trainer.py", *common, f"--run_dir={tmp_path / 'one'}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (tp0, *tp), (one0, *one) = ([json.loads(l) for l in open(tmp_path / d / "metrics.jsonl")] for d in ("tp", "one"))
    assert [r["step"] for r in tp] == [r["step"] for r in one] == [1, 2]
    for a, b in ((tp0, one0), (tp[-1], one[-1])):  # held-out evaluation before the first and after the last step
        evals = {k: v for k, v in b.items() if k.startswith("eval/")}
        assert evals["eval/rows"] == one0["data/eval_rows"] > 0 and {k: a.get(k) for k in evals} == evals, (a, b)
    exact = ("reward", "response_len", "response_len_p90", "response_len_max", "truncated_frac", "rollout_tokens",
             "off_policy_token_frac", "buffer_tokens", "dropped_groups", "max_in_flight")
    for a, b in zip(tp, one):
        assert b["rollout_tokens"] > 0 and b["buffer_tokens"] > 0, b  # partial rollout left work in the buffer
        for k in exact:
            assert a[k] == b[k], f"step {a['step']} {k}: t=2 on 2 ranks {a[k]} vs t=1 on 1 rank {b[k]}"
        for k in ("loss", "grad_norm", "entropy", "approx_kl", "ratio_max"):
            assert abs(a[k] - b[k]) <= 1e-4 * abs(b[k]) + 1e-9, f"step {a['step']} {k}: t=2 {a[k]} vs t=1 {b[k]}"

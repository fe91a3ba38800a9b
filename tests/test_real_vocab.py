"""Real shapes and the real vocabulary. data/tiny_model.py's SHAPES are the real architectures (parameter counts
against the published ones, without allocating them); a model of Qwen2.5's vocabulary, V = 151936, with a small
hidden size runs SFT, RL (CoPRIS partial rollout and its buffered old log-probs, PRIME's PRM and reference, a KL
reference, a mismatch correction and its metrics, evaluation, export) and evaluation of the export under
tests/vocab_guard.py, which records every op output of more than ROWS rows of V: nothing outside the fused head's
chunks (55 tokens at this V: vocab_guard.py's size) and the engine's running batch (engine.max_num_seqs 16 here) may build
(tokens x V). Every job below has hundreds of tokens per forward. The guard is shown to fire on a planted head that
builds the full logits."""
import json
import sys

import pytest
from transformers import Qwen2Config

from conftest import tiny_variant
from data.tiny_model import SHAPES, parameter_count, shape_config
from helpers import run

ROWS = 64  # > the fused head's chunk at V=151936 under the guard (vocab_guard.GUARD_CHUNK_LOGITS: 55), >= max_num_seqs
REAL_VOCAB = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                  intermediate_size=128, vocab_size=151936, tie_word_embeddings=True)


def qwen2_parameters(V, H, layers, heads, kv, inter, tied) -> int:
    """Qwen2's parameter count by hand: embedding (+ head if untied), per layer q/k/v with biases, o, the gated MLP,
    two RMSNorms, and the final norm."""
    d = H // heads
    layer = H * H + H + 2 * (H * kv * d + kv * d) + H * H + 3 * H * inter + 2 * H
    return V * H * (1 if tied else 2) + layers * layer + H


def test_shapes_are_the_real_architectures():
    """Counted on the meta device: Qwen2.5-0.5B 494,032,768 and 1.5B 1,543,714,304 parameters (their model cards'
    0.49B and 1.54B), 7B 7,615,616,512 (V = 152064, untied)."""
    want = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512}
    for name, n in want.items():
        s = SHAPES[name]
        config = shape_config(name, vocab_size=400)  # a trained BPE of 400 tokens: the model keeps the real V
        assert config.vocab_size == s["vocab_size"] and config.tie_word_embeddings == s["tie_word_embeddings"]
        assert parameter_count(config) == n == qwen2_parameters(
            s["vocab_size"], s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"],
            s["num_key_value_heads"], s["intermediate_size"], s["tie_word_embeddings"]), name
    with pytest.raises(ValueError, match="model vocabulary 151936 < the tokenizer's 200000"):
        shape_config("qwen2.5-0.5b", vocab_size=200_000)


def test_demo_stand_in_is_unchanged():
    """make demo's model: the config the code before SHAPES wrote (same seed: the same weights)."""
    old = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=0, pad_token_id=0, bos_token_id=0, dtype="float32")
    assert shape_config("demo", 512).to_dict() == old.to_dict()


@pytest.fixture(scope="module")
def real_vocab(tiny, tmp_path_factory):
    """The tiny model's data with a one-layer model of hidden 64 and V = 151936 (tied; BPE of 400 tokens)."""
    return tiny_variant(tiny, tmp_path_factory.mktemp("real_vocab"), shape=REAL_VOCAB)


def guarded(tmp_path, *args, plant: str = "") -> dict:
    """Run tests/vocab_guard.py on a trainer job; -> its record (rc, the (tokens x V) outputs seen)."""
    out = tmp_path / "guard.json"
    p = run(["env", f"PLANT={plant}", sys.executable, "tests/vocab_guard.py", str(out), str(ROWS), *args], timeout=900)
    assert p.returncode == 0 and out.exists(), p.stdout[-2000:] + p.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["rc"] == 0 and rec["v"] == 151936 and rec["ops"] > 1000, (rec, p.stderr[-3000:])
    return rec


def sft_args(d, run_dir) -> list[str]:
    return ["--mode=sft", f"--model_path={d / 'model'}", f"--train_data={d / 'data' / 'sft.jsonl'}",
            f"--run_dir={run_dir}", "--steps=2", "--sft_epochs=0", "--sft_batch_rows=8", "--max_prompt_len=96",
            "--max_response_len=160", "--save_every=0"]


@pytest.mark.slow
def test_guard_sees_full_logits(real_vocab, tmp_path):
    """The planted head builds (N, V) logits at SFT's forwards (147 and 180 tokens): the guard records them."""
    rec = guarded(tmp_path, *sft_args(real_vocab, tmp_path / "sft"), plant="logits")
    assert any(shape[1] == 151936 and shape[0] > ROWS for _, shape, _ in rec["seen"]), rec


@pytest.mark.slow
def test_sft_and_rl_build_no_vocab_sized_rows(real_vocab, tmp_path):
    """SFT's loss, then from its export RL with everything that forwards the policy or reads log-probs: CoPRIS
    partial rollout (the buffer's old log-probs at step 2), PRIME (PRM and frozen reference), a KL reference, a
    token_truncate correction and the mismatch metrics, evaluation (greedy and sampled), export; then the export
    evaluated (--mode=eval)."""
    sft = guarded(tmp_path, *sft_args(real_vocab, tmp_path / "sft"))
    assert sft["seen"] == [], sft
    d = real_vocab / "data"
    rl = guarded(tmp_path, f"--model_path={tmp_path / 'sft' / 'export'}", f"--train_data={d / 'rl_train.jsonl'}",
                 f"--eval_data={d / 'eval.jsonl'}", f"--run_dir={tmp_path / 'rl'}", "--steps=2", "--batch_groups=2",
                 "--n_samples=4", "--copris.concurrency=12", "--engine.max_num_seqs=16", "--max_prompt_len=96",
                 "--max_response_len=80", "--eval_samples=2", "--eval_every=0", "--save_every=0",
                 "--prime.enabled=true", "--prime.filter_low=0", "--prime.filter_high=1",
                 "--correction.mode=token_truncate", "--kl_coef=0.01", "--lr=1e-3")
    assert rl["seen"] == [], rl
    steps = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert steps[1]["buffer_tokens"] > 0 and "prm_loss" in steps[2] and "mismatch/kl_k3" in steps[2], steps
    ev = guarded(tmp_path, "--mode=eval", f"--model_path={tmp_path / 'rl' / 'export'}",
                 f"--eval_data={d / 'eval.jsonl'}", f"--run_dir={tmp_path / 'eval'}", "--engine.max_num_seqs=16",
                 "--max_prompt_len=96", "--max_response_len=80", "--eval_samples=2")
    assert ev["seen"] == [], ev


PUSH_PEAK = r'''
import json, sys
from pathlib import Path
from safetensors.torch import load_file
from rollout.vllm_engine import EngineConfig, RolloutEngine, refresh_tied_head

def rss(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))

engine = RolloutEngine(EngineConfig(sys.argv[1], max_model_len=64), distributed=False)
engine.push_weights(iter(load_file(Path(sys.argv[1]) / "model.safetensors").items()))  # first: allocations settle
before = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
engine.llm.collective_rpc(refresh_tied_head)
print("RESULT " + json.dumps({"rise_gib": (rss("VmHWM") - before) / 2**30}))
'''


@pytest.mark.slow
def test_push_repacks_the_tied_head_in_place(tiny, tmp_path):
    """vLLM's CPU engine computes a tied head from a packed (V, H) copy of the embedding (0.51 GiB at V = 151936,
    H = 896); after a push, refresh_tied_head packs the pushed head anew. The old copy goes first: the refresh raises
    the process's peak by well under one copy (it raised it by one before)."""
    from helpers import result_of
    d = tiny_variant(tiny, tmp_path, shape=dict(REAL_VOCAB, hidden_size=896, num_attention_heads=14,
                                                num_key_value_heads=2, intermediate_size=1024))
    script = tmp_path / "push_peak.py"
    script.write_text(PUSH_PEAK)
    rise = result_of([str(script), str(d / "model")])["rise_gib"]
    print(f"the tied head's repack raised the peak RSS by {rise:.3f} GiB")
    assert rise < 0.2, f"the tied head's repack raised the peak RSS by {rise:.2f} GiB (one packed copy: 0.51)"

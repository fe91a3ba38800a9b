"""Build a model folder from nothing: a byte-level BPE tokenizer trained on a corpus and a
randomly initialised Qwen2-style causal LM. No hub access.

The tokenizer has exactly the architecture transformers' `Qwen2Tokenizer` rebuilds for a `qwen2`
folder (NFC, Qwen2's split regex, byte-level, BPE), so the trainer (`AutoTokenizer`) and vLLM
produce the same ids; a char-level vocab would silently lose spaces there.

    python -m data.tiny_model --corpus runs/demo/data/sft.jsonl --out runs/demo/model
    python -m data.tiny_model --corpus runs/demo/data/sft.jsonl --out runs/real/model --shape qwen2.5-0.5b

A named shape (SHAPES) is a real model's architecture with random weights: its config.json numbers, the
vocabulary V included. The trained BPE is smaller (vocab_size tokens); the embedding and head have the real V rows,
as Qwen's padded vocabulary does (151936 rows for 151665 tokens): ids past the tokenizer's decode to nothing.
"""
import argparse
import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM

EOS = "<|endoftext|>"
# Qwen2's pre-tokenizer regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX):
# single digits, words with an optional leading non-letter, punctuation runs, whitespace.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
               r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


# Real architectures (their config.json numbers); "demo" is make demo's stand-in. Weights are random.
SHAPES = {
    "demo": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=None, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}


def shape_config(shape: str | dict, vocab_size: int, max_len: int = 512) -> Qwen2Config:
    """The Qwen2Config of a named shape (SHAPES) or a dict of its keys; vocab_size None there: the tokenizer's
    (vocab_size). A model vocabulary smaller than the tokenizer's is an error."""
    arch = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    arch["vocab_size"] = arch["vocab_size"] or vocab_size
    if arch["vocab_size"] < vocab_size:
        raise ValueError(f"model vocabulary {arch['vocab_size']} < the tokenizer's {vocab_size}")
    return Qwen2Config(**arch, max_position_embeddings=max_len, rms_norm_eps=1e-6, eos_token_id=0, pad_token_id=0,
                       bos_token_id=0, dtype="float32")


def parameter_count(config: Qwen2Config) -> int:
    """Parameters of a Qwen2ForCausalLM of `config` (tied ones once), counted on the meta device: nothing allocated."""
    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())


TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # Qwen2.5's markers, one id each


def train_tokenizer(texts: list[str], vocab_size: int, tools: bool = False) -> Tokenizer:
    """Byte-level BPE with Qwen2's pre-tokenizer; id 0 is <|endoftext|> (eos and pad). tools: the tool-call markers
    become single special tokens (after the trained vocabulary), as in Qwen2.5's tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if tools:
        tok.add_special_tokens(TOOL_TOKENS)
    return tok


def build_model_folder(out: Path, texts: list[str], vocab_size: int = 512, hidden: int = 128,
                       layers: int = 4, heads: int = 2, max_len: int = 512, seed: int = 0, tools: bool = False,
                       tied: bool = False, shape: str | dict | None = None) -> None:
    """Write tokenizer files and a random-init Qwen2ForCausalLM as safetensors into `out`. shape: a name of SHAPES
    or a dict of their keys (hidden, layers, heads, tied ignored: the shape's), else make demo's stand-in of that
    hidden size, layers and heads (intermediate 4 * hidden, head_dim = hidden / heads = 64: vLLM's CPU attention
    needs 64 there). tools: with the tool-call tokens (train_tokenizer); tied: lm_head shares the embedding
    (tie_word_embeddings, as Qwen2.5-0.5B..3B and Llama-3.2-1B/3B do)."""
    if shape is None and hidden // heads != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU attention, got {hidden}/{heads}")
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, vocab_size, tools)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": EOS, "pad_token": EOS, "bos_token": None,
        "unk_token": None, "model_max_length": max_len, "add_prefix_space": False}, indent=1))
    arch = shape or dict(SHAPES["demo"], hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=4 * hidden, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(shape_config(arch, tok.get_vocab_size(), max_len)).save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)  # vLLM would take its defaults over ours


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="jsonl; prompt + completion/solution texts")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tools", action="store_true", help="add the tool-call tokens (multi-turn episodes)")
    ap.add_argument("--tied", action="store_true", help="tie lm_head to the embedding (tie_word_embeddings)")
    ap.add_argument("--shape", choices=sorted(set(SHAPES) - {"demo"}),
                    help="a real architecture (random weights, the real vocabulary); --hidden/--layers/--tied unused")
    ap.add_argument("--max-len", type=int, default=512, help="max_position_embeddings and model_max_length")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.corpus)]
    corpus = [r["prompt"] + (c if isinstance(c, str) else "".join(t["content"] for t in c))
              for r in rows for c in [r.get("completion", r.get("solution", ""))]]
    build_model_folder(a.out, corpus, a.vocab_size, a.hidden, a.layers, max_len=a.max_len, tools=a.tools,
                       tied=a.tied, shape=a.shape)

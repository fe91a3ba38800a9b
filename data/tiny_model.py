"""Build a model folder from nothing: a byte-level BPE tokenizer trained on a corpus and a
randomly initialised Qwen2-style causal LM. No hub access.

The tokenizer has exactly the architecture transformers' `Qwen2Tokenizer` rebuilds for a `qwen2`
folder (NFC, Qwen2's split regex, byte-level, BPE), so the trainer (`AutoTokenizer`) and vLLM
produce the same ids; a char-level vocab would silently lose spaces there.

    python -m data.tiny_model --corpus runs/demo/data/sft.jsonl --out runs/demo/model
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
                       tied: bool = False) -> None:
    """Write tokenizer files and a random-init Qwen2ForCausalLM (head_dim = hidden / heads = 64:
    vLLM's CPU attention needs 64) as safetensors into `out`. tools: with the tool-call tokens (train_tokenizer);
    tied: lm_head shares the embedding (tie_word_embeddings, as Qwen2.5-0.5B..3B and Llama-3.2-1B/3B do)."""
    if hidden // heads != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU attention, got {hidden}/{heads}")
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, vocab_size, tools)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": EOS, "pad_token": EOS, "bos_token": None,
        "unk_token": None, "model_max_length": max_len, "add_prefix_space": False}, indent=1))
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_len, tie_word_embeddings=tied, eos_token_id=0, pad_token_id=0,
        bos_token_id=0, dtype="float32")
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(out)
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
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.corpus)]
    corpus = [r["prompt"] + (c if isinstance(c, str) else "".join(t["content"] for t in c))
              for r in rows for c in [r.get("completion", r.get("solution", ""))]]
    build_model_folder(a.out, corpus, a.vocab_size, a.hidden, a.layers, tools=a.tools, tied=a.tied)

"""Causal attention over packed sequences: rows concatenated into one (1, S) sequence with no padding, each row
attending only to its own earlier tokens. The trainer's forwards (old log-probs, reference, PRM, update, SFT) run
this way, so their compute is exactly the real tokens. Rows with the same prompt (the n samples of a GRPO group)
may share one copy of it: a segment [prompt, response_1, ..., response_K], response i at positions P..P+L_i-1,
attending to the prompt and to its own earlier tokens, as if it were the row [prompt, response_i] alone.

    kw = packed_kwargs(segments, device)                # segments: (P, [L_1, ..., L_K]) in layout order
    model(input_ids=ids (1, S), position_ids=pos (1, S), **kw)
    kw = packed_kwargs(segments, device, varlen=True)   # flash-attn: every K = 1; cu_seq_lens_q/k (n+1,) int32

`attention_mask={"full_attention": None, ...}` tells transformers not to build a (S, S) mask; the other kwargs
travel down to the attention function. attn_implementation=PACKED ("packed_sdpa", registered here) reads
`packed_rows` and runs torch sdpa with is_causal per bucket of rows of similar length: each row gathered from the
sequence (its segment's prompt, then its response), right-padded (causal attention never sees the padding), and
its outputs written back, a shared prompt's by the segment's first row only. With flash-attn on CUDA
(attn_implementation="flash_attention_2", varlen=True) cu_seq_lens select its varlen kernel, which knows only
contiguous rows: there no prompt is shared. Called without packed_rows (a padded batch, or generate) packed_sdpa is
transformers' own sdpa.
"""
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED = "packed_sdpa"
NO_MASK = {"full_attention": None, "sliding_attention": None}


def packed_kwargs(segments: list[tuple[int, list[int]]], device, varlen: bool = False) -> dict:
    """Model kwargs for segments (P prompt tokens, then responses of lengths L_1..L_K) laid back to back."""
    if varlen:
        if any(len(ls) != 1 for _, ls in segments):
            raise ValueError("flash-attn varlen rows are contiguous: a shared prompt needs packed_sdpa")
        lengths = [p + ls[0] for p, ls in segments]
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lengths).cumsum(0)
        cu, L = cu.to(device), max(lengths)
        return dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=L, max_length_k=L, attention_mask=NO_MASK)
    rows, at = [], 0  # per attention row: (its positions in the sequence, how many leading ones it does not write)
    for P, lens in segments:
        prompt, at = torch.arange(at, at + P), at + P
        for k, L in enumerate(lens):
            rows.append((torch.cat([prompt, torch.arange(at, at + L)]), P if k else 0))
            at += L
    return dict(packed_rows=row_buckets(rows, device), attention_mask=NO_MASK)


UNSUPPORTED = ("softcap", "s_aux")  # attention-logit soft-capping (Gemma 2), attention sinks (gpt-oss)


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, packed_rows=None,
                sliding_window=None, **kwargs):
    """query (1, h, S, d), key/value (1, h_kv, S, d) -> (1, S, h, d): causal sdpa within each packed row (h_kv < h:
    grouped-query attention, each K/V head read by h / h_kv query heads without copying it); with
    sliding_window W (the layer's, as the model passes it) query i sees keys j with 0 <= i - j < W, as HF's own
    attention, flash-attn and vLLM do."""
    if packed_rows is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    bad = [k for k in UNSUPPORTED if kwargs.get(k) is not None]
    if bad:
        raise ValueError(f"packed attention does not implement {bad}: the trainer would train a different model")
    gqa = key.shape[1] != query.shape[1]  # grouped-query attention: sdpa shares each K/V head, no copies
    out = None  # (1, h, S, d) in sdpa's output dtype (autocast's where it is on: an unsharded model's bf16 compute)
    for idx, src, dst in packed_rows:  # gathers and copies by index_select / index_copy_: their backward is cheap on CPU
        q, k, v = (x[0].index_select(1, idx.flatten()).unflatten(1, idx.shape).transpose(0, 1)
                   for x in (query, key, value))  # (r, h, n, d)
        n = idx.shape[1]
        i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
        window = None if sliding_window is None else (j <= i) & (i - j < sliding_window)  # (n, n) keys each query sees
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=window, is_causal=window is None,
                                                             scale=scaling, dropout_p=dropout if module.training else 0.0,
                                                             enable_gqa=gqa)
        out = torch.empty_like(query, dtype=o.dtype) if out is None else out
        out[0].index_copy_(1, dst, o.transpose(0, 1).flatten(1, 2).index_select(1, src))  # (h, m, d) written
    return out.transpose(1, 2), None


BUCKET_FILL = 0.5  # rows share one sdpa call when the shortest is at least this share of the longest (padding costs
# attention only). CPU, the demo job at 1 process (benchmarks/bench_step.py, 64 rows, p50 22 tokens), measured before
# rows shared their prompt: update 0.338 s with one call per distinct length, 0.369 s at 0.8, 0.309 s at 0.5 (single
# runs, +-10% run to run). With shared prompts, 0.7 looked about 5% faster than 0.5: within the spread, so not changed


def row_buckets(rows: list[tuple[torch.Tensor, int]], device) -> list[tuple[torch.Tensor, ...]]:
    """Attention rows (positions (n_i,) in the sequence, count of leading positions written by another row) grouped
    longest first into buckets whose rows are >= BUCKET_FILL of the longest. -> per bucket (idx (r, n) positions,
    each row padded to n by repeating its last one; src (m,) the entries of idx.flatten() whose output is written,
    i.e. neither padding nor a skipped lead; dst (m,) = idx.flatten()[src], the positions written). Right padding
    under a causal mask changes no real output."""
    rows = sorted(rows, key=lambda r: -len(r[0]))
    out, i = [], 0
    while i < len(rows):
        n = len(rows[i][0])
        j = i
        while j < len(rows) and len(rows[j][0]) >= BUCKET_FILL * n:
            j += 1
        idx = torch.stack([torch.cat([p, p[-1:].expand(n - len(p))]) for p, _ in rows[i:j]])  # (r, n)
        cols = torch.arange(n)
        write = torch.stack([(cols >= skip) & (cols < len(p)) for p, skip in rows[i:j]])  # (r, n)
        src = write.flatten().nonzero()[:, 0]  # (m,)
        out.append((idx.to(device), src.to(device), idx.flatten()[src].to(device)))
        i = j
    return out


AttentionInterface.register(PACKED, packed_sdpa)
AttentionMaskInterface.register(PACKED, sdpa_mask)

"""Causal attention over packed sequences: rows concatenated into one (1, S) sequence with no padding, each row
attending only to its own earlier tokens. The trainer's forwards (old log-probs, reference, PRM, update, SFT) run
this way, so their compute is exactly the real tokens.

    kw = packed_kwargs(lengths, device)            # cu_seq_lens_q/k (n+1,) int32, max_length_q/k, attention_mask
    model(input_ids=ids (1, S), position_ids=pos (1, S) restarting at 0 per row, **kw)

`attention_mask={"full_attention": None, ...}` tells transformers not to build a (S, S) mask; the cu_seq_lens_*
kwargs travel down to the attention function. With flash-attn on CUDA (attn_implementation="flash_attention_2")
they select its varlen kernel; elsewhere attn_implementation=PACKED ("packed_sdpa", registered here) runs torch
sdpa with is_causal per bucket of rows of similar length (right-padded: causal attention never
sees the padding). Called without cu_seq_lens (a padded batch, or
generate) it is transformers' own sdpa.
"""
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED = "packed_sdpa"


def packed_kwargs(lengths: list[int], device) -> dict:
    """Model kwargs for rows of these lengths packed back to back."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    cu, L = cu.to(device), max(lengths)
    return dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=L, max_length_k=L,
                attention_mask={"full_attention": None, "sliding_attention": None})


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, cu_seq_lens_q=None, **kwargs):
    """query (1, h, S, d), key/value (1, h_kv, S, d) -> (1, S, h, d): causal sdpa within each packed row."""
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # (1, h, S, d)
    out = torch.empty_like(query)  # (1, h, S, d)
    for idx, real in row_buckets(cu_seq_lens_q.tolist(), query.device):
        q, k, v = (x[0][:, idx].transpose(0, 1) for x in (query, key, value))  # (r, h, n, d)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                                             dropout_p=dropout if module.training else 0.0)
        out[0][:, idx[real]] = o.transpose(0, 1)[:, real]  # padded positions (causal: never attended) dropped
    return out.transpose(1, 2), None


BUCKET_FILL = 0.5  # rows share one sdpa call when the shortest is at least this share of the longest (padding costs
# attention only). CPU, the demo job at 1 process (benchmarks/bench_step.py, 64 rows, p50 22 tokens): update 0.338 s
# with one call per distinct length, 0.369 s at 0.8, 0.309 s at 0.5 (single runs, +-10% run to run)


def row_buckets(bounds: list[int], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows [bounds[i], bounds[i+1]) grouped longest first into buckets whose rows are >= BUCKET_FILL of the longest.
    -> per bucket (idx (r, n) token positions, each row padded to n by repeating its last position; real (r, n)
    bool, False at the padding). Right padding under a causal mask changes no real position's output."""
    rows = sorted(zip(bounds[:-1], bounds[1:]), key=lambda r: r[0] - r[1])
    out, i = [], 0
    while i < len(rows):
        n = rows[i][1] - rows[i][0]
        j = i
        while j < len(rows) and rows[j][1] - rows[j][0] >= BUCKET_FILL * n:
            j += 1
        start = torch.tensor([a for a, _ in rows[i:j]])[:, None]  # (r, 1)
        end = torch.tensor([b for _, b in rows[i:j]])[:, None]
        pos = start + torch.arange(n)  # (r, n)
        out.append((torch.minimum(pos, end - 1).to(device), (pos < end).to(device)))
        i = j
    return out


AttentionInterface.register(PACKED, packed_sdpa)
AttentionMaskInterface.register(PACKED, sdpa_mask)

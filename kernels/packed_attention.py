"""Causal attention over packed sequences: rows concatenated into one (1, S) sequence with no padding, each row
attending only to its own earlier tokens. The trainer's forwards (old log-probs, reference, PRM, update, SFT) run
this way, so their compute is exactly the real tokens.

    kw = packed_kwargs(lengths, device)            # cu_seq_lens_q/k (n+1,) int32, max_length_q/k, attention_mask
    model(input_ids=ids (1, S), position_ids=pos (1, S) restarting at 0 per row, **kw)

`attention_mask={"full_attention": None, ...}` tells transformers not to build a (S, S) mask; the cu_seq_lens_*
kwargs travel down to the attention function. With flash-attn on CUDA (attn_implementation="flash_attention_2")
they select its varlen kernel; elsewhere attn_implementation=PACKED ("packed_sdpa", registered here) runs torch
sdpa with is_causal per row (rows of equal length in one call). Called without cu_seq_lens (a padded batch, or
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
    bounds = cu_seq_lens_q.tolist()
    by_len: dict[int, list[int]] = {}
    for start, end in zip(bounds[:-1], bounds[1:]):
        by_len.setdefault(end - start, []).append(start)
    out = torch.empty_like(query)  # (1, h, S, d)
    for n, starts in by_len.items():
        idx = (torch.tensor(starts)[:, None] + torch.arange(n)).to(query.device)  # (r, n) token positions
        q, k, v = (x[0][:, idx].transpose(0, 1) for x in (query, key, value))  # (r, h, n, d)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                                             dropout_p=dropout if module.training else 0.0)
        out[0][:, idx] = o.transpose(0, 1)
    return out.transpose(1, 2), None


AttentionInterface.register(PACKED, packed_sdpa)
AttentionMaskInterface.register(PACKED, sdpa_mask)

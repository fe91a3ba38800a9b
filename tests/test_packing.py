"""model.packed_forward's layout and model.micro_batches, with a fake model that records its inputs (milliseconds).

Row boundaries matter beyond the logits: a RoPE model gives the same scores for any constant position shift per
row, so the real-model comparison in test_trainer_phases cannot see positions that fail to restart; an
absolute-position model or a flash-attention path that infers rows from position_ids would.
"""
from types import SimpleNamespace

import pytest
import torch

import model as M
from kernels import packed_attention


class Recorder(torch.nn.Module):
    """Stands in for a causal LM: keeps the kwargs of its forward, calls the head's fn on fake hidden states."""

    def __init__(self):
        super().__init__()
        self.head = SimpleNamespace(fn=None)
        self.seen = None

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, logits_to_keep, **kw):
        self.seen = dict(input_ids=input_ids, logits_to_keep=logits_to_keep, **kw)
        h = input_ids[0, logits_to_keep].double()[:, None]  # (N, 1): the kept positions' input tokens
        return SimpleNamespace(logits=self.head.fn(h, torch.ones(1, 1, dtype=torch.float64)))


def test_packed_forward_lays_rows_back_to_back():
    rows = [M.Row([1, 2, 3], [4, 5]), M.Row([6], [7, 8, 9]), M.Row([10, 11], [12])]
    m = Recorder()
    out = M.packed_forward(m, rows, torch.device("cpu"), lambda h, w: h @ w.T)
    s = m.seen
    assert s["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
    assert s["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]], "positions restart per row"
    # position t predicts token t+1: the last prompt token up to the second-to-last response token of each row
    assert s["logits_to_keep"].tolist() == [2, 3, 5, 6, 7, 10]
    assert out[:, 0].tolist() == [3, 4, 6, 7, 8, 11]
    assert s["cu_seq_lens_q"].tolist() == s["cu_seq_lens_k"].tolist() == [0, 5, 9, 12]
    assert s["max_length_q"] == s["max_length_k"] == 5
    assert m.head.fn is None, "the head's fn must be cleared after the forward"


def test_packed_forward_clears_the_head_on_error():
    m = Recorder()
    with pytest.raises(ZeroDivisionError):
        M.packed_forward(m, [M.Row([1], [2])], torch.device("cpu"), lambda h, w: 1 / 0)
    assert m.head.fn is None


@pytest.fixture
def one_rank(monkeypatch):
    monkeypatch.setattr(M.dist, "all_reduce", lambda t, op=None: None)  # world size 1: the max is this rank's


@pytest.mark.parametrize("lengths,budget", [([5, 3, 9, 1, 4], 9), ([2] * 7, 5), ([12, 1], 4), ([3], 100)])
def test_micro_batches_cover_every_row_once_within_budget(one_rank, lengths, budget):
    rows = [M.Row([0] * (n - 1), [1]) for n in lengths]
    batches = M.micro_batches(rows, budget, torch.device("cpu"))
    assert sorted(i for b in batches for i in b) == list(range(len(rows)))
    for b in batches:  # a row longer than the budget goes alone
        assert len(b) == 1 or sum(lengths[i] for i in b) <= budget, (b, lengths)


def test_micro_batches_pad_to_the_longest_rank(monkeypatch):
    def all_reduce(t, op=None):
        t.fill_(4)  # another rank has 4 micro-batches
    monkeypatch.setattr(M.dist, "all_reduce", all_reduce)
    batches = M.micro_batches([M.Row([0], [1]) for _ in range(3)], 4, torch.device("cpu"))
    assert batches == [[0, 1], [2], [], []]


@pytest.mark.parametrize("lengths,fill", [([10, 7, 6, 3, 1], 0.5), ([5, 5, 2], 0.3), ([4], 0.5), ([9, 8], 1.0)])
def test_packed_sdpa_matches_each_row_alone(monkeypatch, lengths, fill):
    """Every position, the last of each row included (the trainer never reads a row's last output: it predicts
    nothing, so only this test sees a bucket's padding written over it). fp64, grouped-query heads."""
    monkeypatch.setattr(packed_attention, "BUCKET_FILL", fill)
    g = torch.Generator().manual_seed(0)
    S, h, h_kv, d = sum(lengths), 4, 2, 8
    q = torch.randn(1, h, S, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, h_kv, S, d, generator=g, dtype=torch.float64) for _ in range(2))
    module = SimpleNamespace(num_key_value_groups=h // h_kv, training=False)
    kw = packed_attention.packed_kwargs(lengths, torch.device("cpu"))
    out, _ = packed_attention.packed_sdpa(module, q, k, v, None, cu_seq_lens_q=kw["cu_seq_lens_q"])  # (1, S, h, d)
    at = 0
    for n in lengths:
        sl = slice(at, at + n)
        want = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, sl], k[:, :, sl].repeat_interleave(2, 1), v[:, :, sl].repeat_interleave(2, 1), is_causal=True)
        assert torch.allclose(out[0, sl], want[0].transpose(0, 1), atol=1e-12), f"row of {n} tokens at {at}"
        at += n

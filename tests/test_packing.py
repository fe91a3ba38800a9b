"""model.packed_forward's layout (shared prompts included), model.micro_batches and the packed attention, with a fake
model that records its inputs (milliseconds).

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
    assert attention_rows(s["packed_rows"]) == [([0, 1, 2, 3, 4], 0), ([5, 6, 7, 8], 0), ([9, 10, 11], 0)]
    assert m.head.fn is None, "the head's fn must be cleared after the forward"


def test_packed_forward_shares_a_prompt():
    """Rows with the same prompt: one copy of it, each response at positions P.. after it and predicted from its last
    position; rows keep their order in what fn sees."""
    rows = [M.Row([1, 2, 3], [4, 5]), M.Row([6], [7, 8, 9]), M.Row([1, 2, 3], [10]), M.Row([1, 2, 3], [11, 12, 13])]
    m = Recorder()
    out = M.packed_forward(m, rows, torch.device("cpu"), lambda h, w: h @ w.T)
    s = m.seen
    assert s["input_ids"].tolist() == [[1, 2, 3, 4, 5, 10, 11, 12, 13, 6, 7, 8, 9]]
    assert s["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1, 2, 3]]
    assert s["logits_to_keep"].tolist() == [2, 3, 9, 10, 11, 2, 2, 6, 7]
    assert out[:, 0].tolist() == [3, 4, 6, 7, 8, 3, 3, 11, 12]
    # each response attends to the prompt and itself; the prompt's outputs are written by its first row only
    assert attention_rows(s["packed_rows"]) == [([0, 1, 2, 6, 7, 8], 3), ([0, 1, 2, 3, 4], 0), ([0, 1, 2, 5], 3),
                                                ([9, 10, 11, 12], 0)]


def test_packed_forward_varlen_rows_are_contiguous(monkeypatch):
    """flash-attn's varlen path (CUDA): cu_seq_lens per row, no prompt shared."""
    monkeypatch.setattr(M, "attention_for", lambda device: "flash_attention_2")
    rows = [M.Row([1, 2], [3]), M.Row([6], [7, 8, 9]), M.Row([1, 2], [4, 5])]
    m = Recorder()
    M.packed_forward(m, rows, torch.device("cpu"), lambda h, w: h @ w.T)
    s = m.seen
    assert s["input_ids"].tolist() == [[1, 2, 3, 6, 7, 8, 9, 1, 2, 4, 5]]
    assert s["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3]]
    assert s["cu_seq_lens_q"].tolist() == s["cu_seq_lens_k"].tolist() == [0, 3, 7, 11]
    assert s["max_length_q"] == s["max_length_k"] == 4
    assert "packed_rows" not in s


def attention_rows(buckets) -> list[tuple[list[int], int]]:
    """packed_rows -> per attention row (its real positions, its first written column), longest first."""
    out = []
    for idx, src, dst in buckets:
        r, n = idx.shape
        written = torch.zeros(r * n, dtype=torch.bool)
        written[src] = True
        assert idx.flatten()[src].tolist() == dst.tolist()
        for i, w in zip(idx.tolist(), written.view(r, n).tolist()):
            real = w.index(True) + w.count(True)  # written columns are a run ending at the row's real length
            out.append((i[:real], w.index(True)))
    return out


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
    rows = [M.Row([i] * (n - 1), [1]) for i, n in enumerate(lengths)]  # distinct prompts
    batches = M.micro_batches(rows, budget, torch.device("cpu"))
    assert sorted(i for b in batches for i in b) == list(range(len(rows)))
    for b in batches:  # a row longer than the budget goes alone
        assert len(b) == 1 or sum(lengths[i] for i in b) <= budget, (b, lengths)


def test_micro_batches_pad_to_the_longest_rank(monkeypatch):
    def all_reduce(t, op=None):
        t.fill_(4)  # another rank has 4 micro-batches
    monkeypatch.setattr(M.dist, "all_reduce", all_reduce)
    batches = M.micro_batches([M.Row([i], [1]) for i in range(3)], 4, torch.device("cpu"))  # distinct prompts
    assert batches == [[0, 1], [2], [], []]


@pytest.mark.parametrize("budget", [100, 14, 9, 5])
def test_micro_batches_keep_a_prompt_group_together(one_rank, budget):
    """Computed tokens count a shared prompt once; a group splits only where it exceeds the budget."""
    rows = [M.Row([7, 7, 7], [1] * n) for n in (4, 2, 5)] + [M.Row([8], [1] * 6), M.Row([7, 7, 7], [1])]
    batches = M.micro_batches(rows, budget, torch.device("cpu"))
    assert sorted(i for b in batches for i in b) == list(range(len(rows)))
    for b in batches:
        computed = sum(len(rows[i].prompt_ids) for i in {rows[i].prompt_ids[0]: i for i in b}.values()) \
            + sum(len(rows[i].response) for i in b)
        assert computed <= budget or len(b) == 1, (b, computed)
    if budget >= 15:  # the group of prompt 7 is 3 + 12 tokens: one piece
        assert any({0, 1, 2, 4} <= set(b) for b in batches), batches
    assert len(batches) == {100: 1, 14: 2, 9: 3, 5: 5}[budget], batches


@pytest.mark.parametrize("segments,fill", [([(3, [7]), (2, [5]), (6, [0]), (1, [2]), (1, [0])], 0.5),
                                            ([(4, [3, 1, 6]), (2, [5]), (3, [1, 1])], 0.5), ([(2, [3, 3])], 0.3),
                                            ([(4, [0])], 0.5), ([(5, [4]), (3, [2, 6])], 1.0)])
def test_packed_sdpa_matches_each_row_alone(monkeypatch, segments, fill):
    """Every position, the last of each row included (the trainer never reads a row's last output: it predicts
    nothing, so only this test sees a bucket's padding written over it), and a shared prompt's: each row as
    [prompt, response] alone. fp64, grouped-query heads."""
    monkeypatch.setattr(packed_attention, "BUCKET_FILL", fill)
    g = torch.Generator().manual_seed(0)
    S, h, h_kv, d = sum(p + sum(ls) for p, ls in segments), 4, 2, 8
    q = torch.randn(1, h, S, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, h_kv, S, d, generator=g, dtype=torch.float64) for _ in range(2))
    module = SimpleNamespace(num_key_value_groups=h // h_kv, training=False)
    kw = packed_attention.packed_kwargs(segments, torch.device("cpu"))
    out, _ = packed_attention.packed_sdpa(module, q, k, v, None, packed_rows=kw["packed_rows"])  # (1, S, h, d)
    at = 0
    for P, lens in segments:
        prompt, at = list(range(at, at + P)), at + P
        for L in lens:
            row = prompt + list(range(at, at + L))
            at += L
            want = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, row], k[:, :, row].repeat_interleave(2, 1), v[:, :, row].repeat_interleave(2, 1), is_causal=True)
            assert torch.allclose(out[0, row], want[0].transpose(0, 1), atol=1e-12), f"row {row}"


def windowed_model(**extra):
    """A random 2-layer Qwen2 whose second layer attends through a sliding window of 4 (max_window_layers=1)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
                      max_window_layers=1, max_position_embeddings=64, **extra)
    assert cfg.layer_types == ["full_attention", "sliding_attention"]
    return Qwen2ForCausalLM(cfg).eval()


def test_packed_attention_honours_sliding_windows():
    """The packed path (shared prompt included) against HF's own eager attention, row by row, on a model with a
    windowed layer: the log-probs of a 30-token row are off by ~0.1 when the window is dropped."""
    m = windowed_model()
    g = torch.Generator().manual_seed(1)
    rows = [M.Row(torch.randint(1, 50, (6,), generator=g).tolist(), torch.randint(1, 50, (n,), generator=g).tolist())
            for n in (24, 3, 9)]
    rows.append(M.Row(rows[0].prompt_ids, torch.randint(1, 50, (12,), generator=g).tolist()))  # shares row 0's prompt
    want = []
    with torch.no_grad():
        m.set_attn_implementation("eager")
        for r in rows:
            logits = m(torch.tensor([r.prompt_ids + r.response])).logits[0, len(r.prompt_ids) - 1:-1]  # (T, V)
            want.append(logits.log_softmax(-1).gather(1, torch.tensor(r.response)[:, None])[:, 0])
        m.set_attn_implementation(packed_attention.PACKED)
        m.lm_head = M.Head(m.lm_head)
        tgt = M.targets_of(rows, torch.device("cpu"))
        logp = M.packed_forward(m, rows, torch.device("cpu"),
                                lambda h, w: (h @ w.T).log_softmax(-1).gather(1, tgt[:, None])[:, 0])
    for i, (got, w) in enumerate(zip(M.split_rows(logp, rows), want)):
        assert torch.allclose(got, w, atol=1e-5), f"row {i}: max diff {float((got - w).abs().max())}"


def test_attention_the_packed_path_cannot_reproduce_is_refused():
    from config import ConfigError
    with pytest.raises(ConfigError, match="attn_logit_softcapping"):
        M.check_attention("m", SimpleNamespace(attn_logit_softcapping=50.0))
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="s_aux"):
        packed_attention.packed_sdpa(torch.nn.Module(), q, q, q, None, packed_rows=[], s_aux=torch.zeros(2))

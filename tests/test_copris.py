"""CoPRIS partial rollout on the real CPU engine (tests/copris_worker.py in a subprocess): only what
needs vLLM. The scheduler's logic is covered against a fake engine in tests/test_copris_unit.py."""
import pytest

from data.rows import PromptSource
from helpers import result_of


@pytest.fixture(scope="module")
def result(tiny):
    return result_of(["tests/copris_worker.py", str(tiny / "model")])


def test_engine_holds_exactly_P_requests_at_every_step(result):
    bad = [(i, c) for i, c in enumerate(result["in_flight"]) if c != result["P"]]
    assert not bad, f"{len(bad)} steps where vLLM's unfinished count is not P={result['P']}; (step, count): {bad[:10]}"


def test_groups_stop_at_their_forced_lengths_and_the_rest_is_aborted(result):
    assert result["aborted"][0] > 0, f"aborted per stage {result['aborted']}: stage 1 left nothing in the buffer"
    assert [g["stage"] for g in result["groups"]] == [1, 1, 2, 2], f"stages of the returned groups {result['groups']}"
    for g in result["groups"]:
        assert [s["sample"] for s in g["samples"]] == [0, 1, 2, 3], f"group {g['prompt_id']}: samples {g['samples']}"
        for s in g["samples"]:
            assert (s["prompt_id"], s["len"], s["finish_reason"]) == (g["prompt_id"], s["forced"], "length"), \
                f"stage {g['stage']} group {g['prompt_id']} sample {s['sample']}: {s}, expected {s['forced']} tokens"


def test_tokens_across_an_abort_have_the_logprobs_of_the_weights_that_sampled_them(result):
    assert result["resumed"], "no trajectory was sampled in both stages: the test checks nothing"
    for r in result["resumed"]:
        where = f"group {r['prompt_id']} sample {r['sample']}"
        assert r["tokens"] == sum(r["segments"], []), \
            f"{where}: tokens {r['tokens']}, streamed segments {r['segments']}"
        assert len(r["logprobs"]) == len(r["versions"]) == len(r["tokens"]), f"{where}: lengths differ {r}"
        for k, (lp, v) in enumerate(zip(r["logprobs"], r["versions"])):
            assert abs(lp - r["ref"][v][k]) < 1e-4, \
                f"{where} token {k} (version {v}): engine log-prob {lp}, HF under version {v}: {r['ref'][v][k]}"
    # the versions differ enough that a token credited to the wrong stage would fail above
    gap = max(abs(a - b) for r in result["resumed"] for a, b in zip(*r["ref"]))
    assert gap > 1e-2, f"the weight push changed log-probs by at most {gap}"


def test_ranks_draw_disjoint_prompts():
    rows = [{"prompt_ids": [i]} for i in range(10)]
    a, b = PromptSource(rows, 0, 0, 2), PromptSource(rows, 0, 1, 2)
    da, db = [a.draw()[0] for _ in range(5)], [b.draw()[0] for _ in range(5)]
    assert not set(da) & set(db) and len(set(da + db)) == 10, f"rank 0 drew {da}, rank 1 drew {db}"
    nxt = [a.draw()[0] for _ in range(5)]
    assert [p // 10 for p in nxt] == [1] * 5, f"next epoch drew {nxt}: ids must be epoch * 10 + row"

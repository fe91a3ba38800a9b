"""PRIME's online PRM on a real FSDP2 model (tests/prime_worker.py in a subprocess). The 2-rank PRIME run in
the RL loop is in tests/test_learning.py."""
from helpers import result_of


def test_prm_update_lowers_bce_and_update_modes(tiny):
    out = result_of(["tests/prime_worker.py", str(tiny / "model")])
    after = out["after"]
    assert all(x == 0.0 for r in after[0]["used"] for x in r), "the PRM starts equal to the reference: rewards 0"
    for k, s in enumerate(after):  # update=after: the rewards used come from the PRM before its step
        for i, (u, pre) in enumerate(zip(s["used"], s["pre_update"])):
            assert max(abs(a - b) for a, b in zip(u, pre)) < 1e-5, f"step {k} row {i}: {u} vs pre-update {pre}"
    losses = [s["loss"] for s in after]
    assert losses[0] > 0.69 and losses[-1] < losses[0] - 0.05, losses  # BCE falls on a fixed batch
    assert after[-1]["acc"] >= 0.75
    b = out["before"]  # update=before: the rewards used equal a fresh forward of the updated PRM...
    for i, (u, f) in enumerate(zip(b["used"], b["fresh"])):
        assert max(abs(x - y) for x, y in zip(u, f)) < 1e-5, f"row {i}: used {u} vs fresh {f}"
    moved = max(abs(x - y) for u, pre in zip(b["used"], after[-1]["used"]) for x, y in zip(u, pre))
    assert moved > 1e-3, "...and differ from the previous step's rewards"
    assert [len(a) for a in out["adv"]] == out["lengths"]
    assert {"prm_loss", "prm_acc", "prm_grad_norm", "process_reward_mean", "process_reward_std"} <= set(out["stats_keys"])

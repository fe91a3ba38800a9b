"""ppo_epochs (TRL's num_iterations, verl's ppo_epochs) through the trainer's own wiring (tests/fake_rl.py): several
passes over each RL batch, each split into mini_batches optimizer steps. Every micro-batch the update runs is
recorded with the policy's weights at that moment; its loss must equal the float64 formulas evaluated with those
weights, each token's old log-prob (the ratio's denominator) being the log-prob under the policy of the CoPRIS stage
that sampled it, in every pass (trajectories carried across steps included). Only the first mini-batch of the first
pass takes the current version's tokens on-policy; every pass trains every row once, later passes in a shuffled
order. Resuming after several passes per step is bit-identical: test_wiring.py's RESUMES run `rl-epochs`."""
import collections

import pytest
import torch

import model
import trainer
from fake_rl import hf_logits, hf_model, run_args, train
from test_wiring import stage_logprobs

# run -> its keys: old log-probs computed upfront (two mini-batches), from the first pass's own forward (one
# mini-batch), the engine's; GSPO with its paper's defaults; CISPO (no lower bound)
EPOCHS = {"upfront": ("--ppo_epochs=3", "--mini_batches=2"), "update": ("--ppo_epochs=3",),
          "rollout": ("--ppo_epochs=2", "--mini_batches=2", "--copris.old_logprob_source=rollout"),
          "gspo": ("--objective=gspo", "--ppo_epochs=2", "--mini_batches=2"),
          "cispo": ("--objective=cispo", "--ppo_epochs=2", "--mini_batches=2", "--clip_high=0.1")}


def record(monkeypatch) -> list:
    """Patch the update's packed forward, loss head and optimizer step: -> a list that fills with one dict per
    micro-batch: its rows, the optimizer steps taken before it (`k`), the policy's weights, the head's inputs and
    the loss and logp it returned."""
    calls, steps, heads = [], [0], []
    real_forward, real_head, real_step = trainer.packed_forward, trainer.ppo_head, trainer.optimizer_step

    def ppo_head(cfg, targets, lens, old, adv, w, ref, on_policy):
        heads.append(dict(old=old.clone(), adv=adv.clone(), w=w.clone(), on_policy=on_policy.clone(),
                          lens=lens.tolist()))
        return real_head(cfg, targets, lens, old, adv, w, ref, on_policy)

    def packed_forward(policy, rows, device, fn):
        out = real_forward(policy, rows, device, fn)
        if heads:  # the update's forwards (old log-prob forwards pass no ppo_head)
            calls.append(dict(rows=list(rows), k=steps[0], loss=float(out[0].detach()), logp=out[1].detach().clone(),
                              state={n: t.clone() for n, t in model.full_named_tensors(policy)}, **heads.pop()))
        return out

    def optimizer_step(run):
        steps[0] += 1
        return real_step(run)
    monkeypatch.setattr(trainer, "ppo_head", ppo_head)
    monkeypatch.setattr(trainer, "packed_forward", packed_forward)
    monkeypatch.setattr(trainer, "optimizer_step", optimizer_step)
    return calls


def reference_loss(cfg, logp, old, on_policy, adv, w, lens) -> float:
    """One micro-batch's loss in float64: ratio r_t = exp(logp_t - old_t) (1 where on-policy), the run's objective
    (PPO's token clip, GSPO's clip of the sequence ratio exp(mean over kept tokens of log r), CISPO's clipped
    weight times -A logp), sum_t w_t l_t; entropy bonus and KL are 0 in these runs."""
    log_r = torch.where(on_policy, torch.zeros_like(logp), logp - old).clamp(-20, 20)  # (N,)
    loss, at = 0.0, 0
    for n in lens:
        sl = slice(at, at + n)
        at += n
        lr, a, ww, lp = log_r[sl], adv[sl], w[sl], logp[sl]
        if cfg.objective == "gspo":
            keep = ww > 0
            lr = (lr[keep].mean() if keep.any() else torch.zeros(())).expand_as(lr)
        r = lr.exp()
        clipped = r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
        term = -a * clipped * lp if cfg.objective == "cispo" else torch.maximum(-a * r, -a * clipped)
        loss += float((ww * term).sum())
    return loss


@pytest.mark.parametrize("name", list(EPOCHS))
def test_every_pass_clips_against_the_sampling_stage(world_of_one, tiny, tmp_path, monkeypatch, name):
    calls = record(monkeypatch)
    res = train(run_args(tiny, tmp_path, *EPOCHS[name], "--steps=3", "--n_samples=2", "--copris.concurrency=8"))
    cfg, M = res.cfg, res.cfg.mini_batches
    per_update = cfg.ppo_epochs * M
    assert len(res.updates) == 3
    states = {u.version: u.state for u in res.updates}
    m_fp64 = hf_model(cfg.model_path, "epochs").double()
    off_policy_clipped = carried = 0
    for j, u in enumerate(res.updates):
        key = {(tuple(r.prompt_ids), tuple(r.response)): i for i, r in enumerate(u.rows)}
        assert len(key) == len(u.rows), "two identical rows: the test cannot tell them apart"
        stage = stage_logprobs(cfg, u, states)  # (T_i,) per row: the sampling stage's log-probs, float64
        trajs = [t for g in u.groups for t in g.samples]
        seen = collections.defaultdict(list)  # pass -> row indices in the order trained
        for c in [c for c in calls if j * per_update <= c["k"] < (j + 1) * per_update]:
            e, m = divmod(c["k"] - j * per_update, M)
            idx = [key[(tuple(r.prompt_ids), tuple(r.response))] for r in c["rows"]]
            seen[e] += idx
            where = f"{name}: update {j}, pass {e}, mini-batch {m}"
            m_fp64.load_state_dict({n: t.double() for n, t in c["state"].items()}, strict=False)
            logits = hf_logits(m_fp64, c["rows"])
            logp = torch.cat([torch.log_softmax(z / cfg.temperature, -1).gather(1, torch.tensor(r.response)[:, None])
                              [:, 0] for z, r in zip(logits, c["rows"])])  # (N,) float64, the policy right now
            assert (c["logp"].double() - logp).abs().max() < 1e-5, f"{where}: the forward is not the policy's"
            old, onp = c["old"].double(), c["on_policy"]
            want_old = torch.cat([stage[i] for i in idx])  # (N,)
            if e or m:
                assert not onp.any() and not torch.isnan(old).any(), f"{where}: on-policy tokens after the first"
            if cfg.copris.old_logprob_source == "trainer":
                now = torch.cat([torch.tensor(trajs[i].versions) == u.version for i in idx])  # (N,) this version's
                if e == m == 0:
                    assert torch.equal(onp, now), f"{where}: on-policy flags {onp.tolist()} vs {now.tolist()}"
                carried += int((~now).sum())
            have = ~torch.isnan(old)
            assert torch.allclose(old[have], want_old[have], rtol=0, atol=1e-5), f"{where}: old is not the stages'"
            got, want = c["loss"], reference_loss(cfg, logp, old, onp, c["adv"].double(), c["w"].double(), c["lens"])
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), f"{where}: loss {got}, the formulas give {want}"
            r = torch.where(onp, 1.0, (logp - want_old).exp())
            off_policy_clipped += int(((r < 1 - cfg.clip_low) | (r > 1 + cfg.clip_high))[c["w"] > 0].sum()) * (e > 0)
        assert sorted(seen) == list(range(cfg.ppo_epochs)), f"{name}: passes {sorted(seen)}"
        for e, order in seen.items():
            assert sorted(order) == list(range(len(u.rows))), f"{name}: pass {e} trained rows {order}"
        if j == 0:
            assert any(seen[e] != seen[0] for e in seen if e), f"{name}: later passes kept the rollout order"
    assert off_policy_clipped, f"{name}: no token left the clip range in a later pass: the test checks nothing"
    if cfg.copris.old_logprob_source == "trainer":
        assert carried, f"{name}: no token of an earlier stage was trained: the cross-stage check is empty"


def test_loss_and_grad_norm_are_means_over_every_optimizer_step(world_of_one, tiny, tmp_path, monkeypatch):
    """The logged loss is the mean of the optimizer steps' losses, not their sum (3 passes x 2 mini-batches)."""
    calls = record(monkeypatch)
    res = train(run_args(tiny, tmp_path, "--ppo_epochs=3", "--mini_batches=2"))
    assert len({c["k"] for c in calls}) == 6
    assert abs(res.updates[0].stats["loss"] - sum(c["loss"] for c in calls) / 6) < 1e-6


def lr_per_optimizer_step(monkeypatch) -> list:
    """Patch optimizer_step: -> a list that fills with the learning rate of each optimizer step as it is taken."""
    lrs, real_step = [], trainer.optimizer_step

    def optimizer_step(run):
        lrs.append(run.optim.param_groups[0]["lr"])
        return real_step(run)
    monkeypatch.setattr(trainer, "optimizer_step", optimizer_step)
    return lrs


def test_cosine_schedule_spans_every_pass_and_resumes(world_of_one, tiny, tmp_path, monkeypatch):
    """lr_schedule advances once per RL step: with ppo_epochs 2 x mini_batches 2 the 4 optimizer steps of RL step s
    (after one warm-up step) all take lr (0.1 + 0.45 (1 + cos(pi f))), f = (s - 2) / 2: the peak, then 55%, then
    10% of lr at the last optimizer step of the last RL step; resumed from step 2, steps 3 and 4 take the same."""
    lrs = lr_per_optimizer_step(monkeypatch)
    keys = ("--ppo_epochs=2", "--mini_batches=2", "--lr_schedule=cosine", "--warmup_steps=1", "--steps=4",
            "--keep_checkpoints=4")
    whole = train(run_args(tiny, tmp_path, *keys), state=True)
    peak = whole.cfg.lr
    want = [peak * x for x in (1.0, 1.0, 0.55, 0.1) for _ in range(4)]
    assert lrs == pytest.approx(want, rel=1e-9), f"optimizer steps' lr {lrs}"
    assert [m["lr"] for m in whole.metrics[1:]] == pytest.approx(want[::4], rel=1e-9)
    lrs.clear()
    train(run_args(tiny, tmp_path, *keys, f"--resume={tmp_path / 'checkpoints' / 'step_000002'}"), state=True)
    assert lrs == pytest.approx(want[8:], rel=1e-9), f"resumed: optimizer steps' lr {lrs}"


def test_mini_batches_split_the_rows_evenly(world_of_one, tiny, tmp_path, monkeypatch):
    """8 rows in 5 mini-batches: 1 or 2 rows each, none empty (ceil would give 2, 2, 2, 2, 0: a no-op optimizer
    step); more mini-batches than a rank's rows is refused at the config check."""
    calls = record(monkeypatch)
    train(run_args(tiny, tmp_path, "--mini_batches=5"))
    sizes = [sum(len(c["rows"]) for c in calls if c["k"] == k) for k in range(5)]
    assert sizes == [1, 2, 1, 2, 2], sizes
    with pytest.raises(trainer.ConfigError, match="mini_batches=9 exceeds the 8 rows each rank trains"):
        trainer.load_config(run_args(tiny, tmp_path, "--mini_batches=9"), world=1)

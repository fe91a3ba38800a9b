"""Config keys and resumable state through the trainer's own wiring (tests/fake_rl.py: train_rl / train_sft in this
process with a fake engine and reward pool, about a second a run).

Keys: each run changes several keys from their defaults at once; the update's loss must equal the float64 formulas
evaluated with the run's config, and must not equal them with any one of those keys put back to its default (so
the key changes the result, and the trainer follows it). staleness_cap, eval_samples, tools.* and prime.* are checked
by what they shape: restarted trajectories, the held-out figures, the episodes and tool workers, PRIME's token
rewards and advantages (against float64 references). State: a run resumed from its step-1 checkpoint restores every
piece of Run.state_dict() exactly as saved, then saves the same states and logs the same metrics as the run that was
never stopped; the CUDA generator's way through a checkpoint is checked with a stand-in."""
import dataclasses
import functools
import json
import math
import types

import pytest
import torch
from transformers import AutoTokenizer

import model
import trainer
from fake_rl import advantages_fp64, assert_same_state, hf_logits, hf_model, run_args, train
from helpers import TIMING
from test_mismatch import reference_weights

# run -> the keys it changes from their defaults (KEYS: those its update's loss depends on)
RUNS = {
    # old log-probs from the engine: ratios far from 1, so every clip bound and the dual clip act; 2 steps, so the
    # second update's policy differs from the initial model (k3 KL > 0)
    "rollout": ("--copris.old_logprob_source=rollout", "--steps=2", "--clip_low=0.1", "--clip_high=0.5",
                "--dual_clip=2", "--kl_coef=0.5", "--entropy_coef=0.1", "--loss_agg=seq-mean-token-mean",
                "--temperature=0.6", "--scale_std=none", "--copris.staleness_cap=0", "--eval_samples=3"),
    # trainer old log-probs computed before the update, corrected against the engine's (token mask, both bounds)
    "correction": ("--correction.mode=token_mask", "--correction.low=0.3", "--correction.threshold=5"),
    # trainer old log-probs from the update's own forward (ratio 1), RLOO, sequence-sum aggregation
    "trainer": ("--advantage=rloo", "--loss_agg=seq-mean-token-sum"),
    # GSPO with the paper's clips and aggregation on engine old log-probs (sequence ratios far from 1), batch std
    "gspo": ("--objective=gspo", "--copris.old_logprob_source=rollout", "--clip_low=3e-4", "--clip_high=4e-4",
             "--loss_agg=seq-mean-token-mean", "--scale_std=batch", "--kl_coef=0.2"),
    # CISPO without a lower bound on the IS weight (MiniMax-M1), engine old log-probs
    "cispo": ("--objective=cispo", "--copris.old_logprob_source=rollout", "--clip_low=1.0", "--clip_high=0.5"),
    # Dr. GRPO (constant normaliser, no std), DAPO's overlong shaping and filtering: responses of 2..10 tokens, cut at 8
    "dr-grpo": ("--loss_agg=seq-mean-token-sum-norm", "--scale_std=none", "--overlong.buffer=4",
                "--overlong.penalty_factor=0.5",
                "--overlong.filter=true", "--max_response_len=8"),
}
KEYS = {"rollout": ["copris.old_logprob_source", "clip_low", "clip_high", "dual_clip", "kl_coef", "entropy_coef",
                    "loss_agg", "temperature", "scale_std"],
        "correction": ["correction.mode", "correction.low", "correction.threshold"],
        "trainer": ["advantage", "loss_agg"],
        "gspo": ["objective", "copris.old_logprob_source", "clip_low", "clip_high", "loss_agg", "scale_std"],
        "cispo": ["objective", "copris.old_logprob_source", "clip_low", "clip_high"],
        "dr-grpo": ["loss_agg", "scale_std", "overlong.buffer", "overlong.filter", "overlong.penalty_factor"]}


def with_default(cfg, key: str):
    """cfg with `key` (dotted for a section) back at its default value."""
    section, _, name = key.rpartition(".")
    if not section:
        return dataclasses.replace(cfg, **{name: getattr(type(cfg)(), name)})
    sub = getattr(cfg, section)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: getattr(type(sub)(), name)})})


def reference_loss(cfg, u) -> float:
    """An update's loss from DESIGN.md and kernels/ppo_loss.py in float64, from the recorded logits: old = the
    pre-update policy's log-prob (trainer source: valid while every trained token was sampled by that policy) or
    the engine's (rollout source); advantages from the groups' rewards; the correction weight of old against the
    engine's log-prob (0 = masked); loss_agg over the kept tokens; clip, dual clip, k3 KL to the initial model and
    the entropy bonus at the sampling temperature. The objective: PPO's token clip, GSPO's clip of the sequence
    ratio exp(mean_t (logp - old)) on each of its tokens, or CISPO's clipped weight times -adv logp; DAPO's overlong
    penalty added to the rewards, cut responses (finish_reason length) out of the loss with overlong.filter."""
    trajs = [t for g in u.groups for t in g.samples]
    cut = [t.finish_reason == "length" for t in trajs]
    L, c = cfg.max_response_len, cfg.overlong.buffer
    penalty = [cfg.overlong.penalty_factor * (-1.0 if k else min(0.0, ((L - c) - len(t.tokens)) / c)) if c else 0.0
               for t, k in zip(trajs, cut)]
    adv = advantages_fp64(cfg, [s + p for (s, _), p in zip((x for g in u.groups for x in g.scores), penalty)])
    terms = []
    for z, z_ref, r, t, a, k in zip(u.logits, u.ref_logits, u.rows, trajs, adv, cut):
        lsm, ref_lsm = torch.log_softmax(z / cfg.temperature, -1), torch.log_softmax(z_ref / cfg.temperature, -1)
        tokens = torch.tensor(r.response)[:, None]
        logp, ref = lsm.gather(1, tokens)[:, 0], ref_lsm.gather(1, tokens)[:, 0]
        roll = torch.tensor(t.logprobs, dtype=torch.float64)
        old = roll if cfg.copris.old_logprob_source == "rollout" else logp
        w = torch.ones_like(logp) if cfg.correction.mode == "none" else torch.tensor(
            reference_weights(cfg.correction.mode, old.tolist(), roll.tolist(), cfg.correction.low,
                              cfg.correction.threshold), dtype=torch.float64)
        w = w * (0 if cfg.overlong.filter and k else 1)
        ratio = (logp - old).clamp(-20, 20).exp()
        if cfg.objective in ("gspo", "gspo_token") and (w > 0).any():
            ratio = (logp - old)[w > 0].mean().clamp(-20, 20).exp().expand_as(logp)
        clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
        loss = -a * clipped * logp if cfg.objective == "cispo" else torch.maximum(-a * ratio, -a * clipped)
        if cfg.dual_clip is not None and a < 0:
            loss = loss.clamp(max=-a * cfg.dual_clip)
        d = (ref - logp).clamp(-20, 20)
        entropy = -(lsm.exp() * lsm).sum(-1)
        terms.append((w, loss + cfg.kl_coef * (d.exp() - d - 1) - cfg.entropy_coef * entropy))
    kept = [int((w > 0).sum()) for w, _ in terms]
    n_tok, n_seq = sum(kept), sum(k > 0 for k in kept)
    agg = {"token-mean": lambda k: 1 / n_tok, "seq-mean-token-mean": lambda k: 1 / (max(k, 1) * n_seq),
           "seq-mean-token-sum": lambda k: 1 / n_seq,
           "seq-mean-token-sum-norm": lambda k: 1 / (len(kept) * L)}[cfg.loss_agg]  # every row, filtered ones too
    return sum(float((w * l).sum()) * agg(k) for (w, l), k in zip(terms, kept))


@pytest.fixture(scope="module")
def runs(world_of_one, tiny, tmp_path_factory):
    """runs(name) -> that run's Result (tests/fake_rl.py), each run once, when a test first asks for it."""
    @functools.cache
    def get(name: str):
        held_out = [f"--eval_data={tiny / 'data' / 'eval.jsonl'}"] if name == "rollout" else []
        return train(run_args(tiny, tmp_path_factory.mktemp(name), *RUNS[name], *held_out))
    return get


@pytest.mark.parametrize("name", list(RUNS))
def test_update_loss_follows_every_key(runs, name):
    """The last update's loss equals the float64 formulas with the run's config, and differs from them with any
    one of the run's keys at its default."""
    res = runs(name)
    u, got = res.updates[-1], res.updates[-1].stats["loss"]
    want = reference_loss(res.cfg, u)
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), f"{name}: loss {got}, the formulas give {want}"
    for key in KEYS[name]:
        other = reference_loss(with_default(res.cfg, key), u)
        assert abs(other - want) > 1e-3 * max(1.0, abs(want)), f"{name}: {key} does not change the loss ({want})"
    sampled = {p["temperature"] for p in res.engine.params} - {0.0}  # 0: the held-out greedy completions
    assert sampled == {res.cfg.temperature}, f"{name}: the engine sampled at {sampled}"


def test_second_mini_batch_is_clipped_against_the_policy_that_sampled_it(world_of_one, tiny, tmp_path):
    """mini_batches=2 (trainer old log-probs): every row reaches the update with old log-probs already those of the
    policy before it, so the second mini-batch, trained after the first optimizer step, is not its own old policy."""
    u = train(run_args(tiny, tmp_path, "--mini_batches=2")).updates[0]
    for i, (r, z) in enumerate(zip(u.rows, u.logits)):
        want = torch.log_softmax(z, -1).gather(1, torch.tensor(r.response)[:, None])[:, 0]
        assert torch.allclose(r.old_logp.double(), want, atol=1e-5), f"row {i}: old {r.old_logp}, policy {want}"


def test_staleness_cap_restarts_buffered_trajectories(runs):
    """copris.staleness_cap=0 (the rollout run): every partial trajectory carried into step 2 is trained on tokens
    of version 1 only (restarted), none extended from its version-0 tokens."""
    u = runs("rollout").updates[-1]
    carried = [t for g in u.groups for t in g.samples if (t.prompt_id, t.sample) in u.carried]
    assert carried, "no carried partial trajectory was trained in step 2: the test checks nothing"
    for t in carried:
        assert set(t.versions) == {1}, f"prompt {t.prompt_id} sample {t.sample}: versions {t.versions}"


def test_eval_samples_sets_the_k_of_mean_and_pass(runs):
    """eval_samples=3: the step-0 evaluation scores 1 greedy + 3 samples per held-out row; greedy_acc comes from
    the greedy ones, mean@3 and pass@3 from the 3 samples alone."""
    res, k = runs("rollout"), 3
    scores = [s for s, _ in res.pool.calls[0]]  # the first scoring: the evaluation before step 1
    rows = [scores[i:i + k + 1] for i in range(0, len(scores), k + 1)]
    m = res.metrics[0]
    want = {"eval/rows": len(rows), "eval/greedy_acc": sum(r[0] for r in rows) / len(rows),
            "eval/mean@3": sum(sum(r[1:]) / k for r in rows) / len(rows),
            "eval/pass@3": sum(any(x >= 1 for x in r[1:]) for r in rows) / len(rows)}
    assert len(scores) == (k + 1) * m["data/eval_rows"] and 0 < want["eval/pass@3"] < 1
    for key, v in want.items():
        assert math.isclose(m[key], v, abs_tol=1e-9), f"{key}: {m[key]} vs {v}"


# old-log-prob strategy -> its keys: from the update's own forward (the default), computed upfront (two mini-batches:
# the policy versions step by 2), the engine's sampling log-probs
CROSS_STAGE = {"update": (), "upfront": ("--mini_batches=2",), "rollout": ("--copris.old_logprob_source=rollout",)}


def stage_logprobs(cfg, u, states: dict) -> list[torch.Tensor]:
    """Per trained row (T_i,) float64: each token's log-prob under the policy of the stage that sampled it (the
    weights recorded before the update of that version, in a plain float64 HF model), or, with rollout old
    log-probs, the engine's sampling log-prob of it."""
    trajs = [t for g in u.groups for t in g.samples]
    if cfg.copris.old_logprob_source == "rollout":
        return [torch.tensor(t.logprobs, dtype=torch.float64) for t in trajs]
    m = hf_model(cfg.model_path, "stage").double()
    out = [torch.zeros(len(r.response), dtype=torch.float64) for r in u.rows]
    for v in sorted({v for t in trajs for v in t.versions}):
        m.load_state_dict(states[v])
        for o, z, r, t in zip(out, hf_logits(m, u.rows), u.rows, trajs):
            at = torch.tensor(t.versions) == v  # (T_i,)
            o[at] = torch.log_softmax(z / cfg.temperature, -1).gather(1, torch.tensor(r.response)[:, None])[at, 0]
    return out


@pytest.mark.parametrize("source", list(CROSS_STAGE))
def test_cross_stage_old_logprobs_are_the_sampling_stages(world_of_one, tiny, tmp_path, source):
    """CoPRIS's invariant through train_rl: at the step that trains a trajectory, each token's old log-prob is the
    log-prob under the policy of the stage that sampled it (a copy of that policy, recorded then), also when the
    trajectory sat in the buffer across two or more updates while tokens were appended, and also when the run was
    resumed in between (the buffer's old log-probs go through the checkpoint); the earlier stages' values differ
    from the training policy's (lr 1e-2 moves it), so the check cannot pass by the policy standing still."""
    keys = (*CROSS_STAGE[source], "--steps=4", "--n_samples=2", "--copris.concurrency=8", "--keep_checkpoints=4")
    whole = train(run_args(tiny, tmp_path, *keys), state=True)
    resumed = train(run_args(tiny, tmp_path, *keys, f"--resume={tmp_path / 'checkpoints' / 'step_000002'}"))
    states = {u.version: u.state for u in whole.updates}
    assert len(resumed.updates) == 2, "the resumed run did not train steps 3 and 4"
    long_lived, resume_version = 0, resumed.updates[0].version
    carried = [t for u in resumed.updates for g in u.groups for t in g.samples if min(t.versions) < resume_version]
    assert carried, "no trajectory sampled before the checkpoint was trained after the resume"
    for run_name, updates in (("whole", whole.updates), ("resumed", resumed.updates)):
        for u in updates:
            want = stage_logprobs(whole.cfg, u, states)
            trajs = [t for g in u.groups for t in g.samples]
            for i, (got, w, z, r, t) in enumerate(zip(u.old_after, want, u.logits, u.rows, trajs)):
                where = f"{run_name} run, update at version {u.version}, row {i} (versions {t.versions})"
                assert (got.double() - w).abs().max() < 1e-6, f"{where}: old {got.tolist()} vs stages {w.tolist()}"
                now = torch.log_softmax(z / whole.cfg.temperature, -1).gather(1, torch.tensor(r.response)[:, None])[:, 0]
                earlier = torch.tensor(t.versions) < u.version
                if earlier.any():
                    assert (now - w)[earlier].abs().max() > 1e-3, f"{where}: earlier stages equal the current policy"
                long_lived += u.version - min(t.versions) >= 2 and len(set(t.versions)) >= 2
    assert long_lived, "no trajectory stayed in the buffer across two updates: the test would check nothing"


RESUMES = {  # the test adds LR warm-up over the 3 steps: a schedule that restarts would change the learning rate
    # PRIME's reference: the rollout policy's old log-probs (so they must be computed before the update)
    "rl-prime": ("--prime.enabled=true", "--prime.ref=policy", "--prime.filter_low=0", "--prime.filter_high=1",
                 "--prime.lr=1e-3"),
    # three passes of two mini-batches per step: later passes reshuffled by the checkpointed generator
    "rl-epochs": ("--ppo_epochs=3", "--mini_batches=2"),
    # PPO with a critic: its body, head, both optimizers and its step count (warm-up: step 2 trains the policy)
    "rl-gae": ("--advantage=gae", "--critic.lr=1e-3", "--critic.warmup_steps=1", "--critic.ppo_epochs=2",
               "--critic.gamma=0.9", "--critic.lam=0.8"),
    # PRIME's process rewards in GAE: the critic's state and the PRM's (model, optimizer) inside it
    "rl-prime-gae": ("--advantage=gae", "--critic.lr=1e-3", "--prime.enabled=true", "--prime.filter_low=0",
                     "--prime.filter_high=1", "--prime.lr=1e-3"),
    "sft": ("--mode=sft", "--sft_epochs=0", "--sft_batch_rows=16", "--max_response_len=96"),
}


@pytest.mark.parametrize("name", list(RESUMES))
def test_resume_restores_every_piece_of_state(world_of_one, tiny, tmp_path, name):
    """Resumed from the step-1 checkpoint, Run.state_dict() (policy, optimizer, LR schedule, RNGs, prompt cursor,
    CoPRIS buffer, PRIME's PRM and its optimizer, the critic's body, head, optimizers and step count, counters, SFT
    order and generator) is exactly what was saved, and
    steps 2 and 3 save the same states and log the same metrics as the run that was never stopped."""
    data = tiny / "data" / ("sft.jsonl" if name == "sft" else "rl_train.jsonl")
    keys = (*RESUMES[name], f"--train_data={data}", "--steps=3", "--warmup_steps=3", "--keep_checkpoints=3")
    whole = train(run_args(tiny, tmp_path, *keys), state=True)
    resumed = train(run_args(tiny, tmp_path, *keys, f"--resume={tmp_path / 'checkpoints' / 'step_000001'}"),
                    state=True)
    assert all(math.isfinite(m.get("grad_norm", 0.0)) for m in whole.metrics), "an update was skipped"
    saved = whole.saved[1]
    if name == "sft":
        assert saved["shared"]["sft_order"], "no SFT row left in the epoch's order: the test would not cover it"
    else:
        assert any(not t["finish_reason"] for g in saved["mine"]["scheduler"]["buffer"] for t in g["samples"]), \
            "no partial trajectory in the buffer: the test would not cover resuming one"
    assert_same_state(resumed.restored, saved, "restored at step 1")
    for step in (2, 3):
        assert_same_state(resumed.saved[step], whole.saved[step], f"saved at step {step}")
    assert [drop_timing(m) for m in resumed.metrics] == [drop_timing(m) for m in whole.metrics[2:]]


def drop_timing(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith(TIMING)}


def test_tools_keys_shape_the_episodes(world_of_one, tiny, tiny_tools, tmp_path):
    """Calculator episodes (every segment of the fake model ends in a tool call) with tools.max_turns=2,
    max_obs_tokens=8, tool_steps=3: each episode stops after its 2nd call (max_turns), each tool answer is cut at 8
    tokens (the observation says so), and the segment after a call starts 3 engine steps after it at the soonest
    (the engine stays busy with other requests; later when no slot is free): the defaults 4, 256 and 1 would give
    longer episodes, whole answers and 1 step."""
    data = tmp_path / "calc.jsonl"
    data.write_text("".join(json.dumps({**json.loads(line), "task": "math_calculator"}) + "\n"
                            for line in open(tiny / "data" / "rl_train.jsonl")))
    res = train(run_args(tiny, tmp_path, f"--model_path={tiny_tools / 'model'}", f"--train_data={data}",
                         "--max_response_len=96", "--tools.max_turns=2", "--tools.max_obs_tokens=8",
                         "--tools.tool_steps=3", "--tools.workers=1"))
    tok = AutoTokenizer.from_pretrained(tiny_tools / "model")
    trajs = [t for g in res.updates[0].groups for t in g.samples]
    assert all(t.calls <= 2 for t in trajs) and {t.finish_reason for t in trajs if t.calls == 2} == {"max_turns"}
    assert any(t.calls == 2 for t in trajs), f"no episode made 2 calls: {[t.calls for t in trajs]}"
    observations = [tok.decode(t.tokens[a:b]) for t in trajs for a, b in t.obs_spans]
    assert observations and all("[output truncated:" in o for o in observations), observations
    ids = [(f"p{t.prompt_id}-s{t.sample}-g", j) for t in trajs for j in range(len(t.obs_spans))]
    joins = [res.engine.added[f"{rid}{j + 1}"] - res.engine.finished[f"{rid}{j}"] for rid, j in ids]
    assert joins and min(joins) == 3, joins


def test_tools_timeout_and_workers_reach_the_tool_pool(tiny_tools):
    """tools.timeout_s and tools.workers (what the pool's own tests exercise: a call over the limit answers
    "timeout", a hung worker is replaced) are the ones the trainer's episodes run with; the defaults are 30 s, 2."""
    model_dir, data = tiny_tools / "model", tiny_tools / "data" / "rl_train.jsonl"
    cfg = trainer.load_config([f"--model_path={model_dir}", f"--train_data={data}", "--chat_template=false",
                               "--max_prompt_len=64", "--max_response_len=64", "--tools.timeout_s=7.5",
                               "--tools.workers=3"], world=1)
    run = types.SimpleNamespace(cfg=cfg, tok=AutoTokenizer.from_pretrained(model_dir))
    assert trainer.start_episodes(run, [{"task": "math"}]) is None  # no row names an environment: no workers
    episodes = trainer.start_episodes(run, [{"task": "math"}, {"task": "math_calculator"}])
    try:
        assert (episodes.timeout_s, episodes.pool.timeout_s, len(episodes.pool.procs)) == (7.5, 7.5, 3)
        ids, reason = episodes.result(episodes.submit(
            "calculator", {}, run.tok.encode('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}'
                                             '</tool_call>')))
        assert reason == "ok" and "42" in run.tok.decode(ids), (reason, run.tok.decode(ids))
    finally:
        episodes.close()


def test_prime_keys_shape_the_token_rewards_and_advantages(world_of_one, tiny, tmp_path, monkeypatch):
    """PRIME with beta, gamma and both coefficients away from their defaults, a PRM that moves (prime.lr) and 2
    steps: each step's token rewards are beta * (log pi_prm - log pi_ref) at the sampling temperature, the PRM as it
    was before its update (update=after) against the initial model, from plain HF forwards; and the advantages the
    update receives are paper Eq. 5 in float64 of those rewards and the groups' outcomes, with the run's gamma,
    coefficients and n_samples (tests/test_prime_advantages.py's loop reference)."""
    from rewards.prime import Prime
    from test_prime_advantages import reference
    seen, real_step = [], Prime.step

    def step(self, rows, outcome):
        prm = hf_model(self.cfg.model_path, "prm")
        prm.load_state_dict(dict(model.full_named_tensors(self.model)), strict=False)  # tied head: the embedding
        t = self.cfg.temperature
        logp = [[torch.log_softmax(z / t, -1).gather(1, torch.tensor(r.response)[:, None])[:, 0] for z, r in
                 zip(hf_logits(m, rows), rows)] for m in (prm, hf_model(self.cfg.model_path, "start"))]
        token_r, stats = real_step(self, rows, outcome)
        seen.append(([r.response for r in rows], outcome.clone(), token_r,
                     [self.p.beta * (a - b) for a, b in zip(*logp)]))
        return token_r, stats

    monkeypatch.setattr(Prime, "step", step)
    keys = ("--prime.enabled=true", "--prime.beta=0.5", "--prime.gamma=0.8", "--prime.outcome_coef=2.0",
            "--prime.process_coef=3.0", "--prime.lr=1e-2", "--temperature=0.7", "--steps=2")
    res = train(run_args(tiny, tmp_path, *keys))
    cfg = res.cfg
    assert len(seen) == len(res.updates) == 2
    for (responses, outcome, got_r, want_r), u in zip(seen, res.updates):
        assert [r.response for r in u.rows] == responses
        for got, want in zip(got_r, want_r):
            assert torch.allclose(got.double(), want, atol=2e-4), (got.double() - want).abs().max()
        R = torch.nn.utils.rnn.pad_sequence(want_r, batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(w)) for w in want_r], batch_first=True)
        adv = reference(outcome, R, mask, cfg.n_samples, cfg.prime.gamma, cfg.prime.outcome_coef,
                        cfg.prime.process_coef, whiten=True)
        for i, r in enumerate(u.rows):
            assert torch.allclose(r.adv.double(), adv[i, :len(r.response)], atol=2e-3), i
    moved = max(float(w.abs().max()) for w in seen[-1][3])
    assert moved > 1e-2, f"step 2's PRM is still the reference (token rewards up to {moved}): nothing tested beta"


@torch.no_grad()
def critic_values(path: str, weights: tuple, rows) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per row: the float64 values (T_i,) of a critic with weights (body tensors, head weight (H,), head bias) at the
    positions that predict its response tokens (a plain HF forward's last hidden state, after the final norm), and
    those hidden states (T_i, H)."""
    body, w, b = weights
    m = hf_model(path, "critic").double()
    missing, unexpected = m.load_state_dict(body, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    seqs = [r.prompt_ids + r.response for r in rows]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = torch.tensor(q)
    out = m.model(input_ids=ids).last_hidden_state
    h = [out[i, len(r.prompt_ids) - 1:len(q) - 1] for i, (r, q) in enumerate(zip(rows, seqs))]
    return [x @ w + b for x in h], h


@pytest.mark.parametrize("prime", [False, True])
def test_gae_run_follows_the_formulas(world_of_one, tiny, tmp_path, monkeypatch, prime):
    """advantage: gae with gamma 0.9, lam 0.7, a tight value clip, two critic passes and one warm-up step, 3 steps:
    at each step the advantages the policy update receives are GAE of the critic's pre-update values (plain float64
    HF forward of its recorded weights) and the step's rewards, whitened (prime: outcome_coef x the reward at the
    last token plus process_coef x the token rewards the PRM's step returned at every token); the logged value loss, clip fraction,
    explained variance and mean value are the float64 formulas over the values of the weights each pass trained; the
    critic's first AdamW step moves each head weight by -lr sign(g) with g the float64 gradient of the value loss
    (targets detached); step 1 trains the critic only (the policy is still version 0 at step 2's update)."""
    from rewards.critic import Critic
    from rewards.prime import Prime
    from test_critic import gae_reference
    seen, real_call, real_step, real_prm = [], Critic.__call__, Critic.optimizer_step, Prime.step

    def weights(c):
        body = {k: v.clone() for k, v in model.full_named_tensors(c.model)}
        return body, c.head.weight.detach()[0].double().clone(), float(c.head.bias.detach())

    def call(self, rows, rewards):
        seen.append({"rows": [model.Row(r.prompt_ids, r.response) for r in rows], "rewards": rewards.double().clone(),
                     "weights": []})
        stats = real_call(self, rows, rewards)
        seen[-1].update(adv=[r.adv.clone() for r in rows], stats=stats)
        return stats

    def step(self):
        seen[-1]["weights"].append(weights(self))
        return real_step(self)

    def prm_step(self, rows, outcome):
        token_r, stats = real_prm(self, rows, outcome)
        seen[-1]["process"] = [t.double().clone() for t in token_r]
        return token_r, stats

    monkeypatch.setattr(Critic, "__call__", call)
    monkeypatch.setattr(Critic, "optimizer_step", step)
    monkeypatch.setattr(Prime, "step", prm_step)
    lr, c, gamma, lam, w_out, w_proc = 1e-2, 0.05, 0.9, 0.7, 2.0, 0.5
    keys = ("--prime.enabled=true", "--prime.filter_low=0", "--prime.filter_high=1", "--prime.lr=1e-3",
            f"--prime.outcome_coef={w_out}", f"--prime.process_coef={w_proc}") if prime else ()
    res = train(run_args(tiny, tmp_path, "--advantage=gae", f"--critic.gamma={gamma}", f"--critic.lam={lam}",
                         f"--critic.cliprange_value={c}", f"--critic.lr={lr}", "--critic.ppo_epochs=2",
                         "--critic.warmup_steps=1", "--steps=3", *keys))
    assert len(seen) == 3 and len(res.updates) == 2 and res.updates[0].version == 0, (len(seen), len(res.updates))
    path, clipped_any = res.cfg.model_path, False
    for s, rec in enumerate(seen):
        rows, stats = rec["rows"], rec["stats"]
        assert len(rec["weights"]) == 2, f"step {s + 1}: {len(rec['weights'])} critic optimizer steps, not 2"
        passes = [critic_values(path, w, rows) for w in rec["weights"]]
        old, h = passes[0]
        if prime:  # the PRM stepped at every step; from step 2 (it starts as the reference) its token rewards are
            # not 0, so they are in the check
            assert "prm_loss" in stats and (s == 0 or any(t.abs().max() > 0 for t in rec["process"])), f"step {s + 1}"
        process = [w_proc * t for t in rec["process"]] if prime else [None] * len(old)
        out = w_out if prime else 1.0
        ref = [gae_reference(v.tolist(), out * float(r), gamma, lam, None if p is None else p.tolist())
               for v, r, p in zip(old, rec["rewards"], process)]
        A = [torch.tensor(a, dtype=torch.float64) for a, _ in ref]
        R = [torch.tensor(x, dtype=torch.float64) for _, x in ref]
        flat = torch.cat(A)
        white = [(a - flat.mean()) / torch.sqrt(flat.var() + 1e-8) for a in A]
        for i, (got, want) in enumerate(zip(rec["adv"], white)):
            assert torch.allclose(got.double(), want, atol=2e-4), f"step {s + 1} row {i}: {got} vs {want}"
        Rc, Vc = torch.cat(R), torch.cat(old)
        terms, more = [], []
        for v, _ in passes:
            v = torch.cat(v)
            v_clip = Vc + (v - Vc).clamp(-c, c)
            plain, clipped = (v - Rc) ** 2, (v_clip - Rc) ** 2
            terms.append(0.5 * torch.maximum(plain, clipped).mean())
            more.append((clipped > plain) & ((v - Vc).abs() > c))
        want = {"critic/value_loss": float(sum(terms)) / 2,
                "critic/vf_clipfrac": float(torch.cat(more).double().mean()),
                "critic/explained_variance": 1 - float((Rc - Vc).var()) / (float(Rc.var()) + 1e-8),
                "critic/values_mean": float(Vc.mean()), "critic/returns_mean": float(Rc.mean())}
        for k, w in want.items():
            tol = 1.0 / len(Rc) + 1e-9 if k == "critic/vf_clipfrac" else 1e-4 * max(1.0, abs(w))
            assert abs(stats[k] - w) <= tol, f"step {s + 1}: {k} {stats[k]} vs {w}"
        clipped_any |= stats["critic/vf_clipfrac"] > 0
        for u in res.updates:  # the policy update of this step received exactly the critic's advantages
            if [r.response for r in u.rows] == [r.response for r in rows]:
                assert all(torch.equal(a, r.adv) for a, r in zip(rec["adv"], u.rows)), f"step {s + 1}"
    assert clipped_any, "the value clip never acted: the check would miss it"
    # Adam's first step: -lr g / (|g| + eps) = -lr sign(g) per weight, g = d(value loss)/d(head weight) at step 1
    (old, h), rec = critic_values(path, seen[0]["weights"][0], seen[0]["rows"]), seen[0]
    process = [w_proc * t for t in rec["process"]] if prime else [None] * len(old)
    R = [torch.tensor(gae_reference(v.tolist(), (w_out if prime else 1.0) * float(r), gamma, lam,
                                    None if p is None else p.tolist())[1], dtype=torch.float64)
         for v, r, p in zip(old, rec["rewards"], process)]
    g = (torch.cat(old) - torch.cat(R)) @ torch.cat(h) / len(torch.cat(R))  # (H,)
    moved = rec["weights"][1][1] - rec["weights"][0][1]
    big = g.abs() > 1e-3 * g.abs().max()
    assert torch.allclose(moved[big], -lr * g[big].sign(), rtol=1e-3), (moved[big][:8], g[big][:8])


def test_checkpoint_carries_the_cuda_generator(world_of_one, tmp_path, monkeypatch):
    """On CUDA a checkpoint holds the device's generator (LoRA dropout draws from it) and a resume gives it back:
    what torch.cuda.get_rng_state returned at save is what torch.cuda.set_rng_state gets at load, for the run's
    device (CPU stand-in: both recorded, the run's device said to be cuda:0)."""
    saved, restored = torch.tensor([7, 1, 7], dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((state, device)))
    cfg, policy, cuda = trainer.Config(), torch.nn.Linear(3, 2), torch.device("cuda", 0)
    run = trainer.Run(cfg, 0, 1, cuda, tmp_path, None, policy, *trainer.make_optimizer(cfg, policy, 10))
    trainer.load_checkpoint(run, trainer.save_checkpoint(run, 1))
    assert len(restored) == 1 and torch.equal(restored[0][0], saved) and restored[0][1] == cuda, restored

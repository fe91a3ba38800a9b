"""The policy objectives of the fused lm_head op (kernels/fused_linear.py: ppo, gspo, gspo_token, cispo), Dr. GRPO's
constant normaliser (kernels.ppo_loss.token_weights), DAPO's overlong shaping and filtering
(rewards/advantages.py), and the combinations the config refuses.

Exactness: a float64 reference per objective written from its paper's equation, a loop over sequences and tokens
that shares no code with the implementation (the aggregation weights, the sequence ratios, the stop-gradients are
its own). A packed batch of ragged sequences with observation tokens (no loss, outside |y_i| and s_i), on-policy
tokens (old log-prob nan: this forward's), correction weights, the k3 KL and the entropy bonus, cut into two
mini-batches of two micro-batches each (global denominators per mini-batch): each mini-batch's loss and its
gradients w.r.t. hidden states, lm_head weight and bias agree with the reference to 1e-6 relative (torch path,
float64); the Triton path (the interpreter on CPU) to float32's tolerance. Identities: on-policy, gspo's gradient is
GRPO's with seq-mean-token-mean; inside the clip, cispo's gradient is the unclipped policy gradient.
"""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_kernels import DEV, close

from kernels import fused_linear_ppo_loss, linear_token_logprobs, token_weights
from rewards.advantages import Overlong, overlong_penalty
from trainer import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
LENS = [5, 1, 9, 3, 7, 4]  # packed sequences, N = 29
OBS = {2: [3, 4, 5], 4: [0, 6]}  # sequence -> its observation tokens (positions inside it)
ON_POLICY = {0: [0, 1, 2, 3, 4], 3: [0, 1]}  # tokens whose old log-prob is this forward's own (nan given)
SHIFT = [0.0, 0.5, -0.05, 0.1, -0.6, 0.02]  # per sequence, about logp - old: s_i = exp of its mean
ADV = [0.7, 1.3, -0.4, 0.9, -1.1, 0.5]  # per sequence (per-token objectives add noise to it)
MINI = [[[0, 2], [1]], [[3], [4, 5]]]  # two mini-batches of two micro-batches (sequence indices)
MAX_LEN = 12  # Dr. GRPO's constant length (>= every sequence)
H, V, T_SAMPLE, KL, ENT = 11, 301, 0.8, 0.1, 0.01
CASES = {  # name: (objective, loss_agg, clip_low, clip_high)
    "ppo-token-mean": ("ppo", "token-mean", 0.2, 0.28),
    "dr-grpo": ("ppo", "seq-mean-token-sum-norm", 0.2, 0.28),
    "gspo": ("gspo", "seq-mean-token-mean", 0.2, 0.28),
    "gspo-token": ("gspo_token", "seq-mean-token-mean", 0.2, 0.28),
    "cispo": ("cispo", "token-mean", 0.2, 0.28),
}
TOL = {torch.float64: {"fwd": (1e-6, 1e-6), "grad": (1e-6, 1e-6)},  # the bound asked for; 1e-15 measured
       torch.float32: {"fwd": (1e-5, 1e-5), "grad": (1e-5, 1e-5)}}  # test_fused_linear's float32 tolerance


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    if DEV == "cpu":  # several vocabulary blocks per row on the Triton path
        monkeypatch.setattr(importlib.import_module("kernels.token_logprobs"), "MAX_BLOCK_V", 128)


def starts() -> list[int]:
    return [sum(LENS[:j]) for j in range(len(LENS))]


def make_batch(dtype, seed=0, per_token_adv=True):
    """Leaves h (N, H), W (V, H), b (V,) in dtype (and as float64), targets, and per token: old (nan where
    on-policy), adv, ref, correction weight c, model-token mask, on-policy flags, sequence index."""
    g = torch.Generator().manual_seed(seed)
    N = sum(LENS)
    h, W = torch.randn(N, H, generator=g), 2 * torch.randn(V, H, generator=g) / H ** 0.5
    leaves = [x.to(dtype).requires_grad_(True) for x in (h, W, 0.5 * torch.randn(V, generator=g))]
    leaves64 = [x.detach().double().requires_grad_(True) for x in leaves]
    tgt = torch.randint(0, V, (N,), generator=g)
    with torch.no_grad():
        z = (leaves64[0] @ leaves64[1].T + leaves64[2]) / T_SAMPLE  # (N, V)
        logp = torch.log_softmax(z, -1).gather(1, tgt[:, None])[:, 0]  # (N,)
    seq = torch.repeat_interleave(torch.arange(len(LENS)), torch.tensor(LENS))  # (N,)
    noise = 0.1 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)
    old = logp - torch.tensor(SHIFT, dtype=torch.float64)[seq] - noise  # (N,)
    mask, onp = torch.ones(N, dtype=torch.bool), torch.zeros(N, dtype=torch.bool)
    for j, ts in OBS.items():
        mask[[starts()[j] + t for t in ts]] = False
    for j, ts in ON_POLICY.items():
        onp[[starts()[j] + t for t in ts]] = True
    old[onp] = float("nan")
    adv = torch.tensor(ADV, dtype=torch.float64)[seq] + (0.3 * torch.randn(N, generator=g, dtype=torch.float64)
                                                         if per_token_adv else 0.0)
    ref = logp + 0.5 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)
    c = 0.5 + torch.rand(N, generator=g, dtype=torch.float64)  # correction weights in [0.5, 1.5]
    return leaves, leaves64, tgt, dict(old=old, adv=adv, ref=ref, c=c, mask=mask, onp=onp, seq=seq)


def reference_loss(case, h, W, b, tgt, x, seqs) -> torch.Tensor:
    """float64 loss of the mini-batch made of sequences `seqs`, from the papers' equations, token by token.
    Per kept (model) token t of sequence i: logp_t, old_t (this forward's value, detached, where on-policy), the
    aggregation weight agg_i (token-mean: 1 / kept tokens; seq-mean-token-mean: 1 / (|y_i| G); Dr. GRPO:
    1 / (S L), S every sequence of the mini-batch, masked ones too) times its correction weight c_t: w_t.
      ppo         sum_t w_t * -min(r_t A_t, clip(r_t) A_t),  r_t = pi_t / pi_old_t                     (PPO)
      gspo        sum_i (sum_t w_t) * -min(s_i A_i, clip(s_i) A_i),  s_i = (prod_t r_t)^(1 / |y_i|)     (GSPO)
      gspo_token  sum_t w_t * -min(s_it A_t, clip(s_it) A_t),  s_it = sg[s_i] pi_t / sg[pi_t]        (GSPO-token)
      cispo       sum_t w_t * -sg(clip(r_t)) A_t log pi_t                                   (CISPO, MiniMax-M1)
    plus sum_t w_t (KL (e^u - u - 1) - ENT entropy_t), u = log pi_ref - log pi (k3); clip(x) in [1 - lo, 1 + hi]."""
    objective, agg, lo, hi = CASES[case]
    lsm = torch.log_softmax((h @ W.T + b) / T_SAMPLE, -1)  # (N, V)
    kept = {i: [starts()[i] + t for t in range(LENS[i]) if t not in OBS.get(i, [])] for i in seqs}
    G, n_tok = sum(1 for i in seqs if kept[i]), sum(len(kept[i]) for i in seqs)

    def clip(v):
        return torch.clamp(v, 1 - lo, 1 + hi)
    loss = torch.zeros((), dtype=torch.float64)
    for i in seqs:
        toks = kept[i]
        agg_i = {"token-mean": 1 / n_tok, "seq-mean-token-mean": 1 / (len(toks) * G),
                 "seq-mean-token-sum-norm": 1 / (len(seqs) * MAX_LEN)}[agg]
        w = {t: agg_i * x["c"][t] for t in toks}
        logp = {t: lsm[t, tgt[t]] for t in toks}
        old = {t: logp[t].detach() if x["onp"][t] else x["old"][t] for t in toks}
        A = {t: x["adv"][t] for t in toks}
        s = torch.exp(sum(logp[t] - old[t] for t in toks) / len(toks))
        if objective == "gspo":
            loss = loss + sum(w.values()) * -torch.minimum(s * A[toks[0]], clip(s) * A[toks[0]])
        for t in toks:
            r = torch.exp(logp[t] - old[t])
            if objective == "ppo":
                loss = loss + w[t] * -torch.minimum(r * A[t], clip(r) * A[t])
            elif objective == "gspo_token":
                r = s.detach() * torch.exp(logp[t] - logp[t].detach())
                loss = loss + w[t] * -torch.minimum(r * A[t], clip(r) * A[t])
            elif objective == "cispo":
                loss = loss + w[t] * -(clip(r).detach() * A[t] * logp[t])
            u = x["ref"][t] - logp[t]
            entropy = -(lsm[t].exp() * lsm[t]).sum()
            loss = loss + w[t] * (KL * (torch.exp(u) - u - 1) - ENT * entropy)
    return loss


def op_loss(case, leaves, tgt, x, micro, impl):
    """The mini-batch's loss as the trainer forms it: one fused_linear_ppo_loss call per micro-batch (its sequences
    packed), token_weights with the mini-batch's global denominators times the correction weights."""
    objective, agg, lo, hi = CASES[case]
    h, W, b = leaves
    seqs = [i for mb in micro for i in mb]
    kept = x["mask"] & torch.isin(x["seq"], torch.tensor(seqs))  # (N,)
    n_seqs = len({int(i) for i in x["seq"][kept]})
    loss, stats = 0.0, []
    for mb in micro:
        idx = torch.cat([torch.arange(starts()[i], starts()[i] + LENS[i]) for i in mb])  # (n,) packed tokens
        lens = torch.tensor([LENS[i] for i in mb])
        w = token_weights(lens, agg, x["mask"][idx].double(), n_tokens=float(kept.sum()), n_seqs=float(n_seqs),
                          max_len=MAX_LEN, n_rows=float(len(seqs))) * x["c"][idx]  # (n,) float64
        d = (lambda v: v.to(DEV)) if impl == "torch" else (lambda v: v.float().to(DEV))
        out = fused_linear_ppo_loss(h[idx.to(DEV)], W, tgt[idx].to(DEV), d(x["old"][idx]), d(x["adv"][idx]), d(w),
                                    lo, hi, None, d(x["ref"][idx]), KL, T_SAMPLE, ENT, bias=b,
                                    on_policy=x["onp"][idx].to(DEV), impl=impl, chunk=4, objective=objective,
                                    seq_lens=lens.to(DEV))
        loss = loss + out[0]
        stats.append(out[3])
    return loss, stats


@pytest.mark.parametrize("impl, dtype", [("torch", torch.float64), ("triton", torch.float32)], ids=["torch", "triton"])
@pytest.mark.parametrize("case", CASES)
def test_objective_matches_its_papers_equation(case, impl, dtype):
    """Each mini-batch (two micro-batches) against the float64 reference: loss, dh, dW, db."""
    leaves, leaves64, tgt, x = make_batch(dtype, per_token_adv=CASES[case][0] != "gspo")  # gspo: A_i per sequence
    leaves = [v.detach().to(DEV).requires_grad_(True) for v in leaves]
    clip_fracs = []
    for micro in MINI:
        got, stats = op_loss(case, leaves, tgt, x, micro, impl)
        want = reference_loss(case, *leaves64, tgt, x, [i for mb in micro for i in mb])
        tol = TOL[dtype]
        close(got, want, tol["fwd"], f"{case} loss")
        for name, g, g64 in zip("hWb", torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves64)):
            close(g, g64, tol["grad"], f"{case} d{name}", scaled=True)
        clip_fracs += [s["clip_frac"] for s in stats]
    assert 0 < max(clip_fracs) and min(clip_fracs) < 1, f"{case}: the clip acts on all tokens or none {clip_fracs}"


def test_on_policy_gspo_gradient_is_grpo_with_seq_mean_token_mean():
    """On-policy (every old log-prob this forward's, by flag or by value), s_i = 1 and d s_i = s_i mean_t d logp_t:
    GSPO's gradient equals the token clip's (GRPO) with seq-mean-token-mean aggregation."""
    (h, W, b), _, tgt, x = make_batch(torch.float64, seed=1, per_token_adv=False)
    lens = torch.tensor(LENS)
    w = token_weights(lens, "seq-mean-token-mean", x["mask"]).double()
    with torch.no_grad():
        logp, _ = linear_token_logprobs(h, W, tgt, T_SAMPLE, bias=b)
    grads = {}
    for name, objective, old, onp in (("grpo", "ppo", logp, None), ("gspo flags", "gspo", x["old"], x["mask"]),
                                      ("gspo values", "gspo", logp, None)):
        loss, *_ = fused_linear_ppo_loss(h, W, tgt, old, x["adv"], w, temperature=T_SAMPLE, bias=b, on_policy=onp,
                                         impl="torch", chunk=4, objective=objective, seq_lens=lens)
        grads[name] = torch.autograd.grad(loss, (h, W, b))
    assert max(float(g.abs().max()) for g in grads["grpo"]) > 1e-3
    for name in ("gspo flags", "gspo values"):
        for part, g, want in zip("hWb", grads[name], grads["grpo"]):
            close(g, want, (1e-10, 1e-10), f"{name} d{part}", scaled=True)


def test_cispo_inside_the_clip_is_the_unclipped_policy_gradient():
    """Every ratio inside [1 - clip_low, 1 + clip_high]: CISPO's gradient, sum_t w_t r_t A_t grad log pi_t, is the
    plain importance-weighted policy gradient of -sum_t w_t r_t A_t (the token clip with unbounded clips)."""
    (h, W, b), _, tgt, x = make_batch(torch.float64, seed=2)
    lens = torch.tensor(LENS)
    w = token_weights(lens, "token-mean", x["mask"]).double()
    with torch.no_grad():
        logp, _ = linear_token_logprobs(h, W, tgt, T_SAMPLE, bias=b)
    old = logp - 0.1 * (torch.rand(len(logp), generator=torch.Generator().manual_seed(3), dtype=torch.float64) - 0.5)
    grads = []
    for objective, clips in (("cispo", (0.2, 0.28)), ("ppo", (1e9, 1e9))):
        loss, _, _, stats = fused_linear_ppo_loss(h, W, tgt, old, x["adv"], w, *clips, temperature=T_SAMPLE, bias=b,
                                                  impl="torch", chunk=4, objective=objective, seq_lens=lens)
        assert stats["clip_frac"] == 0.0
        grads.append(torch.autograd.grad(loss, (h, W, b)))
    for part, g, want in zip("hWb", *grads):
        close(g, want, (1e-10, 1e-10), f"cispo d{part}", scaled=True)


def test_objective_arguments_are_checked():
    (h, W, b), _, tgt, x = make_batch(torch.float64)
    w = torch.ones(len(tgt), dtype=torch.float64)
    with pytest.raises(ValueError, match="objective must be one of"):
        fused_linear_ppo_loss(h, W, tgt, x["ref"], x["adv"], w, objective="grpo")
    with pytest.raises(ValueError, match="dual_clip"):
        fused_linear_ppo_loss(h, W, tgt, x["ref"], x["adv"], w, dual_clip=3.0, objective="cispo")
    with pytest.raises(ValueError, match="seq_lens"):
        fused_linear_ppo_loss(h, W, tgt, x["ref"], x["adv"], w, objective="gspo")


def test_overlong_penalty_hand_values():
    """DAPO Eq. 13 with L_max = 10, L_cache = 4: 0 up to 6 tokens, then -1/4 per token, -1 at 10 or when cut."""
    lengths, cut = torch.tensor([3, 6, 7, 9, 10, 4]), torch.tensor([False] * 5 + [True])
    assert overlong_penalty(lengths, cut, 10, 4).tolist() == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]


def test_overlong_shapes_rewards_by_response_length_and_filters_cut_responses():
    """|y| counts the whole response, a tool's observation tokens too (the length max_response_len cuts: the ramp ends
    where truncation starts); penalty_factor scales it; filtering empties the mask of a cut response (no loss, no
    denominator) and leaves the others; the metric is the mean penalty."""
    from model import Row
    rows = [Row([1], [5] * 9, mask=torch.tensor([True] * 5 + [False] * 4)), Row([1], [5] * 8), Row([1], [5] * 10)]
    for filt, factor in ((False, 1.0), (True, 1.0), (False, 0.5)):
        rs = [Row(r.prompt_ids, r.response, mask=r.mask) for r in rows]
        shaped, stats = Overlong(10, 4, filt, lambda t: t, factor)(rs, torch.ones(3), [False, False, True])
        assert shaped.tolist() == [1 - 0.75 * factor, 1 - 0.5 * factor, 1 - factor]
        assert stats == {"overlong/penalty_mean": pytest.approx(-0.75 * factor)}
        assert (rs[2].mask is not None and not rs[2].mask.any()) == filt and rs[1].mask is None
    shaped, stats = Overlong(10, 0, True, None)(rows, torch.ones(3), [False, False, True])  # filtering alone
    assert shaped.tolist() == [1.0] * 3 and stats == {} and not rows[2].mask.any()


def test_batch_std_covers_every_rank(world_of_one, tiny, tmp_path, monkeypatch):
    """scale_std batch through the trainer: the std is over every rank's rewards (here a stand-in second rank holding
    the same rewards: the statistics doubled), as fp64 GRPO advantages of the doubled batch give."""
    import trainer
    from fake_rl import advantages_fp64, run_args, train
    monkeypatch.setattr(trainer, "sum_over_ranks", lambda t, device: 2 * t.double())
    res = train(run_args(tiny, tmp_path, "--scale_std=batch"))
    u = res.updates[0]
    rewards = [s for g in u.groups for s, _ in g.scores]
    want = advantages_fp64(res.cfg, rewards + rewards)[:len(rewards)]
    assert len(set(rewards)) > 1 and want != advantages_fp64(res.cfg, rewards)
    for i, (r, a) in enumerate(zip(u.rows, want)):
        assert abs(float(r.adv[0]) - a) < 1e-5, f"row {i}: advantage {float(r.adv[0])}, every rank's std gives {a}"


@pytest.fixture
def base(tiny):
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]


@pytest.mark.parametrize("args, needle", [
    (["--objective=gspo", "--prime.enabled=true"], "need objective gspo_token"),
    (["--objective=gspo", "--correction.mode=token_mask"], "need objective gspo_token"),
    (["--objective=cispo", "--dual_clip=3"], "objective cispo has none"),
    (["--advantage=rloo", "--scale_std=batch"], "scale_std=batch scales GRPO's advantages"),
    (["--prime.enabled=true", "--scale_std=none"], "scale_std=none scales GRPO's advantages"),
    (["--overlong.buffer=128"], "overlong.buffer=128 must be in [0, max_response_len=128)"),
    (["--prime.enabled=true", "--overlong.filter=true"], "turn them off with prime.enabled"),
    (["--objective=grpo"], "objective: must be one of"),
    (["--dual_clip=1"], "dual_clip=1.0 must be > 1"),
    (["--dual_clip=0.5"], "dual_clip=0.5 must be > 1"),
    (["--clip_high=-0.1"], "must be >= 0"),
    (["--clip_low=-0.2"], "must be >= 0"),
    (["--objective=gspo", "--loss_agg=seq-mean-token-sum-norm"], "undoing GSPO's length normalisation"),
    (["--objective=gspo_token", "--loss_agg=seq-mean-token-sum-norm"], "undoing GSPO's length normalisation"),
    (["--overlong.buffer=8", "--overlong.penalty_factor=-1"], "overlong.penalty_factor=-1.0 must be >= 0"),
    (["--ppo_epochs=0"], "ppo_epochs must be >= 1"),
])
def test_nonsensical_combinations_are_refused(base, args, needle):
    with pytest.raises(ConfigError) as e:
        load_config([*base, *args])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_allowed_combinations_load(base):
    for args in (["--objective=gspo_token", "--prime.enabled=true", "--correction.mode=token_mask"],
                 ["--objective=gspo", "--correction.mode=sequence_mask", "--kl_coef=0.1", "--lora.rank=8"],
                 ["--objective=cispo", "--clip_low=1.0", "--overlong.buffer=32", "--overlong.filter=true"],
                 ["--loss_agg=seq-mean-token-sum-norm", "--scale_std=none", "--mini_batches=2"],
                 ["--dual_clip=1.5", "--ppo_epochs=4", "--mini_batches=2", "--clip_low=0", "--clip_high=0"],
                 ["--objective=gspo", "--ppo_epochs=2", "--lora.rank=4", "--correction.mode=sequence_truncate"],
                 ["--objective=cispo", "--clip_low=5", "--overlong.buffer=8", "--overlong.penalty_factor=0"],
                 ["--objective=gspo_token", "--loss_agg=token-mean", "--prime.enabled=true", "--ppo_epochs=2"]):
        load_config([*base, *args])


@pytest.mark.parametrize("args, want, said", [
    (["--objective=gspo"], dict(clip_low=3e-4, clip_high=4e-4, loss_agg="seq-mean-token-mean"),
     "objective gspo: its paper's clip_low=0.0003, clip_high=0.0004, loss_agg=seq-mean-token-mean"),
    (["--objective=gspo_token", "--clip_high=0.01"],
     dict(clip_low=3e-4, clip_high=0.01, loss_agg="seq-mean-token-mean"),
     "objective gspo_token: its paper's clip_low=0.0003, loss_agg=seq-mean-token-mean"),
    (["--objective=cispo"], dict(clip_low=1.0, clip_high=0.28, loss_agg="token-mean"),
     "objective cispo: its paper's clip_low=1.0"),
    (["--objective=cispo", "--clip_low=0.5"], dict(clip_low=0.5, clip_high=0.28), None),
    (["--objective=gspo", "--clip_low=0.2", "--clip_high=0.28", "--loss_agg=token-mean"],
     dict(clip_low=0.2, clip_high=0.28, loss_agg="token-mean"), None),
    ([], dict(clip_low=0.2, clip_high=0.28, loss_agg="token-mean"), None),
])
def test_objectives_take_their_papers_values_for_unset_keys(base, capsys, monkeypatch, args, want, said):
    """An objective with a paper's setup gives each key the run did not set that value, and says so in one line;
    a key set on the command line wins, and nothing is said when every such key was set."""
    monkeypatch.delenv("RL_PAPER_DEFAULTS_SAID", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    cfg = load_config([*base, *args])
    assert {k: getattr(cfg, k) for k in want} == want
    err = capsys.readouterr().err
    assert (err.strip() == f"{said} (keys you did not set; set them to override)") if said else err == "", err


def test_a_yaml_key_wins_over_the_papers_value(base, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RL_PAPER_DEFAULTS_SAID", raising=False)
    y = tmp_path / "c.yaml"
    y.write_text("objective: gspo\nclip_low: 0.1\n")
    cfg = load_config(["--config", str(y), *base])
    assert (cfg.clip_low, cfg.clip_high, cfg.loss_agg) == (0.1, 4e-4, "seq-mean-token-mean")
    assert capsys.readouterr().err.count("\n") == 1


def test_refusal_exits_2_with_one_line(base, tmp_path):
    p = subprocess.run([sys.executable, "trainer.py", *base, f"--run_dir={tmp_path}", "--objective=gspo",
                        "--prime.enabled=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "gspo_token" in p.stderr, p.stderr[-2000:]

"""advantage: gae (rewards/critic.py): GAE and its returns, whitening, the clipped value loss, its clip fraction and
explained variance against float64 loops written from the formulas (Schulman et al. 2016; PPO's value clip as verl
and OpenRLHF implement it), and the settings refused at start. The run-level checks (train_rl with a critic, resume)
are in tests/test_wiring.py."""
import pytest
import torch

import trainer
from config import ConfigError
from rewards.critic import explained_variance, gae, value_loss_terms, whiten

GAMMA, LAM = 0.9, 0.7


def gae_reference(values: list[float], reward: float, gamma: float, lam: float,
                  process: list[float] | None = None) -> tuple[list[float], list[float]]:
    """The paper's sums, no recursion: r_t = reward at the last token (+ process[t] at every token: PRIME's),
    delta_t = r_t + gamma V_{t+1} - V_t with V_{T+1} = 0, A_t = sum_{l >= 0} (gamma lam)^l delta_{t+l};
    R_t = A_t + V_t."""
    T = len(values)
    r = [(reward if t == T - 1 else 0.0) + (process[t] if process else 0.0) for t in range(T)]
    nxt = [values[t + 1] if t + 1 < T else 0.0 for t in range(T)]
    delta = [r[t] + gamma * nxt[t] - values[t] for t in range(T)]
    adv = [sum((gamma * lam) ** (s - t) * delta[s] for s in range(t, T)) for t in range(T)]
    return adv, [a + v for a, v in zip(adv, values)]


def random_rows(seed: int, lengths=(7, 1, 13, 0, 4)) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g, dtype=torch.float64) for n in lengths], torch.randn(len(lengths), generator=g)


@pytest.mark.parametrize("gamma,lam", [(GAMMA, LAM), (1.0, 1.0), (0.5, 0.95)])
def test_gae_and_returns_follow_the_paper(gamma, lam):
    """Rows of odd lengths (one token, and an empty one): every advantage and return equals the float64 sums, with
    and without per-token (process) rewards."""
    values, rewards = random_rows(0)
    adv, ret = gae(values, rewards, gamma, lam)
    for i, (v, a, R) in enumerate(zip(values, adv, ret)):
        want_a, want_r = gae_reference(v.tolist(), float(rewards[i]), gamma, lam)
        assert torch.allclose(a, torch.tensor(want_a, dtype=torch.float64), atol=1e-10), (i, a, want_a)
        assert torch.allclose(R, torch.tensor(want_r, dtype=torch.float64), atol=1e-10), (i, R, want_r)
    # PRIME's process rewards at every token besides the outcome at the last
    process = [torch.randn(len(v), generator=torch.Generator().manual_seed(i), dtype=torch.float64)
               for i, v in enumerate(values)]
    adv, ret = gae(values, rewards, gamma, lam, process)
    for i, (v, a, R) in enumerate(zip(values, adv, ret)):
        want_a, want_r = gae_reference(v.tolist(), float(rewards[i]), gamma, lam, process[i].tolist())
        assert torch.allclose(a, torch.tensor(want_a, dtype=torch.float64), atol=1e-10), (i, a, want_a)
        assert torch.allclose(R, torch.tensor(want_r, dtype=torch.float64), atol=1e-10), (i, R, want_r)
    # lam = 1: A_t = gamma^(T-1-t) r - V_t (Monte Carlo returns minus the baseline), R_t = the discounted reward
    _, ret = gae(values, rewards, gamma, 1.0)
    for i, (v, R) in enumerate(zip(values, ret)):
        T = len(v)
        want = torch.tensor([gamma ** (T - 1 - t) * float(rewards[i]) for t in range(T)], dtype=torch.float64)
        assert torch.allclose(R, want, atol=1e-10), (i, R, want)


def test_whitening_covers_every_rank():
    """(A - mean) / sqrt(var + 1e-8), unbiased var over every token of every row; split over two "ranks" whose
    statistics are summed (reduce), each half gets what the whole batch gives."""
    adv, _ = gae(*random_rows(1), GAMMA, LAM)
    flat = torch.cat(adv)
    mean, var = flat.mean(), flat.var(unbiased=True)
    want = [(a - mean) / torch.sqrt(var + 1e-8) for a in adv]
    for got, w in zip(whiten(adv), want):
        assert torch.allclose(got, w, atol=1e-10)
    halves = adv[:2], adv[2:]

    def stats(rows):
        x = torch.cat(rows)
        return torch.tensor([float(x.numel()), float(x.sum()), float((x * x).sum())], dtype=torch.float64)
    for k, half in enumerate(halves):
        other = stats(halves[1 - k])
        got = whiten(list(half), reduce=lambda t: t + other)
        for g, w in zip(got, want[:2] if k == 0 else want[2:]):
            assert torch.allclose(g, w, atol=1e-10), k


def test_clipped_value_loss_clipfrac_and_gradient():
    """0.5 max((v - R)^2, (v_clip - R)^2) with v_clip = old + clamp(v - old, -c, c) per token, the clipped term
    larger exactly where the fraction counts it, and the gradient: (v - R) where the unclipped term is larger or
    v is inside the clip range, 0 where the clipped term is larger and v outside (v_clip does not move)."""
    g, c = torch.Generator().manual_seed(2), 0.2
    old = torch.randn(41, generator=g, dtype=torch.float64)
    v = (old + 0.5 * torch.randn(41, generator=g, dtype=torch.float64)).requires_grad_()
    R = torch.randn(41, generator=g, dtype=torch.float64)
    terms, more = value_loss_terms(v, old, R, c)
    terms.sum().backward()
    for t in range(41):
        vt, ot, rt = float(v.detach()[t]), float(old[t]), float(R[t])
        vc = ot + min(max(vt - ot, -c), c)
        plain, clipped = (vt - rt) ** 2, (vc - rt) ** 2
        assert abs(float(terms.detach()[t]) - 0.5 * max(plain, clipped)) < 1e-12, t
        assert bool(more[t]) == (clipped > plain and abs(vt - ot) > c), t
        grad = 0.0 if clipped > plain and abs(vt - ot) > c else vt - rt
        assert abs(float(v.grad[t]) - grad) < 1e-12, (t, float(v.grad[t]), grad)
    assert 0 < int(more.sum()) < 41, "no token (or every token) is clipped: the check would miss a side"


def test_explained_variance():
    """1 - Var(R - V) / (Var(R) + 1e-8) (unbiased), also when the tokens are split over two "ranks"."""
    g = torch.Generator().manual_seed(3)
    R, V = torch.randn(30, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    want = 1 - float((R - V).var()) / (float(R.var()) + 1e-8)
    assert abs(explained_variance(R, V) - want) < 1e-12
    d = R[10:] - V[10:]
    other = torch.tensor([20.0, float(R[10:].sum()), float((R[10:] ** 2).sum()), float(d.sum()), float((d * d).sum())],
                         dtype=torch.float64)
    assert abs(explained_variance(R[:10], V[:10], reduce=lambda t: t + other) - want) < 1e-10
    assert abs(explained_variance(R, R) - 1.0) < 1e-12


def base_args(tiny) -> list[str]:
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_response_len=64"]


@pytest.mark.parametrize("keys,says", [
    (("--prime.enabled=true", "--prime.gamma=0.9"), "prime.gamma"),
    (("--lora.rank=8",), "lora.rank"),
    (("--critic.cliprange_value=0",), "cliprange_value"),
    (("--critic.lam=1.5",), "critic.lam"),
    (("--critic.model_path=/nonexistent",), "critic.model_path"),
    (("--scale_std=batch",), "scale_std"),
])
def test_gae_refuses_what_it_does_not_run_with(tiny, keys, says):
    """Each refusal is one line naming the key."""
    base = [*base_args(tiny), "--advantage=gae"]
    with pytest.raises(ConfigError) as e:
        trainer.load_config([*base, *keys], world=1)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_gae_refuses_engine_tensor_parallel(tiny):
    base = [*base_args(tiny), "--advantage=gae",
            "--engine.tensor_parallel_size=2", "--batch_groups=2"]
    with pytest.raises(ConfigError) as e:
        trainer.load_config(base, world=2)
    assert "tensor_parallel_size" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_other_libraries_names_reach_the_critic(tiny):
    """verl's / OpenRLHF's / TRL's critic names are answered with ours."""
    base = base_args(tiny)
    for name, ours in (("algorithm.gamma", "critic.gamma"), ("algorithm.lam", "critic.lam"),
                       ("critic.optim.lr", "critic.lr"), ("critic_pretrain", "critic.model_path"),
                       ("trainer.critic_warmup", "critic.warmup_steps"), ("cliprange_value", "critic.cliprange_value"),
                       ("algorithm.adv_estimator", "advantage")):
        with pytest.raises(ConfigError) as e:
            trainer.load_config([*base, f"--{name}=1"], world=1)
        assert repr(ours) in str(e.value), (name, str(e.value))
    cfg = trainer.load_config([*base, "--advantage=gae", "--critic.cliprange_value=0.2", "--critic.ppo_epochs=2"],
                              world=1)  # verl's critic.cliprange_value and critic.ppo_epochs are ours as they are
    assert (cfg.advantage, cfg.critic.cliprange_value, cfg.critic.ppo_epochs) == ("gae", 0.2, 2)

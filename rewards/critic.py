"""PPO with a learned value function (`advantage: gae`) as an advantage strategy of the RL step: a critic and
generalized advantage estimation (Schulman et al. 2016). docs/algorithms.md, "PPO with a critic (GAE)".

    critic = Critic(cfg, device, prm)        # a value model: the policy's architecture + a scalar head, own AdamW;
                                             # prm: a rewards.prime.Prime with prime.enabled, else None
    stats = critic(rows, rewards)            # old values, GAE, whitening (row.adv (T_i,)), then the value update

Values: V_t is the critic's output at the position that predicts response token t (the state prompt + y_<t; the
positions of the policy's log-probs), from the critic as it is before this step's update (old values, no grad). On
each row's model tokens (a tool's observation tokens are skipped: the chain runs over the model's tokens in order):
r_t = the sample's reward at its last model token, 0 elsewhere (with PRIME: outcome_coef x the reward there, plus
process_coef x the implicit process reward of its PRM at every model token, the PRM stepped first as PRIME's own
advantages have it: rewards/prime.py); delta_t = r_t + gamma V_{t+1} - V_t with
V_{T+1} = 0 (a finished response is terminal; so is one cut at max_response_len: no bootstrap, as verl);
A_t = sum_l (gamma lam)^l delta_{t+l}; returns R_t = A_t + V_t (value targets, detached). Whitening (critic.whiten):
(A - mean) / sqrt(var + 1e-8) over the model tokens of every rank (unbiased var: verl's masked_whiten, and PRIME's).
Then critic.ppo_epochs passes over the step's mini-batches (`mini_batches` optimizer steps each, the policy's split,
no reshuffle), the clipped value loss of verl / OpenRLHF:
v_clip = V_old + clamp(v - V_old, -c, c), loss = 0.5 * token-mean over every rank's model tokens of the mini-batch
of max((v - R)^2, (v_clip - R)^2). verl's order: the critic trains before the policy; while the critic has trained
at most critic.warmup_steps RL steps, the policy does not train (rl_step: hold_policy).
"""
import math
import warnings

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from model import DUMMY, build_model, micro_batches, packed_forward, response_logprobs, split_rows, sum_over_ranks


def model_mask(row) -> torch.Tensor:
    """(T,) bool: the row's model tokens (False at a tool's observations)."""
    return torch.ones(len(row.response), dtype=torch.bool) if row.mask is None else row.mask.bool()


def gae(values: list[torch.Tensor], rewards: torch.Tensor, gamma: float, lam: float,
        token_rewards: list[torch.Tensor] | None = None) -> tuple[list, list]:
    """GAE on sequences of model tokens: values one (L_i,) tensor per row, rewards (B,) each row's scalar reward at
    its last token, token_rewards (PRIME's process rewards) None or one (L_i,) tensor per row added at every token ->
    (advantages, returns), one (L_i,) float64 tensor each (module docstring; an empty row gives empty ones)."""
    B, T = len(values), max((len(v) for v in values), default=0)
    V = torch.zeros(B, T + 1, dtype=torch.float64)  # (B, T + 1): V_{T+1} = 0 past each row's last token
    r = torch.zeros(B, T, dtype=torch.float64)  # (B, T)
    for i, v in enumerate(values):
        V[i, :len(v)] = v.double()
        if token_rewards is not None:
            r[i, :len(v)] = token_rewards[i].double()
        if len(v):
            r[i, len(v) - 1] += float(rewards[i])
    delta = r + gamma * V[:, 1:] - V[:, :-1]  # (B, T); 0 past a row's end, so each chain starts at 0 there
    A, last = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        last = delta[:, t] + gamma * lam * last
        A[:, t] = last
    adv = [A[i, :len(v)] for i, v in enumerate(values)]
    return adv, [a + v.double().detach() for a, v in zip(adv, values)]


def whiten(adv: list[torch.Tensor], reduce=None) -> list[torch.Tensor]:
    """(A - mean) / sqrt(var + 1e-8) over every value of every list entry (and every rank: reduce(t) sums a (3,)
    float64 tensor over ranks); unbiased var."""
    flat = torch.cat(adv) if adv else torch.zeros(0, dtype=torch.float64)
    s = torch.tensor([float(flat.numel()), float(flat.sum()), float((flat * flat).sum())], dtype=torch.float64)
    n, s1, s2 = (s if reduce is None else reduce(s)).tolist()
    mean = s1 / max(n, 1.0)
    var = max(s2 - n * mean * mean, 0.0) / max(n - 1, 1.0)
    return [(a - mean) * (var + 1e-8) ** -0.5 for a in adv]


def value_loss_terms(v: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float):
    """(N,) current values, old values, returns -> ((N,) 0.5 * max((v - R)^2, (v_clip - R)^2), (N,) bool: the
    clipped term is the larger), v_clip = old + clamp(v - old, -clip, clip). It can be larger only where v is outside
    the clip range (inside, v_clip is v): counted there only, so rounding in old + (v - old) never counts a token."""
    v_clip = old + (v - old).clamp(-clip, clip)
    plain, clipped = (v - returns) ** 2, (v_clip - returns) ** 2
    return 0.5 * torch.maximum(plain, clipped), (clipped > plain) & ((v - old).abs() > clip)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, reduce=None) -> float:
    """1 - Var(R - V) / (Var(R) + 1e-8) over the given tokens of every rank (unbiased variances)."""
    d = returns.double() - values.double()
    s = torch.tensor([float(d.numel()), float(returns.double().sum()), float((returns.double() ** 2).sum()),
                      float(d.sum()), float((d * d).sum())], dtype=torch.float64)  # (5,)
    n, r1, r2, d1, d2 = (s if reduce is None else reduce(s)).tolist()
    var_r, var_d = (max(b - a * a / max(n, 1.0), 0.0) / max(n - 1, 1.0) for a, b in ((r1, r2), (d1, d2)))
    return 1.0 - var_d / (var_r + 1e-8)


class Critic:
    """The value model, its head and optimizers, and the step counter warm-up reads; state_dict() is part of a
    checkpoint (module docstring)."""

    def __init__(self, cfg, device, prm=None):
        self.cfg, self.c, self.device, self.prm = cfg, cfg.critic, device, prm
        self.model = build_model(self.c.model_path or cfg.model_path, device, trainable=True, precision=cfg.precision)
        hidden = self.model.config.hidden_size
        # fp32, a full copy on every rank (its grads all-reduced); initialised here, the global generator left alone
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, hidden, 1, device=device)
        with torch.no_grad():  # N(0, 0.01 / H), bias 0: values of about +-0.1 at the start; the same on every rank
            self.head.weight.copy_(torch.randn(1, hidden, generator=torch.Generator().manual_seed(cfg.seed)) * 0.1
                                   / math.sqrt(hidden))
            self.head.bias.zero_()
        out, emb = self.model.get_output_embeddings().weight, self.model.get_input_embeddings().weight
        body = [p for p in self.model.parameters() if p.requires_grad and (p is not out or out is emb)]  # an untied
        # lm_head gets no gradient (values come from the hidden states): left out of the optimizer and its state
        self.optim = torch.optim.AdamW(body, lr=self.c.lr, weight_decay=0.0)  # FSDP2's DTensors: one optimizer,
        self.head_optim = torch.optim.AdamW(self.head.parameters(), lr=self.c.lr, weight_decay=0.0)  # plain: another
        self.steps = 0  # RL steps the critic trained (critic.warmup_steps reads it)
        self.reduce = lambda t: sum_over_ranks(t, device)

    @property
    def warming(self) -> bool:
        """The policy does not train at this step (the critic alone has trained so far)."""
        return self.steps <= self.c.warmup_steps

    def values(self, batch: list) -> torch.Tensor:
        """(N,) fp32 values at the packed response positions of `batch` (with grad when enabled)."""
        return packed_forward(self.model, batch or [DUMMY], self.device,
                              lambda h, weight: self.head(h.float()).squeeze(-1))  # the lm_head weight is unused

    def __call__(self, rows: list, rewards: torch.Tensor) -> dict:
        """Old values, GAE and (whiten) whitening: sets each row's adv (T_i,), 0 at observations; then the value
        update; -> critic/ metrics."""
        old = [None] * len(rows)
        with torch.no_grad():
            for mb in micro_batches(rows, self.cfg.token_budget, self.device):
                v = self.values([rows[i] for i in mb])  # an empty mb runs DUMMY (FSDP's collectives must match)
                for i, x in zip(mb, split_rows(v, [rows[i] for i in mb]) if mb else []):
                    old[i] = x.detach().cpu()
        masks = [model_mask(r) for r in rows]
        process, stats = None, {}
        if self.prm:  # PRIME: its PRM's step, then its token rewards (the module docstring)
            token_r, stats = self.prm.step(rows, rewards)
            stats.update(self.prm.process_stats(token_r, rows))
            p = self.cfg.prime
            process, rewards = [p.process_coef * t[m] for t, m in zip(token_r, masks)], p.outcome_coef * rewards
        adv, ret = gae([v[m] for v, m in zip(old, masks)], rewards, self.c.gamma, self.c.lam, process)
        ev = explained_variance(torch.cat(ret or [torch.zeros(0)]), torch.cat([v[m] for v, m in zip(old, masks)] or
                                                                             [torch.zeros(0)]), self.reduce)
        n, v_sum, r_sum = self.reduce(torch.tensor([float(sum(m.sum() for m in masks)), float(sum(v[m].sum() for v, m in
                                                   zip(old, masks))), float(sum(x.sum() for x in ret))])).tolist()
        adv = whiten(adv, self.reduce) if self.c.whiten else adv
        targets = []
        for r, m, a, R, v in zip(rows, masks, adv, ret, old):
            r.adv = torch.zeros(len(r.response)).index_put_((m,), a.float())  # (T_i,)
            targets.append(v.clone().index_put_((m,), R.float()))  # (T_i,) returns (old values at observations)
        stats.update(self.update(rows, old, targets, masks))
        self.steps += 1
        return {**stats, "critic/explained_variance": ev, "critic/values_mean": v_sum / max(n, 1.0),
                "critic/returns_mean": r_sum / max(n, 1.0)}

    def update(self, rows: list, old: list, targets: list, masks: list) -> dict:
        """critic.ppo_epochs passes of `mini_batches` optimizer steps over the rows (module docstring); -> the value
        loss (mean over optimizer steps), clip fraction (over every token of every pass), grad norm (mean)."""
        cfg, world = self.cfg, torch.distributed.get_world_size()
        loss_sum = clipped = tokens = norm_sum = 0.0
        steps = self.c.ppo_epochs * cfg.mini_batches
        for _ in range(self.c.ppo_epochs):
            for k in range(cfg.mini_batches):
                idx = list(range(k * len(rows) // cfg.mini_batches, (k + 1) * len(rows) // cfg.mini_batches))
                n = self.reduce(torch.tensor([float(sum(masks[i].sum() for i in idx))])).item()
                for mb in micro_batches([rows[i] for i in idx], cfg.token_budget, self.device):
                    batch = [idx[j] for j in mb]
                    v = self.values([rows[i] for i in batch])  # (N,)
                    if not batch:
                        (v.sum() * 0.0).backward()
                        continue
                    cat = lambda xs: torch.cat([xs[i] for i in batch]).to(self.device)  # noqa: E731
                    terms, more = value_loss_terms(v, cat(old), cat(targets), self.c.cliprange_value)
                    m = cat(masks)
                    loss = (terms * m).sum() / max(n, 1.0)
                    (loss * world).backward()  # FSDP averages gradients over ranks: the global token-mean
                    loss_sum += loss.item() / steps
                    clipped, tokens = clipped + float((more & m).sum()), tokens + float(m.sum())
                norm_sum += self.optimizer_step() / steps
        loss, clipped, tokens = self.reduce(torch.tensor([loss_sum, clipped, tokens])).tolist()
        return {"critic/value_loss": loss, "critic/vf_clipfrac": clipped / max(tokens, 1.0),
                "critic/grad_norm": norm_sum}

    def optimizer_step(self) -> float:
        """Head gradients averaged over ranks (FSDP2 does the body's), one clip over both by their joint norm
        (cfg.grad_clip), both AdamW steps unless the norm is not finite; -> the norm before clipping."""
        for p in self.head.parameters():
            p.grad = (sum_over_ranks(p.grad, self.device) / torch.distributed.get_world_size()).to(p.grad.dtype)
        body = [p.grad for p in self.model.parameters() if p.grad is not None]
        sq = torch.nn.utils.get_total_norm(body) ** 2 if body else torch.zeros(())
        sq = float(sq.full_tensor() if hasattr(sq, "full_tensor") else sq)
        norm = math.sqrt(sq + sum(float(p.grad.double().pow(2).sum()) for p in self.head.parameters()))
        if math.isfinite(norm):
            coef = min(1.0, self.cfg.grad_clip / (norm + 1e-6))
            for g in body + [p.grad for p in self.head.parameters()]:
                g.mul_(coef)
            self.optim.step()
            self.head_optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.head_optim.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optim)
        head, head_optim = get_state_dict(self.head, self.head_optim)
        return {"model": model, "optim": optim, "head": head, "head_optim": head_optim,
                "steps": torch.tensor(self.steps), **({"prm": self.prm.state_dict()} if self.prm else {})}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        set_state_dict(self.head, self.head_optim, model_state_dict=state["head"], optim_state_dict=state["head_optim"])
        self.steps = int(state["steps"])
        if self.prm:
            self.prm.load_state_dict(state["prm"])


@torch.no_grad()
def hold_policy(run, rows: list) -> dict:
    """critic.warmup_steps: the policy does not train at this step. The old log-probs its update would have supplied
    (nan) come from a no-grad forward of the policy (the metrics read them); the LR schedule advances (once per RL
    step, as always); -> no update metrics."""
    need = [r for r in rows if torch.isnan(r.old_logp).any()]
    for mb in micro_batches(need, run.cfg.token_budget, run.device):
        for i, lp in zip(mb, response_logprobs(run.policy, [need[i] for i in mb], run.device, run.cfg.temperature)):
            need[i].old_logp = torch.where(torch.isnan(need[i].old_logp), lp.cpu(), need[i].old_logp)
    with warnings.catch_warnings():  # torch warns of a scheduler step before any optimizer step: that is the point
        warnings.simplefilter("ignore", UserWarning)
        run.sched.step()
    return {}

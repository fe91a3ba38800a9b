"""trainer.train_rl / train_sft in the test process (the session's 1-rank gloo group, fixture `world_of_one`) with a
deterministic fake engine and reward pool: the trainer's own wiring from a command line to the update, a run in about
a second. What each update received is recorded with the logits of a plain HF forward of the policy as it was just
before it, so a test can recompute the loss in float64 from the formulas and compare; the state each checkpoint saved
and the state a resume restored are recorded too (plain tensors and lists: compare with assert_same_state)."""
import functools
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import model
import trainer
from rewards.user import UserReward, parse
from rollout.copris import Delta

VOCAB_LO, VOCAB_SPAN = 5, 300  # fake tokens: ids 5..304 of the tiny model's 400


def roll_logprob(seed: int, k: int) -> float:
    """The fake engine's sampling log-prob of a request's k-th token: -7.5, -6 or -4.5 (the tiny model's are about
    -6, so the trainer/engine ratios are about 0.2, 1 and 4.5: every clip and correction bound is crossed)."""
    return -6.0 + 1.5 * ((seed + k) % 3 - 1)


class FakeEngine:
    """The RolloutEngine calls trainer.py makes. A request with seed s emits, one per step, token
    5 + (7 s + 13 k) % 300 at its k-th position with log-prob roll_logprob(s, k), and stops after 2 + s % 9 tokens
    (its last one the tool-call end token when that is one of its stop tokens: every segment of an episode ends in a
    call) or at max_tokens. Kept: every request's sampling params (`params`), and the step index at which each
    request was added (`added`) and finished (`finished`), steps counted from 0 over the engine's life."""
    holds_weights = True

    def __init__(self):
        self.running, self.params, self.added, self.finished, self.steps, self.pushes = {}, [], {}, {}, 0, 0

    @staticmethod
    def sampling(max_tokens, temperature, top_p, seed, stop_token_ids, ignore_eos=False) -> dict:
        return {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed or 0,
                "stop": list(stop_token_ids)}

    def add(self, req_id, prompt_ids, params):
        self.params.append(params)
        self.running[req_id] = (params, [])
        self.added[req_id] = self.steps

    def step(self) -> list[Delta]:
        out = []
        for rid, (p, toks) in list(self.running.items()):
            s, k = p["seed"], len(toks)
            stop_len = 2 + s % 9
            call = len(p["stop"]) > 1 and k + 1 == stop_len  # stop: [eos, the call-end token] for episodes
            toks.append(p["stop"][-1] if call else VOCAB_LO + (7 * s + 13 * k) % VOCAB_SPAN)
            reason = "stop" if len(toks) >= stop_len else "length" if len(toks) >= p["max_tokens"] else None
            if reason:
                del self.running[rid]
                self.finished[rid] = self.steps
            out.append(Delta(rid, [toks[-1]], [roll_logprob(s, k)], reason is not None, reason))
        self.steps += 1
        return out

    def abort(self, req_ids):
        for rid in req_ids:
            del self.running[rid]

    def generate(self, prompts, params, on_finish=None):
        done = {}
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self.add(f"gen-{i}", p, sp)
            done[f"gen-{i}"] = ([], [])
        while self.running:
            for d in self.step():
                done[d.req_id][0].extend(d.token_ids)
                done[d.req_id][1].extend(d.logprobs)
        return [done[f"gen-{i}"] for i in range(len(prompts))]

    def push_weights(self, named_tensors):
        for _ in named_tensors:  # gathers every tensor, as the real push does
            pass
        self.pushes += 1

    def wake(self):
        pass

    def sleep(self):
        pass

    def shutdown(self):
        pass


class FakePool:
    """RewardPool: a completion's reward is crc32(text) % 4 / 3, or with reward.funcs (fn: rewards.user.UserReward)
    fn's, run here; every call's scores are kept in `calls`."""

    def __init__(self, fn=None):
        self.calls, self.fn = [], fn

    def score(self, jobs):
        out = [self.fn(*job) if self.fn else (zlib.crc32(job[1].encode()) % 4 / 3, {"reason": "ok"}) for job in jobs]
        self.calls.append(out)
        return out

    def close(self):
        pass


@dataclass
class Update:
    """One policy_update call: its rows as they came in (old_logp, adv, weight cloned), the groups they were
    collected as, the buffered partial trajectories that collect resumed ((prompt id, sample) -> tokens they held),
    the logits (T_i, V) predicting each response token under the policy before the update (`logits`) and under the
    initial model (`ref_logits`) from a plain HF forward (float32, as float64), the stats it returned, the policy
    version before it and that policy's weights (`state`: plain tensors), and each row's old log-probs as the
    update left them (`old_after`: the ones its own forward supplied filled in)."""
    rows: list
    groups: list
    carried: dict
    logits: list
    ref_logits: list
    stats: dict = field(default_factory=dict)
    version: int = 0
    state: dict = field(default_factory=dict)
    old_after: list = field(default_factory=list)


@dataclass
class Result:
    cfg: trainer.Config
    engine: FakeEngine
    pool: FakePool
    updates: list = field(default_factory=list)
    metrics: list = field(default_factory=list)  # every line the run logged
    saved: dict = field(default_factory=dict)  # step -> snapshot(run, step) as its checkpoint got it
    restored: dict | None = None  # snapshot(run, step) right after a resume loaded it


@functools.lru_cache(maxsize=4)
def hf_model(path: str, role: str):
    """The plain HF model at `path` (eager attention, no FSDP), one per role ("start": as loaded; "now": its
    weights replaced before each update)."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def hf_logits(m, rows) -> list[torch.Tensor]:
    """Per row: the (T_i, V) logits that predict its response tokens, as float64 (one right-padded causal batch)."""
    seqs = [r.prompt_ids + r.response for r in rows]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    out = m(input_ids=ids).logits
    return [out[i, len(r.prompt_ids) - 1:len(s) - 1].double() for i, (r, s) in enumerate(zip(rows, seqs))]


def snapshot(run, step: int) -> dict:
    """run.state_dict(step) as {"sharded", "mine", "shared"}, copied with plain()."""
    return plain(dict(zip(("sharded", "mine", "shared"), run.state_dict(step))))


def plain(x):
    """A deep copy of state as plain tensors (FSDP's DTensors gathered), lists and dicts."""
    if isinstance(x, torch.Tensor):
        return (x.full_tensor() if hasattr(x, "full_tensor") else x).detach().clone()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def assert_same_state(got, want, where: str = "state") -> None:
    """Equal leaf by leaf (tensors exactly); the message names the first path that differs."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(got)} vs {sorted(want)}"
        for k in want:
            assert_same_state(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} vs {want!r}"[:300]
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_state(g, w, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want), \
            f"{where}: {got!r} vs {want!r}"[:300]
    else:
        assert got == want, f"{where}: {got!r} vs {want!r}"[:300]


def run_args(tiny: Path, run_dir: Path, *extra) -> list[str]:
    """A small RL job: 2 groups of 4 per step, 6 requests in flight (some trajectories stay partial)."""
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            f"--run_dir={run_dir}", "--steps=1", "--save_every=1", "--n_samples=4", "--batch_groups=2",
            "--copris.concurrency=6", "--max_prompt_len=64", "--max_response_len=12", "--token_budget=512",
            "--lr=1e-2", "--chat_template=false", *extra]


def train(argv: list[str], state: bool = False, score=None) -> Result:
    """trainer.train_rl / train_sft (the config's mode) on `argv` with the fakes, recording every update; state:
    record the saved and restored states too (else checkpoints are not written); score: the pool's job function
    (row, completion, ctx) -> (score, info) in place of FakePool's."""
    cfg = trainer.load_config(argv, world=1)
    user = cfg.reward.funcs and UserReward(parse(cfg.reward.funcs, cfg.reward.weights))
    res = Result(cfg, FakeEngine(), FakePool(score or user or None))
    real_update, real_save, real_resume = trainer.policy_update, trainer.save_checkpoint, trainer.resume_or_start

    def policy_update(run, rows):
        now = hf_model(cfg.model_path, "now")
        missing, unexpected = now.load_state_dict(dict(model.full_named_tensors(run.policy)), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied: the embedding
        u = Update([model.Row(r.prompt_ids, r.response, r.old_logp.clone(), r.adv.clone(),
                              None if r.weight is None else r.weight.clone(), r.fresh, r.mask) for r in rows],
                   run.scheduler.last, run.scheduler.carried, hf_logits(now, rows),
                   hf_logits(hf_model(cfg.model_path, "start"), rows), version=run.policy_version,
                   state={k: v.clone() for k, v in now.state_dict().items()})
        u.stats = real_update(run, rows)
        u.old_after = [r.old_logp.clone() for r in rows]
        res.updates.append(u)
        return u.stats

    def save_checkpoint(run, step):
        res.saved[step] = snapshot(run, step)
        return real_save(run, step)

    def resume_or_start(run, ckpt, step0):
        out = real_resume(run, ckpt, step0)
        if ckpt is not None:
            res.restored = snapshot(run, out)
        return out

    class Scheduler(trainer.CoprisScheduler):  # keeps what its last collect resumed and returned
        def collect(self, *a, **kw):
            self.carried = {(t.prompt_id, t.sample): len(t.tokens) for g in self.buffer for t in g.samples
                            if t.tokens and not t.finished}
            groups, stats = super().collect(*a, **kw)
            self.last = groups
            return groups, stats

    patches = {"init_distributed": lambda timeout: (0, 1, torch.device("cpu")), "start_engine": lambda run: res.engine,
               "reward_pool": lambda cfg: res.pool, "export": lambda run: None, "policy_update": policy_update,
               "save_checkpoint": save_checkpoint if state else lambda run, step: None,
               "resume_or_start": resume_or_start, "CoprisScheduler": Scheduler,
               "log": lambda run, m: res.metrics.append(m)}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in patches.items():
            mp.setattr(trainer, name, value)
        mp.setattr(trainer.report, "setup_logging", lambda run_dir, rank: None)
        mp.setattr(trainer.report, "report_rl", lambda *a: None)
        {"rl": trainer.train_rl, "sft": trainer.train_sft}[cfg.mode](cfg)
    return res


def advantages_fp64(cfg: trainer.Config, rewards: list[float]) -> list[float]:
    """GRPO ((r - mean) / (std + 1e-6) with the group's unbiased std, the whole batch's, or no division: scale_std)
    or RLOO (r - mean of the others) per sample, groups of n_samples consecutive."""
    n, out = cfg.n_samples, []
    batch_mean = sum(rewards) / len(rewards)
    batch_std = math.sqrt(sum((x - batch_mean) ** 2 for x in rewards) / (len(rewards) - 1))
    for g in range(0, len(rewards), n):
        r = rewards[g:g + n]
        mean = sum(r) / n
        std = {"group": math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1)), "batch": batch_std}.get(cfg.scale_std)
        for x in r:
            if cfg.advantage == "rloo":
                out.append(x - (sum(r) - x) / (n - 1))
            else:
                out.append(x - mean if std is None else (x - mean) / (std + 1e-6))
    return out

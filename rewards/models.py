"""Learned reward models (reward.models; docs/data.md, "Reward models"): Hugging Face sequence-classification
folders with a scalar head, scoring the step's samples on every rank after the rollout.

    reward:
      models: [rm/helpful, rm/short]     # local folders: config.json (a *ForSequenceClassification, num_labels 1),
      model_weights: [1.0, 0.2]          # weights, tokenizer; one weight each ([] = 1 each)
      models_normalize: false            # true: each model's scores standardised over the step (every rank)
      models_shard: false                # true: FSDP2-sharded over the ranks, not a full replica on each

    rms = RewardModels(cfg.reward, device, compute, token_budget)   # compute: the run's dtype (CPU)
    rewards, metrics = rms(groups, rewards, text_of)   # rewards (B,) + sum_j w_j s_j; g.scores updated to match
    per, metrics = rms.held_out(pairs)                 # evaluation: raw scores of held-out (prompt, completion)s

A sample's input is (prompt, response) in the RM's own format: its tokenizer's chat template over
[{"role": "user", "content": prompt}, {"role": "assistant", "content": response}] (a chat prompt: its messages,
then the response), else prompt + response; cut to the model's last max_position_embeddings tokens. The score
s_j is the head's output at the last token that is not the pad token (transformers' own pooling; the pad token is
the tokenizer's, else its eos). Each rank scores its own trained samples with a full replica (no collective in the
forward), or with models_shard an FSDP2 module holding 1/world of the weights (its forwards gather them: every rank
runs the same number, padded with one-token forwards), in bf16 on CUDA and the run's compute dtype on CPU, batched
to token_budget padded tokens.
"""
import json
import math
from pathlib import Path

import torch

from config import ConfigError
from model import all_max, all_sum

NORM_EPS = 1e-6  # (s - mean) / (std + eps) with reward.models_normalize
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def names(paths: list[str]) -> list[str]:
    """Each model's name in metrics (reward/<name>): its folder's name, the parent's first if two collide."""
    short = [Path(p).name for p in paths]
    return [n if short.count(n) == 1 else f"{Path(p).parent.name}.{n}" for p, n in zip(paths, short)]


def check(cfg) -> None:
    """reward.models at start (the launcher's config check and every rank's): each folder is a sequence-classification
    model with one label and a tokenizer that formats a conversation; weights match; no combination that cannot
    work. A problem is a ConfigError (one line, exit 2)."""
    r = cfg.reward
    if r.model_weights and len(r.model_weights) != len(r.models):
        raise ConfigError(f"reward.model_weights has {len(r.model_weights)} values for {len(r.models)} reward.models")
    if not all(math.isfinite(w) for w in r.model_weights):
        raise ConfigError(f"reward.model_weights must be finite numbers, got {r.model_weights}")
    if not r.models:
        return
    if cfg.prime.enabled or cfg.copris.dynamic_sampling:
        raise ConfigError("reward.models with prime.enabled or copris.dynamic_sampling: their group filters score "
                          "groups inside the rollout, per engine, while the reward models score in lockstep on every "
                          "rank after it (and PRIME's PRM learns from outcomes in [0, 1]): turn those off")
    clash = set(names(r.models)) & {f.rpartition(":")[2] for f in r.funcs}
    if len(set(names(r.models))) < len(r.models) or clash:
        raise ConfigError(f"reward.models: two reward components would be logged as the same reward/<name> "
                          f"({sorted(clash) or r.models}): rename a folder")
    for path in r.models:
        check_folder(path)


def check_folder(path: str) -> None:
    """One reward.models folder: config.json of a *ForSequenceClassification with num_labels 1, a tokenizer that
    loads and formats (prompt, response)."""
    where = f"reward.models {path!r}"
    if not Path(path).is_dir():
        raise ConfigError(f"{where}: no such folder")
    try:
        c = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise ConfigError(f"{where}: no config.json there (not a local HF model folder)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: config.json is not valid JSON ({e})") from None
    arch = c.get("architectures") or []
    labels = c.get("num_labels", len(c.get("id2label") or {}) or 2)  # transformers' default: 2
    if not any(a.endswith("ForSequenceClassification") for a in arch) or labels != 1:
        raise ConfigError(f"{where}: not a reward model (architectures {arch}, num_labels {labels}): expected a "
                          f"*ForSequenceClassification with num_labels 1 (a scalar head)")
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{where}: no tokenizer files there (one of {', '.join(TOKENIZER_FILES)})")
    try:
        tok = tokenizer(path)
        encode(tok, "1 + 1 =", "2", 8)
    except Exception as e:  # transformers' and jinja's errors alike: the conversation cannot be formatted
        raise ConfigError(f"{where}: its tokenizer cannot format (prompt, response) ({type(e).__name__}: "
                          f"{str(e)[:200]})") from None


def tokenizer(path: str):
    """The RM's tokenizer, with a pad token (its eos when it has none: padding is at the right and the score is read
    at the last non-pad token)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ValueError("it has neither a pad nor an eos token to pad a batch with")
        tok.pad_token = tok.eos_token
    return tok


def encode(tok, prompt, response: str, max_len: int) -> tuple[list[int], bool]:
    """(prompt: text or chat messages, response) -> (token ids, cut): the chat template's rendering of the
    conversation, else prompt + response (chat messages' contents joined by newlines); over max_len tokens the
    first ones are cut (the score is read at the end)."""
    if tok.chat_template:
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
    else:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        ids = tok(text + response)["input_ids"]
    return ids[-max_len:], len(ids) > max_len


def shard(model, device):
    """FSDP2 over every rank (model._no_split_modules' blocks, e.g. the decoder layers, then the root): each rank keeps
    1/world of the weights on the device; a forward gathers them block by block."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for m in list(model.modules()):
        if type(m).__name__ in blocks:
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class RewardModels:
    """The run's reward models, frozen, kept on the device between steps: one full replica each per rank, or
    (models_shard) FSDP2-sharded over the ranks."""

    def __init__(self, rc, device, compute: torch.dtype, token_budget: int):
        from transformers import AutoModelForSequenceClassification
        dtype = torch.bfloat16 if device.type == "cuda" else compute
        self.paths, self.device, self.budget, self.normalize = rc.models, device, token_budget, rc.models_normalize
        self.weights, self.names = rc.model_weights or [1.0] * len(rc.models), names(rc.models)
        self.toks = [tokenizer(p) for p in rc.models]
        self.shard = rc.models_shard
        self.models = []
        for p, tok in zip(rc.models, self.toks):
            m = AutoModelForSequenceClassification.from_pretrained(p, dtype=dtype).eval()
            m.requires_grad_(False)
            m.config.get_text_config().pad_token_id = tok.pad_token_id  # the pooling's last non-pad token
            self.models.append(shard(m, device) if self.shard else m.to(device))

    @torch.no_grad()
    def score(self, j: int, pairs: list[tuple]) -> tuple[torch.Tensor, int]:
        """Model j's scores of (prompt, response) pairs -> ((n,) float32 on the CPU, inputs cut), batched by length
        to at most token_budget padded tokens a forward."""
        tok, model = self.toks[j], self.models[j]
        max_len = getattr(model.config.get_text_config(), "max_position_embeddings", None) or tok.model_max_length
        enc = [encode(tok, p, r, max_len) for p, r in pairs]
        order = sorted(range(len(enc)), key=lambda i: len(enc[i][0]))
        batches, i = [], 0
        while i < len(order):
            n = 1
            while i + n < len(order) and (n + 1) * len(enc[order[i + n]][0]) <= self.budget:
                n += 1
            batches.append(order[i:i + n])
            i += n
        if self.shard:  # FSDP2's gathers: the same number of forwards on every rank
            batches += [[]] * (all_max(len(batches), self.device) - len(batches))
        out = torch.zeros(len(enc))
        for idx in batches:
            ids = [enc[k][0] for k in idx] or [[tok.pad_token_id]]  # an empty batch: one pad token, score unused
            batch = tok.pad({"input_ids": ids}, padding_side="right", return_tensors="pt")
            logits = model(**{k: v.to(self.device) for k, v in batch.items()}).logits  # (n, 1)
            out[idx] = logits[:len(idx), 0].float().cpu()
        return out, sum(cut for _, cut in enc)

    def held_out(self, pairs: list[tuple]) -> tuple[list[dict], dict]:
        """Held-out completions as (prompt, response) -> (per completion {name: raw score}, eval/reward/<name>: each
        model's mean raw score over every rank's completions). Every rank calls it (the sums are collectives)."""
        per, out = [{} for _ in pairs], {}
        for j, name in enumerate(self.names):
            s, _ = self.score(j, pairs)
            for d, x in zip(per, s.tolist()):
                d[name] = x
            total, n = all_sum([float(s.sum()), len(s)], self.device)
            out[f"eval/reward/{name}"] = total / max(n, 1.0)
        return per, out

    def __call__(self, groups: list, rewards: torch.Tensor, text_of) -> tuple[torch.Tensor, dict]:
        """rewards (B,) of the step's samples in group order (text_of(trajectory): the response) -> (rewards +
        sum_j w_j s_j, metrics reward/<name>: mean raw s_j over every rank's samples, reward_models/truncated: inputs
        cut); each g.scores entry gets the same total, its info's components each s_j. models_normalize:
        s_j := (s_j - mean_j) / (std_j + eps), mean and (population) std over every rank's samples."""
        pairs = [(g.row["prompt"], text_of(tr)) for g in groups for tr in g.samples]
        scores, metrics, cut = [], {}, 0.0
        for j, name in enumerate(self.names):
            s, c = self.score(j, pairs)
            total, sq, n = all_sum([float(s.sum()), float((s.double() ** 2).sum()), len(s)], self.device)
            mean, cut = total / max(n, 1.0), cut + c
            metrics[f"reward/{name}"] = mean
            std = math.sqrt(max(sq / max(n, 1.0) - mean ** 2, 0.0))
            scores.append((s - mean) / (std + NORM_EPS) if self.normalize else s)
        extra = sum(w * s for w, s in zip(self.weights, scores))  # (B,)
        flat = [(g, i) for g in groups for i in range(len(g.scores))]
        for k, (g, i) in enumerate(flat):
            sc, info = g.scores[i]
            parts = {name: float(s[k]) for name, s in zip(self.names, scores)}
            g.scores[i] = (sc + float(extra[k]), {**info, "components": {**info.get("components", {}), **parts}})
        metrics["reward_models/truncated"] = all_sum([cut], self.device)[0]
        return rewards + extra, metrics

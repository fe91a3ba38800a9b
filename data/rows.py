"""Reading training and evaluation rows: .jsonl or .parquet, our layout or verl's, normalised to one layout.

    rows = load_rows("train.jsonl", mode="rl")       # [{prompt, task, data_source, answer | tests | ...}]
    kept, skipped = tokenize_prompts(rows, tok, max_len=256, chat_template=True)   # adds row["prompt_ids"]
    source = PromptSource(kept, seed, group=g, groups=G)                          # engine group g's draws

Anything malformed (bad UTF-8, bad JSON, a missing key, an unknown task, a chat template that fails) is a
ConfigError naming file:row and the problem. Rows too long for the limits are skipped and counted, never an error.
"""
import copy
import json
import traceback
from pathlib import Path

import torch

from config import ConfigError
from tasks import TASKS

REQUIRED_KEYS = {"rl": ("prompt",), "sft": ("prompt", "completion")}


def read_records(path: str):
    """(line or row number, record) from a .jsonl or .parquet file; a bad line or file is named."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError...) for a bad file
            raise ConfigError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None
        yield from enumerate(table.to_pylist(), 1)
        return
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
            if line.strip():
                try:
                    yield lineno, json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    cut = "" if line.rstrip().endswith("}") else "; the line ends before its object does (cut off?)"
                    raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg.removesuffix(' at')} at column "
                                      f"{e.colno}{cut})") from None


def normalize_row(row, where: str, mode: str) -> dict:
    """Our layout {prompt, answer | tests | reference_code, task} or verl's {prompt: [chat messages],
    reward_model: {ground_truth}, data_source} -> ours (prompt may stay a message list); `_where` = file:row."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected an object, got {type(row).__name__}")
    if "reward_model" in row:
        rm = row["reward_model"]
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ConfigError(f"{where}: reward_model must be an object with 'ground_truth' (verl layout)")
        row = {**row, "answer": str(rm["ground_truth"])}
    task = row.get("task", "math")
    if mode == "rl" and (not isinstance(task, str) or task not in TASKS):
        raise ConfigError(f"{where}: unknown task {task!r} (one of {sorted(TASKS)})")
    for k in REQUIRED_KEYS[mode] + (TASKS[task].keys if mode == "rl" else ()):
        if k not in row:
            raise ConfigError(f"{where}: missing key {k!r}")
    prompt = row["prompt"]
    is_chat = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if not (isinstance(prompt, str) and prompt) and not is_chat:
        raise ConfigError(f"{where}: 'prompt' must be a non-empty string or a list of {{role, content}} messages")
    c = row.get("completion")
    turns = isinstance(c, list) and c and all(isinstance(t, dict) and t.get("role") in ("assistant", "tool")
                                              and isinstance(t.get("content"), str) for t in c)
    if mode == "sft" and not isinstance(c, str) and not turns:
        raise ConfigError(f"{where}: 'completion' must be a string or a list of {{role: assistant | tool, content}} "
                          f"turns (a demonstration with tool calls)")
    problem = TASKS[task].check(row) if mode == "rl" else None
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return {**row, "task": task, "data_source": str(row.get("data_source", "default")), "_where": where}


def load_rows(path: str, mode: str) -> list[dict]:
    """Rows of a .jsonl or .parquet file, normalised; a malformed row is an error naming file and row."""
    rows = [normalize_row(rec, f"{path}:{n}", mode) for n, rec in read_records(path)]
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def prompt_text(row: dict, tok, chat_template: bool) -> str:
    """A row's prompt (a string, or chat messages) as the text the model sees: through the tokenizer's chat
    template when it has one and `chat_template` is on; otherwise the messages' contents joined."""
    prompt = row["prompt"]
    if chat_template and getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # jinja's TemplateError and friends: the row's messages don't fit the template
            raise ConfigError(f"{row['_where']}: the chat template ({template_where(tok, e)}) failed on this prompt "
                              f"({type(e).__name__}: {e})") from None
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def template_where(tok, e: BaseException) -> str:
    """`file:line` of the chat template a jinja error points at: the syntax error's line, else the deepest frame of
    the rendered template (its file: chat_template_file, or the tokenizer's own)."""
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename in ("<template>", "<unknown>")]
    line = getattr(e, "lineno", None) or (lines[-1] if lines else "?")
    return f"{getattr(tok, 'template_file', None) or 'the tokenizer_config.json template'}:{line}"


def check_chat_template(cfg, rows: list[dict]) -> None:
    """The launcher's check of chat_template_file before any rank starts: it compiles (load_tokenizer) and renders
    every row's prompt; an error names the row and the template's file and line."""
    if cfg.chat_template and cfg.chat_template_file:
        tok = load_tokenizer(cfg.model_path, cfg.chat_template_file)
        for row in rows:
            prompt_text(row, tok, True)


def load_tokenizer(model_path: str, chat_template_file: str = ""):
    """model_path's tokenizer, with chat_template_file's template in place of its own when given (training,
    evaluation and the export then all use it); one that does not load or encodes nothing is a ConfigError."""
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model_path {model_path}: its tokenizer does not load ({type(e).__name__}: {e})") from None
    if chat_template_file:
        from transformers.utils.chat_template_utils import _compile_jinja_template  # how apply_chat_template compiles
        tok.chat_template, tok.template_file = Path(chat_template_file).read_text(encoding="utf-8"), chat_template_file
        try:
            _compile_jinja_template(tok.chat_template)
        except Exception as e:  # jinja's TemplateSyntaxError / TemplateAssertionError (an unknown filter)
            raise ConfigError(f"chat_template_file {template_where(tok, e)}: not a valid jinja template "
                              f"({type(e).__name__}: {e})") from None
    if not tok("a 1", add_special_tokens=False)["input_ids"] or tok.eos_token_id is None:
        raise ConfigError(f"model_path {model_path}: its tokenizer does not load (it encodes nothing or has no "
                          f"eos token: tokenizer.json / tokenizer_config.json missing?)")
    return tok


PLAIN_TEMPLATE = Path(__file__).resolve().parents[1] / "rollout" / "plain_tools.jinja"


def serving_tokenizer(tok, chat_template: bool):
    """The tokenizer an export is saved with, so that `vllm serve` answers chat requests without --chat-template:
    `tok` when training rendered prompts with its chat template (the tokenizer's own or chat_template_file), else a
    copy carrying rollout/plain_tools.jinja, which lays a conversation out as training did without a template (the
    prompt as is; tool calls and answers in the plain-text form of rollout/environments.py)."""
    if chat_template and getattr(tok, "chat_template", None):
        return tok
    plain = copy.copy(tok)
    plain.chat_template = PLAIN_TEMPLATE.read_text(encoding="utf-8")
    return plain


def tokenize_prompts(rows: list[dict], tok, max_len: int, chat_template: bool) -> tuple[list[dict], int]:
    """Adds row['prompt_ids']; drops rows whose prompt is empty or over max_len tokens. -> (kept, skipped)."""
    kept = []
    for row in rows:
        ids = tok(prompt_text(row, tok, chat_template), add_special_tokens=False)["input_ids"]
        if 0 < len(ids) <= max_len:
            kept.append({**row, "prompt_ids": ids})
    return kept, len(rows) - len(kept)


def tokenize_sft(rows: list[dict], tok, max_prompt_len: int, max_response_len: int, chat_template: bool,
                 observation=None) -> tuple[list[tuple[list[int], list[int], list[bool] | None]], int]:
    """(prompt ids, completion ids + eos, mask) per row that fits the limits -> (triples, skipped). A completion given
    as turns (a demonstration with tool calls) is tokenized turn by turn, each tool turn through observation(text) ->
    ids (rollout/environments.Observations: the ids an episode appends), and mask marks the assistant's tokens (the
    only ones trained on); a plain completion has mask None."""
    out = []
    for r in rows:
        p = tok(prompt_text(r, tok, chat_template), add_special_tokens=False)["input_ids"]
        c, mask = [], []
        turns = r["completion"] if isinstance(r["completion"], list) else [{"role": "assistant", "content": r["completion"]}]
        for t in turns:
            ids = tok(t["content"], add_special_tokens=False)["input_ids"] if t["role"] == "assistant" else \
                observation(t["content"])
            c, mask = c + ids, mask + [t["role"] == "assistant"] * len(ids)
        c, mask = c + [tok.eos_token_id], mask + [True]
        if 0 < len(p) <= max_prompt_len and len(c) <= max_response_len:
            out.append((p, c, None if all(mask) else mask))
    return out, len(rows) - len(out)


class PromptSource:
    """Engine group g's share of a seeded per-epoch shuffle (every rank of the group draws the same prompts; with
    tensor_parallel_size 1 a group is one rank): draw() -> (prompt_id, prompt_ids, row).
    prompt_id is a unique draw number (epoch * N + index): it seeds sampling and names requests."""

    def __init__(self, rows: list[dict], seed: int, group: int, groups: int):
        self.rows, self.seed, self.group, self.groups = rows, seed, group, groups
        self.cursor = 0  # draws made by this group

    def draw(self):
        per_epoch = len(self.rows) // self.groups
        epoch, i = divmod(self.cursor, per_epoch)
        order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + epoch))
        idx = int(order[i * self.groups + self.group])
        self.cursor += 1
        row = self.rows[idx]
        return epoch * len(self.rows) + idx, row["prompt_ids"], row

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = state["cursor"]

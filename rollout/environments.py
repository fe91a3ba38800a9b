"""Multi-turn episodes: environments the policy calls tools in, the tool-call format, and observations as token ids.

A task may name an environment (tasks.py, the `env` column). Its rollouts are episodes: the model writes until it
emits the tool-call end token, the environment answers, the answer is appended as an observation and the model goes
on, until it stops without a call (eos), runs out of turns or of length. The task's scorer then scores the text the
model wrote (observations left out: a tool's output cannot earn the reward for the model).

Tool-call format (Qwen2 / Qwen2.5 chat templates and vLLM's hermes parser, so an exported model serves with
`vllm serve --enable-auto-tool-choice --tool-call-parser hermes` as it was trained):
    <tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>
answered as an observation: with the tokenizer's chat template, the ids the template renders for a `tool` message
after the assistant's turn (the assistant turn's closing text, then the tool turn, then the next assistant header),
diffed from a fixed base conversation once at start, never by re-rendering the episode; without a template (or
chat_template: false) the plain-text form  "\n<tool_response>\n{output}\n</tool_response>\n". `</tool_call>` must be
one token of the tokenizer (Qwen2/2.5's is; data/tiny_model.py --tools adds it): the engine stops on it.

    @environment("calculator")           # in this module (tool workers import it to find the class)
    class Calculator(Environment):
        tools = {"calculator": "exact arithmetic on {'expression': '12*(3+4)'}"}
        def call(self, row, name, arguments) -> str: ...           # runs in a tool worker process

Faults become observations the model reads and counted reasons, never crashes: malformed (not a call the format
allows), unknown_tool, tool_error (the tool raised), timeout, crash (the worker died), truncated (output over
max_obs_tokens, cut and said so), no_sandbox (a code tool without isolation: fails closed).

Observations are data: every text an environment returns passes observation_text (in the tool worker, and again
before it is tokenized) whatever the tool wrote into it: a str of valid UTF-8 (lone surrogates replaced), no control
characters but newline and tab, at most MAX_OBS_CHARS characters. Its ids never hold an added token (special or not:
chat markers, tool-call tokens, eos): Observations.text_ids, the one place every environment's output is tokenized.
"""
import ast
import json
import math
import operator
import re
from fractions import Fraction

from tasks import prepare_module

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_OBS_CHARS = 1 << 14  # characters of a tool's output kept before tokenizing (then max_obs_tokens applies)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # control characters, but tab and newline
_SURROGATE = re.compile("[\ud800-\udfff]")  # a str holds them, UTF-8 (and the tokenizer) does not
PLAIN_OBS = "\n<tool_response>\n{}\n</tool_response>\n"  # the plain-text observation (no chat template)
ENVIRONMENTS: dict[str, type] = {}


class ToolFault(Exception):
    """A call the environment cannot serve: reason (a metric key) and the message the model reads."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def environment(name: str):
    """Class decorator: register an Environment under `name` (the task table's env column refers to it)."""
    def register(cls):
        ENVIRONMENTS[name] = cls
        return cls
    return register


class Environment:
    """One instance per tool worker process. tools: {name: one line the model's prompt can show}; module: what its
    calls import (the worker imports it before a call's wall limit starts)."""
    tools: dict[str, str] = {}
    module: str | None = None

    def call(self, row: dict, name: str, arguments: dict) -> str:
        """The tool's output (text) for one call; raise ToolFault for a call it refuses (any other exception is
        reported as tool_error)."""
        raise NotImplementedError


def observation_text(text) -> tuple[str, bool]:
    """The text an environment returned, as the model may read it -> (text, whether it was cut): a str (anything
    else becomes its type's name), valid UTF-8 (lone surrogates -> U+FFFD), control characters but newline and tab
    removed, at most MAX_OBS_CHARS characters (the cut is said in the text)."""
    text = text if isinstance(text, str) else f"<{type(text).__name__}>"
    cut = len(text) > MAX_OBS_CHARS
    text = _CONTROL.sub("", _SURROGATE.sub("\ufffd", text[:MAX_OBS_CHARS]))
    return (text + f"\n[output truncated at {MAX_OBS_CHARS} characters]" if cut else text), cut


def parse_call(text: str) -> tuple[str, dict]:
    """The last <tool_call>{"name": str, "arguments": {...}}</tool_call> of a model segment -> (name, arguments)."""
    end = text.rfind(CALL_CLOSE)
    start = text.rfind(CALL_OPEN, 0, end if end >= 0 else None)
    if start < 0 or end < start:
        raise ToolFault("malformed", f"no {CALL_OPEN}...{CALL_CLOSE} block")
    body = text[start + len(CALL_OPEN):end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolFault("malformed", f"the tool call is not valid JSON ({e.msg} at {e.pos})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or \
            not isinstance(call.get("arguments", {}), dict):
        raise ToolFault("malformed", 'a tool call is {"name": "<tool>", "arguments": {...}}')
    return call["name"], call.get("arguments", {})


_instances: dict[str, Environment] = {}


def prepare_tool(env: str, row: dict, segment: str) -> None:
    """In a tool worker, before the call's wall limit starts (rewards/pool.py): the environment, its imports and the
    module's `prepare(row)` where it has one (the Triton reward's reference: tasks.prepare_row)."""
    instance = _instances.setdefault(env, ENVIRONMENTS[env]())
    if instance.module:
        prepare_module(instance.module, row)


def run_tool(env: str, row: dict, segment: str) -> tuple[str, dict]:
    """In a tool worker: parse the segment's call and run it -> (observation_text of the output, {"reason": ok |
    fault})."""
    try:
        name, arguments = parse_call(segment)
        instance = _instances.setdefault(env, ENVIRONMENTS[env]())
        if name not in instance.tools:
            raise ToolFault("unknown_tool", f"unknown tool {name!r} (tools: {', '.join(sorted(instance.tools))})")
        text, info = str(instance.call(row, name, arguments)), {"reason": "ok"}
    except ToolFault as e:
        text, info = f"error: {e}", {"reason": e.reason}
    except Exception as e:  # the tool's own bug or a hostile argument: the model reads it, the run goes on
        text, info = f"error: {type(e).__name__}: {str(e)[:300]}", {"reason": "tool_error"}
    return observation_text(text)[0], info


# ---------------------------------------------------------------------------------------------
# Built-in environments
# ---------------------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
MAX_EXPR_CHARS, MAX_BITS = 300, 4096  # calculator limits: expression length, size of any intermediate result


def calculate(expr: str) -> Fraction:
    """Exact arithmetic: numbers (ints, decimals), + - * / // % ** (or ^), parentheses, unary +/-. No eval: the
    expression is parsed by Python's own parser and only these node types are evaluated, on Fractions, with every
    intermediate bounded (MAX_BITS), so 9**9**9 is refused instead of computed."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ToolFault("tool_error", f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise ToolFault("tool_error", f"cannot parse {expr!r}") from None

    def ev(node) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise ToolFault("tool_error", "division by zero")
            if isinstance(node.op, ast.Pow):
                if b.denominator != 1 or abs(b) > MAX_BITS:
                    raise ToolFault("tool_error", "exponents must be integers of at most 4096")
                if a == 0 and b < 0:
                    raise ToolFault("tool_error", "division by zero")
                if abs(b) * max(a.numerator.bit_length(), a.denominator.bit_length()) > MAX_BITS:
                    raise ToolFault("tool_error", "result too large")
            out = _BINARY[type(node.op)](a, b)
            if max(out.numerator.bit_length(), out.denominator.bit_length()) > MAX_BITS:
                raise ToolFault("tool_error", "result too large")
            return out
        raise ToolFault("tool_error", f"unsupported: {type(node).__name__} (numbers and + - * / // % ** only)")
    return ev(tree)


def format_number(x: Fraction) -> str:
    """An integer as itself; otherwise the exact fraction and a 12-digit decimal."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{x.numerator}/{x.denominator} = {float(x):.12g}" if math.isfinite(float(x)) else str(x)


@environment("calculator")
class Calculator(Environment):
    tools = {"calculator": "exact arithmetic: {\"expression\": \"12*(3+4)\"} -> 84"}

    def call(self, row, name, arguments):
        expr = arguments.get("expression")
        if not isinstance(expr, str):
            raise ToolFault("malformed", 'calculator takes {"expression": "<arithmetic>"}')
        return format_number(calculate(expr))


@environment("python")
class PythonTool(Environment):
    """Runs the model's code in the reward sandbox (rewards/sandbox.py); fails closed without its isolation."""
    tools = {"python": "run Python 3 code: {\"code\": \"print(2**10)\"} -> stdout and stderr"}
    module = "rewards.sandbox"
    timeout_s, mem_mb = 10.0, 1024

    def call(self, row, name, arguments):
        from rewards.sandbox import refusal, run_python
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolFault("malformed", 'python takes {"code": "<python source>"}')
        problem = refusal()
        if problem:
            raise ToolFault("no_sandbox", f"the python tool is unavailable here ({problem})")
        res = run_python(code, timeout_s=self.timeout_s, mem_mb=self.mem_mb, max_output=1 << 14)
        status = "" if res.status == "ok" else f"[{res.status}, exit code {res.returncode}]\n"
        return status + res.stdout + (f"\n[stderr]\n{res.stderr}" if res.stderr else "")


@environment("triton_refine")
class TritonRefine(Environment):
    """AutoTriton, multi-turn: the model submits a kernel to `test_kernel`; the answer is the reward's verdict and
    what a developer could see without the hidden data: the reason code and the reward's `public` detail (the
    linter's and the harness's own messages, shapes and dtypes, a candidate's error only from before its inputs
    existed), never anything the candidate printed or raised while it had the inputs, never the inputs, expected
    outputs or errors computed from them. The task's reward scores the final answer's kernel as in the single-turn
    setup."""
    tools = {"test_kernel": "check a Triton kernel: {\"code\": \"<python source with @triton.jit>\"} -> ok or what "
                            "failed (lint, compile, wrong output, crash, timeout)"}
    module = "rewards.triton.kernel"

    def call(self, row, name, arguments):
        from rewards.triton.kernel import triton_reward
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolFault("malformed", 'test_kernel takes {"code": "<python source>"}')
        score, info = triton_reward(f"```python\n{code}\n```", row)
        if score == 1.0:
            return "ok: the kernel passes the linter and matches the reference on every test input"
        return f"failed: {info['reason']}" + (f": {info['public'][:400]}" if info["public"] else "")


# ---------------------------------------------------------------------------------------------
# Observations as token ids (the parent process: it holds the tokenizer)
# ---------------------------------------------------------------------------------------------

class TemplateError(ValueError):
    """The chat template cannot render tool turns by appending (the message says why and what to set)."""


_MARK = "MARKER_7f3a"


def chat_observation_frame(tok) -> tuple[str, str]:
    """(before, after): an observation is before + output + after, read off the chat template by rendering a fixed
    base conversation with and without a tool message and diffing. Raises TemplateError when the template is not
    prefix-preserving: an earlier turn's rendering changes when a turn is added (Qwen3's template strips earlier
    <think> blocks), so the ids the engine saw would not be the ones trained on."""
    call = f'{CALL_OPEN}{{"name": "calculator", "arguments": {{"expression": "1+1"}}}}{CALL_CLOSE}'
    conv = [{"role": "user", "content": "u1"},
            {"role": "assistant", "content": f"<think>r1</think>a1 {call}"},
            {"role": "tool", "content": "t1"},
            {"role": "assistant", "content": f"<think>r2</think>a2 {call}"},
            {"role": "tool", "content": "t2"},
            {"role": "assistant", "content": "<think>r3</think>a3"}]

    def render(msgs, gen):
        try:
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        except Exception as e:  # jinja errors: a template without tool messages
            raise TemplateError(f"the chat template cannot render tool messages ({type(e).__name__}: {e})") from None
    for k in range(2, len(conv)):
        a, b = render(conv[:k], False), render(conv[:k + 1], False)
        if not b.startswith(a):
            raise TemplateError(f"the chat template rewrites earlier turns when a turn is added (rendering {k} "
                                f"messages is not a prefix of rendering {k + 1}): episodes would train on tokens "
                                f"the engine never saw; set chat_template: false for the plain-text tool form")
    asst = render([conv[0], {"role": "assistant", "content": _MARK}], False)
    close = asst[asst.rindex(_MARK) + len(_MARK):]  # the assistant turn's end (e.g. <|im_end|>\n)
    with_tool = render([conv[0], {"role": "assistant", "content": _MARK}, {"role": "tool", "content": _MARK}], True)
    if not with_tool.startswith(asst):
        raise TemplateError("the chat template renders an assistant turn differently once a tool turn follows")
    tail = with_tool[len(asst):]
    i = tail.index(_MARK)
    return close + tail[:i], tail[i + len(_MARK):]


class Observations:
    """Renders a tool's output as the ids appended to an episode: tokenized once, never re-encoding model tokens.
    max_tokens caps the output's own tokens (the rest is cut and the model is told)."""

    def __init__(self, tok, chat_template: bool, max_tokens: int):
        self.tok, self.max_tokens = tok, max_tokens
        ids = tok(CALL_CLOSE, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise TemplateError(f"the tokenizer encodes {CALL_CLOSE} as {len(ids)} tokens: environments need it as "
                                f"one token the engine can stop on (Qwen2/2.5 tokenizers have it; add it as a "
                                f"special token, as data/tiny_model.py --tools does)")
        self.call_end = ids[0]
        if chat_template and getattr(tok, "chat_template", None):
            self.before, self.after = chat_observation_frame(tok)
        else:
            self.before, self.after = PLAIN_OBS.split("{}")
        self.frame = [tok(t, add_special_tokens=False)["input_ids"] for t in (self.before, self.after)]
        added = sorted(tok.get_added_vocab(), key=len, reverse=True)      # longest first: one match per place
        self.controls = re.compile("|".join(map(re.escape, added)) if added else "(?!)")

    def ids(self, output) -> tuple[list[int], bool]:
        """observation_text(output) as ids -> (observation ids, truncated): the frame's ids (its special tokens are
        the template's), then the output's as text only (text_ids)."""
        output, cut_chars = observation_text(output)
        out = self.text_ids(output)
        cut = len(out) > self.max_tokens
        if cut:
            out = self.text_ids(self.tok.decode(out[:self.max_tokens]) + f"\n[output truncated: "
                                f"{len(out) - self.max_tokens} more tokens not shown]")
        return self.frame[0] + out + self.frame[1], cut or cut_chars

    def text_ids(self, text: str) -> list[int]:
        """text as ids of which none is an added token (special or not: <|im_start|>, </tool_call>, eos): each
        place where the text spells one is tokenized a character at a time, the text between as usual. So what a
        tool prints reads as the same text but can never forge a turn, a call or a stop."""
        ids, at = [], 0
        for m in self.controls.finditer(text):
            ids += self._plain(text[at:m.start()]) + [i for ch in m.group() for i in self._plain(ch)]
            at = m.end()
        return ids + self._plain(text[at:])

    def _plain(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []


class Episodes:
    """What the CoPRIS scheduler needs for multi-turn rows: each row's environment, the call-end token, tool calls
    run in worker processes (rewards/pool.py: a per-call wall limit, a crashed or hung worker replaced), answers as
    observation ids.

        episodes = Episodes(tok, chat_template, env_of, max_turns=4, max_obs_tokens=256, tool_steps=1, ...)
        ticket = episodes.submit(env, row, segment_ids)     # the model's segment, ending in </tool_call>
        ids, reason = episodes.result(ticket)               # blocks until that call is done
    """

    def __init__(self, tok, chat_template: bool, env_of, max_turns: int, max_obs_tokens: int, tool_steps: int,
                 timeout_s: float, workers: int, call_end: int | None = None, tool_fn=None):
        from rewards.pool import RewardPool
        self.tok, self.env_of, self.max_turns, self.tool_steps = tok, env_of, max_turns, tool_steps
        self.obs = Observations(tok, chat_template, max_obs_tokens)
        self.call_end = self.obs.call_end if call_end is None else call_end  # tests may stop on another token
        self.timeout_s = timeout_s
        self.pool = RewardPool(workers, timeout_s, fn=tool_fn or run_tool,  # tool_fn: importable where workers run
                               prepare=None if tool_fn else prepare_tool)

    def submit(self, env: str, row: dict, segment: list[int]) -> int:
        return self.pool.submit((env, row, self.tok.decode(segment)))

    def result(self, ticket: int) -> tuple[list[int], str]:
        out, info = self.pool.result(ticket)
        reason = info["reason"]
        if not isinstance(out, str):  # the pool's own verdicts: the worker timed out or died
            out = {"timeout": f"error: the tool did not answer within {self.timeout_s:g} s",
                   "crash": "error: the tool crashed"}.get(reason, f"error: {reason}")
        ids, cut = self.obs.ids(out)
        return ids, ("truncated" if cut and reason == "ok" else reason)

    def discard(self, ticket: int) -> None:
        self.pool.discard(ticket)

    def close(self) -> None:
        self.pool.close()

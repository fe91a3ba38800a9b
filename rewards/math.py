"""Math answer reward: the last \\boxed{...} (or \\fbox{...}, \\boxed 5) of the completion, checked with math-verify.

score, info = math_reward(completion, answer)   # score in {0.0, 1.0}
info["reason"]: ok | wrong | no_answer | too_long | timeout | error | bad_answer
(bad_answer: the row's gold answer does not parse, a data problem; `answer` may be a number, as in GSM8K-style rows)

Hostile text is cheap to reject: only the last \\boxed{} is extracted (a linear scan, bounded by
MAX_ANSWER_CHARS and MAX_DEPTH), so a huge or deeply nested completion returns promptly; the parse
and the comparison each run under math-verify's own timeout (a SIGALRM, main thread only). The
reward pool adds a hard per-sample wall limit on top (rewards/pool.py).
"""
import functools
import re
import threading

from math_verify import parse, verify
from math_verify.errors import TimeoutException
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

MAX_ANSWER_CHARS = 256  # longer boxed content is scored 0 as too_long
MAX_DEPTH = 8  # bracket nesting ({[ inside \boxed{}: sympy slows down steeply past it
TIMEOUT_S = 2  # math-verify's parse and verify limits
_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")  # \boxed or \fbox, not \boxedfoo
_BARE = re.compile(r"\s{0,16}([^\s${}\\]{1,%d})" % (MAX_ANSWER_CHARS + 1))  # \boxed 5: the next token


def last_boxed(text: str) -> tuple[str | None, str]:
    """Content of the last \\boxed{...} / \\fbox{...} (or \\boxed 5, brace-less) and a reason: ok | no_answer |
    too_long. A linear scan from the last box, bounded by MAX_ANSWER_CHARS and MAX_DEPTH."""
    pos = len(text)
    while True:  # the last \\boxed / \\fbox that is that command (not \\boxedfoo)
        pos = max(text.rfind("\\boxed", 0, pos), text.rfind("\\fbox", 0, pos))
        if pos < 0:
            return None, "no_answer"
        m = _BOX.match(text, pos)
        if m:
            start = m.end()
            break
    if text[start:start + 1] != "{":
        m = _BARE.match(text, start)
        if m and len(m.group(1)) > MAX_ANSWER_CHARS:
            return None, "too_long"
        bare = m.group(1).rstrip(".,;:") if m else ""
        return (bare, "ok") if bare else (None, "no_answer")
    i, depth, brackets = start + 1, 1, 0
    end = min(len(text), i + MAX_ANSWER_CHARS + 1)
    for j in range(i, end):
        ch = text[j]
        if ch in "({[":
            depth += ch == "{"
            brackets += 1
            if brackets > MAX_DEPTH:
                return None, "too_long"
        elif ch in ")}]":
            brackets -= 1
            depth -= ch == "}"
            if depth == 0:
                return text[i:j], "ok"
    return None, ("too_long" if end - i > MAX_ANSWER_CHARS else "no_answer")


@functools.lru_cache(maxsize=4096)
def gold(answer: str, timeout) -> list:
    """math-verify's parse of a gold answer, cached (a group's samples share it; sympy expressions are immutable)."""
    return parse(f"${answer}$", _CONFIG, parsing_timeout=timeout, raise_on_error=True)


def math_reward(completion: str, answer: str | int | float) -> tuple[float, dict]:
    """1.0 if the last boxed answer equals `answer` (math-verify: fractions, decimals, radicals...)."""
    answer = str(answer)
    pred, reason = last_boxed(completion)
    if pred is None:
        return 0.0, {"reason": reason}
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_expr = gold(answer, timeout)
        if not gold_expr:
            return 0.0, {"reason": "bad_answer", "pred": pred, "error": f"the row's answer {answer[:80]!r} does not parse"}
        if pred.strip() == answer.strip():  # the gold answer's own text: no second parse needed
            return 1.0, {"reason": "ok", "pred": pred}
        pred_expr = parse(f"${pred}$", _CONFIG, parsing_timeout=timeout, raise_on_error=True)
        ok = bool(pred_expr) and verify(list(gold_expr), pred_expr, timeout_seconds=timeout, raise_on_error=True)
    except (TimeoutError, TimeoutException):
        return 0.0, {"reason": "timeout", "pred": pred}
    except Exception as e:  # a verifier failure on model output is scored, never raised
        return 0.0, {"reason": "error", "pred": pred, "error": f"{type(e).__name__}: {e}"[:200]}
    return (1.0, {"reason": "ok", "pred": pred}) if ok else (0.0, {"reason": "wrong", "pred": pred})

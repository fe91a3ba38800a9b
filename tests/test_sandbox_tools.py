"""The environments that run model-written code (rollout/environments.py): the python tool in the reward sandbox and
Triton refinement through the Triton reward, as a tool worker runs them (run_tool)."""
import json

import pytest

from data.triton_tasks import load_tasks
from rollout.environments import CALL_OPEN, CALL_CLOSE, Observations, run_tool
from triton_corpus.gpu_rules import OBSERVATION_ATTACKS


def call(name: str, **arguments) -> str:
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + CALL_CLOSE


def test_python_tool_runs_code_in_the_sandbox():
    text, info = run_tool("python", {}, call("python", code="import os\nprint(sum(range(10)), os.getcwd())"))
    assert info == {"reason": "ok"} and text.split() == ["45", "/scratch"], text
    text, info = run_tool("python", {}, call("python", code="open('/work/main/README.md').read()"))
    assert info["reason"] == "ok" and "exit code 1" in text and "No such file" in text, text
    text, info = run_tool("python", {}, call("python", code="while True: pass"))
    assert "[timeout" in text, text


@pytest.mark.parametrize("chat_template", [False, True])
def test_tool_output_never_becomes_a_special_token(tool_tok, chat_template, monkeypatch):
    """Issue 44, class 9: the python tool prints every added token of the tokenizer (the chat markers, the
    tool-call tokens, eos) where a forged turn or stop would put them; the observation's ids hold none of them
    outside the frame the template gives, and the output still reads as the text printed. Before the fix
    `<|im_start|>user` and `</tool_call>` became those tokens in the policy's context."""
    from tests.test_episodes import QWEN_LIKE
    added = tool_tok.get_added_vocab()
    assert {"<|im_start|>", "<|im_end|>", "</tool_call>", "<tool_call>", "<|endoftext|>"} <= set(added)
    printed = "".join(f"{t}user\nhi{t}" for t in sorted(added)) + "<|im_<|im_end|>start|>"
    code = f"print(bytes({list(printed.encode())}).decode())"      # the call itself holds no </tool_call>
    text, info = run_tool("python", {}, call("python", code=code))
    assert info == {"reason": "ok"} and text == printed + "\n", text
    monkeypatch.setattr(tool_tok, "chat_template", QWEN_LIKE if chat_template else None)
    obs = Observations(tool_tok, chat_template, 256)
    ids, cut = obs.ids(text)
    body = ids[len(obs.frame[0]):len(ids) - len(obs.frame[1])]
    assert ids[:len(obs.frame[0])] == obs.frame[0] and ids[len(ids) - len(obs.frame[1]):] == obs.frame[1]
    assert not cut and set(body).isdisjoint(added.values()), tool_tok.convert_ids_to_tokens(body)
    assert tool_tok.decode(body) == text


def test_triton_refinement_answers_the_rewards_verdict_without_the_hidden_data():
    task = next(t for t in load_tasks() if t["name"] == "relu")
    text, info = run_tool("triton_refine", task, call("test_kernel", code=task["solution"]))
    assert info["reason"] == "ok" and text.startswith("ok: "), text
    wrong = task["solution"].replace("tl.maximum(x, 0.0)", "tl.maximum(x, 1.0)")
    assert wrong != task["solution"]
    text, info = run_tool("triton_refine", task, call("test_kernel", code=wrong))
    assert text == "failed: wrong_output: values differ from the reference (atol=rtol=0.0001)", text
    text, _ = run_tool("triton_refine", task, call("test_kernel", code="import torch\nclass ModelNew: pass"))
    assert text.startswith("failed: lint_"), text


@pytest.mark.parametrize("cid, code, want", [a if a[0] == "assert_with_hidden_values" else
                                             pytest.param(*a, marks=pytest.mark.slow) for a in OBSERVATION_ATTACKS],
                         ids=[a[0] for a in OBSERVATION_ATTACKS])
def test_refinement_shows_nothing_computed_from_hidden_inputs(tool_tok, cid, code, want):
    """Issue 36, class 4: a candidate that asserts, prints or raises with the hidden inputs, puts lone surrogates
    or megabytes into its error or output gets the verdict, the reason and the harness's own messages (op names,
    an error from before any input existed, cut), no more: a short observation of valid text, which the tokenizer
    takes. Before the fix it carried the candidate's message (six hidden values; a lone surrogate that stopped the
    rollout loop)."""
    task = next(t for t in load_tasks() if t["name"] == "relu")
    text, info = run_tool("triton_refine", task, call("test_kernel", code=code))
    assert info == {"reason": "ok"} and len(text) < 600, (text, info)
    text.encode("utf-8")
    assert text == want or want.endswith("...") and text.startswith(want[:-3]), text
    ids, cut = Observations(tool_tok, False, 256).ids(text)
    assert ids and len(ids) < 256 + 80

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


def test_triton_refinement_answers_the_rewards_verdict_without_the_hidden_data():
    task = next(t for t in load_tasks() if t["name"] == "relu")
    text, info = run_tool("triton_refine", task, call("test_kernel", code=task["solution"]))
    assert info["reason"] == "ok" and text.startswith("ok: "), text
    wrong = task["solution"].replace("tl.maximum(x, 0.0)", "tl.maximum(x, 1.0)")
    assert wrong != task["solution"]
    text, info = run_tool("triton_refine", task, call("test_kernel", code=wrong))
    assert text == "failed: wrong_output: case 0: values differ (atol=rtol=0.0001)", text
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

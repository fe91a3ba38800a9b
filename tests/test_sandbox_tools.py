"""The environments that run model-written code (rollout/environments.py): the python tool in the reward sandbox and
Triton refinement through the Triton reward, as a tool worker runs them (run_tool)."""
import json

from data.triton_tasks import load_tasks
from rollout.environments import CALL_OPEN, CALL_CLOSE, run_tool


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
    assert text == "failed: wrong_output", text
    text, _ = run_tool("triton_refine", task, call("test_kernel", code="import torch\nclass ModelNew: pass"))
    assert text.startswith("failed: lint_"), text

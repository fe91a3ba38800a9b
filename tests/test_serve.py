"""Serving an export with tool calls, as docs/tools.md says: its server command (vLLM's OpenAI server in module form,
the hermes parser, rollout/plain_tools.jinja for a model trained on the plain-text tool form) and its request, run
as written on a tiny model trained to call the calculator; the reply carries the parsed call. The template lays a
conversation out exactly as the episodes did in training."""
import json
import re
import shlex
import sys

import pytest

from helpers import ROOT, openai_server, post
from rollout.environments import PLAIN_OBS

TEMPLATE = (ROOT / "rollout" / "plain_tools.jinja").read_text()


def documented() -> tuple[list[str], dict]:
    """docs/tools.md's serving section: (the server command's words, the chat request's JSON body)."""
    block = (ROOT / "docs" / "tools.md").read_text().split("## Serving the export", 1)[1].split("```")[1]
    server, curl = block.replace("\\\n", " ").strip().split("\ncurl ")
    return shlex.split(server), json.loads(re.search(r"-d '(.*)'", curl, re.S).group(1))


def test_the_template_lays_out_a_conversation_as_training_did(tool_tok):
    """prompt, the model's segment with its call, the answer as the plain-text observation, and nothing after."""
    _, body = documented()
    call = {"name": "calculator", "arguments": {"expression": "37*24+5"}}
    msgs = [*body["messages"], {"role": "assistant", "content": " ", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": "893"}]
    text = tool_tok.apply_chat_template(msgs, chat_template=TEMPLATE, tools=body["tools"], tokenize=False,
                                        add_generation_prompt=True)
    segment = f" <tool_call>{json.dumps(call)}</tool_call>"  # the layout of data.arithmetic.tool_demonstration
    assert text == body["messages"][0]["content"] + segment + PLAIN_OBS.format("893")


def taught_to_call(model_dir, out, prompt: str, completion: str):
    """The tiny model trained (plain torch, a few seconds) until its greedy continuation of prompt is completion."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    p, c = (tok(t, add_special_tokens=False)["input_ids"] for t in (prompt, completion))
    ids, labels = torch.tensor([p + c]), torch.tensor([[-100] * len(p) + c])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        out_ids = model.generate(torch.tensor([p]), max_new_tokens=len(c), do_sample=False)[0, len(p):].tolist()
        if out_ids == c:
            break
    assert out_ids == c, tok.decode(out_ids)
    model.save_pretrained(out)
    tok.save_pretrained(out)


@pytest.mark.slow  # about a minute: the server starts an engine
def test_documented_server_returns_a_parsed_tool_call(tiny_tools, tmp_path):
    words, body = documented()
    assert words[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"], words
    prompt = body["messages"][0]["content"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*24+5"}}</tool_call>'
    taught_to_call(tiny_tools / "model", tmp_path / "export", prompt, " " + call)
    model = words[words.index("--model") + 1]
    with openai_server([sys.executable, *[str(tmp_path / "export") if w == model else w for w in words[1:]]]) as url:
        reply = post(f"{url}/v1/chat/completions", {**body, "model": str(tmp_path / "export")})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "calculator"
    assert json.loads(tool_call["function"]["arguments"]) == {"expression": "37*24+5"}

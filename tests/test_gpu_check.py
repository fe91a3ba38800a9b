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


def gvisor_run(*argv) -> dict:
    """`python tests/gvisor_proc.py ARGV`: the script under gVisor's /proc (no clear_refs, no VmHWM) -> its JSON line."""
    p = subprocess.run([sys.executable, "tests/gvisor_proc.py", *argv], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore", "CUDA_VISIBLE_DEVICES": ""}, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_probes_and_bench_step_run_on_gvisors_proc():
    """The probes and bench_step's memory readers on a /proc without clear_refs and VmHWM: they finish, and each host
    peak is either getrusage's figure or None said as "not measured", never VmHWM's."""
    probes = gvisor_run("benchmarks/gpu_probes.py", "probes", "--size", "tiny", "--vocab", "1024", "--hidden", "64")
    assert probes["weight_gradient"]["ok"] and probes["build_export"]["ok"], probes
    memory = probes["build_export"]["memory"]
    assert set(memory) == {"write", "build", "gather_bf16", "export", "logprobs"}, memory
    for m in memory.values():
        assert m["host_peak_source"].startswith("getrusage" if m["host_peak_gb"] is not None else "not measured"), m
    step = gvisor_run("benchmarks/bench_step.py", "--synthetic", "--size", "tiny", "--steps", "1", "--warmup", "0",
                      "--groups", "1", "--n_samples", "2", "--max_prompt_len", "16", "--max_response_len", "16",
                      "--threads", "1")
    for prefix in ("", "plain_"):
        rss, source = step[prefix + "peak_rss_mib"], step[prefix + "peak_rss_source"]
        assert source.startswith("getrusage") if rss is not None else source.startswith("not measured"), step
        assert rss is None or rss > 0, step


def test_peak_rss_without_clear_refs_is_getrusages_or_not_measured(monkeypatch, tmp_path):
    """host_memory.PeakRSS where clear_refs is missing and status has no VmHWM: a window's peak is ru_maxrss when that
    rose inside the window, None when it did not (the peak then lies before the window); since the process start
    it is ru_maxrss. With /proc as on Linux it is VmHWM."""
    import host_memory as HM
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  1000 kB\n")
    monkeypatch.setattr(HM, "STATUS", str(status))
    monkeypatch.setattr(HM, "CLEAR_REFS", str(tmp_path / "missing" / "clear_refs"))
    maxrss = iter([5000, 7000, 8000, 8000])
    monkeypatch.setattr(HM, "maxrss_bytes", lambda: next(maxrss) * 1024)
    rose, flat = HM.PeakRSS(), HM.PeakRSS()  # ru_maxrss 5000 then 7000 KiB at their starts
    assert rose.bytes() == 8000 * 1024 and flat.bytes() is None and rose.source.startswith("getrusage (no /proc")
    assert HM.status_bytes("VmRSS") == 1000 * 1024 and HM.status_bytes("VmHWM") is None
    monkeypatch.setattr(HM, "maxrss_bytes", lambda: 9000 * 1024)
    assert HM.PeakRSS(window=False).bytes() == 9000 * 1024
    status.write_text("VmHWM:\t  3000 kB\nVmRSS:\t  1000 kB\n")
    (tmp_path / "clear_refs").write_text("")
    monkeypatch.setattr(HM, "CLEAR_REFS", str(tmp_path / "clear_refs"))
    linux = HM.PeakRSS()
    assert linux.bytes() == 3000 * 1024 and linux.source == "VmHWM" and (tmp_path / "clear_refs").read_text() == "5"

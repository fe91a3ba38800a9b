"""benchmarks/gpu_check.sh and its probes on CPU: the weight-gradient probe tells an fp32 accumulator from a bf16 one;
the default phases fit 330 s and docs/gpu.md shows them; a failed preflight stops the check; the dry run (tiny sizes)
passes every phase, writing one summary line and one JSON line per phase and at most the four files the device tool
can bring back; the probes and bench_step's memory readers work on gVisor's /proc."""
import json
import os
import re
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


PHASES = ["preflight", "tests", "head", "step", "ckpt", "probes"]  # the default run, in priority order


def script_limits() -> dict:
    """{phase: limit in s} from gpu_check.sh's `phase NAME LIMIT ...` calls."""
    calls = re.findall(r"^\s*(?:if ! )?phase (\w+) (\d+) ", (ROOT / "benchmarks" / "gpu_check.sh").read_text(), re.M)
    return {name: int(limit) for name, limit in calls}


def test_default_phases_fit_330_s_and_docs_show_them():
    """The wheels and the default phases' limits add up to at most 330 s (a 15-minute lease less its start leaves a
    rerun); docs/gpu.md's table gives each phase its estimate and the script's limit; the head phase's chunks include
    the CUDA default at V=151936."""
    limits = script_limits()
    default = {k: limits[k] for k in ["wheels", *PHASES]}
    assert sum(default.values()) <= 330, default
    doc = (ROOT / "docs" / "gpu.md").read_text()
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^\| (\w+) \|.*\| (\d+) s \| (\d+) s \|$", doc, re.M)}
    assert {k: v[1] for k, v in rows.items() if k in default} == default, rows
    assert all(rows[k][0] < rows[k][1] for k in default), rows
    assert rows["total"] == (sum(rows[k][0] for k in default), sum(default.values())), rows
    chunks = re.search(r"--head-chunks ([\d,]+)\)", (ROOT / "benchmarks" / "gpu_check.sh").read_text())[1]
    assert str(FL.default_chunk(151936, True)) in chunks.split(","), chunks


def test_unknown_phase_and_failed_preflight_stop_the_check(tmp_path):
    """GPU_CHECK_ONLY naming no phase: exit 2 before anything runs. A preflight that fails for any reason (here:
    exit 1, as when the project does not import) stops the check: no later phase runs."""
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path / "a")], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "GPU_CHECK_ONLY": "step nonsense"}, timeout=60)
    assert p.returncode == 2 and "unknown phase 'nonsense'" in p.stderr and not (tmp_path / "a").exists(), p
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\nif [ "$2" = preflight ]; then echo "importing trainer failed"; exit 1; fi\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-dry-run", str(tmp_path / "b")], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHON": str(fake)}, timeout=60)
    summary = (tmp_path / "b" / "summary.txt").read_text()
    assert p.returncode == 1 and "preflight failed: nothing else runs" in summary, p.stdout + summary
    results = [json.loads(x) for x in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["rc"]) for r in results] == [("wheels", 0), ("preflight", 1)], results
    assert results[1]["found"] == "importing trainer failed", results


@pytest.mark.slow  # about 40 s on the 2-core machine
def test_cpu_dry_run(tmp_path):
    """Every default phase at tiny sizes on CPU: one summary line and one JSON line per phase, at most four files."""
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-dry-run", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(list(tmp_path.iterdir())) <= 4, sorted(tmp_path.iterdir())
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert [x.split(" ")[:2] for x in lines] == [[s, "rc=0"] for s in ["wheels", *PHASES]], lines
    results = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in results] == ["wheels", *PHASES] and all(r["found"] for r in results), results
    assert all(r["limit_s"] == 5 * script_limits()[r["phase"]] for r in results), results
    by = {r["phase"]: r for r in results}
    assert by["probes"]["weight_gradient"]["ok"] and by["probes"]["build_export"]["ok"], by["probes"]
    assert by["ckpt"]["checkpoint"]["rng_restored"], by["ckpt"]["checkpoint"]
    assert by["tests"]["found"].startswith("2 passed"), by["tests"]  # the ragged-chunk test in both dtypes


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
    maxrss = iter([5000, 8000, 8000, 8000])
    monkeypatch.setattr(HM, "maxrss_bytes", lambda: next(maxrss) * 1024)
    rose, flat = HM.PeakRSS(), HM.PeakRSS()  # ru_maxrss 5000 and 8000 KiB at their starts, 8000 at their ends
    assert rose.bytes() == 8000 * 1024 and flat.bytes() is None and rose.source.startswith("getrusage (no /proc")
    assert HM.status_bytes("VmRSS") == 1000 * 1024 and HM.status_bytes("VmHWM") is None
    monkeypatch.setattr(HM, "maxrss_bytes", lambda: 9000 * 1024)
    assert HM.PeakRSS(window=False).bytes() == 9000 * 1024
    status.write_text("VmHWM:\t  3000 kB\nVmRSS:\t  1000 kB\n")
    (tmp_path / "clear_refs").write_text("")
    monkeypatch.setattr(HM, "CLEAR_REFS", str(tmp_path / "clear_refs"))
    linux = HM.PeakRSS()
    assert linux.bytes() == 3000 * 1024 and linux.source == "VmHWM" and (tmp_path / "clear_refs").read_text() == "5"


@pytest.mark.slow
def test_the_triton_phase_prints_both_verdicts(tmp_path):
    """GPU_CHECK_ONLY=triton on CPU: the five candidates' checked verdicts as expected (the native run says no CUDA),
    one JSON line per candidate and the phase's line with `found`."""
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-dry-run", str(tmp_path)], cwd=ROOT,
                       env={**os.environ, "GPU_CHECK_ONLY": "triton"}, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [line] = [x for x in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines()) if x["phase"] != "wheels"]
    assert line["phase"] == "triton" and line["found"].startswith("Triton reward: 5/5 verdicts as expected"), line
    assert {v["candidate"]: v["checked"] for v in line["verdicts"]} == {
        "relu": "ok", "matmul": "ok", "max_over_garbage": "wrong_output", "load_then_store": "wrong_output",
        "total_sum_lost_updates": "race"}, line

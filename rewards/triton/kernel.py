"""AutoTriton reward: 1.0 only if the completion's code is written in the accepted language
(rewards/triton/language.py) AND matches the PyTorch reference in the sandbox; else 0.0 with a reason code.

    score, info = triton_reward(completion, task, timeout_s=60)
    task: {"name": str, "reference_code": str defining Model, get_inputs(), get_init_inputs(), ...}
    completion: model output; the code is the last ```python block (an unclosed last block counts), or the
                whole text if there is none
    info: {"reason": str, "detail": str, "public": str, "time_s": float, "not_enforced": [str],
           "max_abs_err": float, "speedup": float (CUDA only)}
           public: the part of detail that holds nothing computed from the hidden inputs (what a tool may show
           the model: the linter's and the harness's messages, shapes and dtypes, a candidate's error from
           before its inputs existed); "" where there is none

AutoTriton (SFT then GRPO): reward = is_triton(code) AND passes tests. `lint` decides is_triton; `execute` runs
the reference (once per task, device and rank: `prepare` runs it before the pool job's clock, cached) and the
candidate in two sandboxes (rewards/triton/harness.py), on inputs from seeds drawn per process and never shown to
the candidate, and compares here (torch.allclose, atol = rtol = 1e-4 fp32, 1e-2 fp16/bf16, exact for integers)
after validating every field of the result file against the reference. One verdict on every device: the checked
run, the kernels under TRITON_INTERPRET=1 with a GPU's semantics put back (rewards/triton/gpu.py: schedules,
races, bounds, visibility, garbage memory; a case as many times as its launches ask, every run must match). On a
GPU node a kernel the checked run accepts also runs natively (the native run: sm_90 compile, outputs into
garbage memory against the reference computed on the GPU, the timing and the speedup), under its own wall limit
NATIVE_TIMEOUT_S; a failure there scores 0 with reason native_<reason>.

The accepted language is described rule by rule in rewards/triton/language.py; rewards/triton/lint.py
checks it.

Reason codes, in the order they are checked:
  no_code; lint_size, lint_encoding, syntax_error, lint_try_except, lint_monkeypatch, lint_forbidden_call,
  lint_import, lint_name, lint_string, lint_source, lint_launch, lint_no_model, lint_no_kernel,
  lint_kernel_not_launched, lint_device (code that asks which device it runs on), lint_torch_op (static, or at
  run time: detail starts "runtime"; a launch the harness refused is lint_launch "runtime: launch ..."),
  gpu_compile (at run time: a launch's kernel does not compile for sm_90 with that launch's types and
  constexprs, or its grid is over CUDA's limits), out_of_bounds (at run time:
  a load, store or atomic outside the storage of every tensor argument of its launch), race (at run time: one
  program of a launch stores, or updates atomically, what another accesses without an atomic; for both, what a
  tool may show names the kernel and the argument only), deadlock (at run time: under some schedule every program
  of a launch still running waits in an atomic that no program will change; a GPU hangs); no_sandbox (no
  bwrap and no opt-out: rewards/sandbox.py); reference_error (the task's own code failed), sandbox_error; timeout,
  oom (the sandbox's memory cgroup), crash (killed by a signal, exited non-zero or wrote a malformed result),
  early_exit (exited before writing a result, or SystemExit); harness_error (CUDA did not start in the sandbox);
  compile_error (module import or Triton compilation failed), oom, runtime_error; input_mutated, wrong_output;
  then on a GPU node the native run's native_<any of the candidate's reasons above>; ok; reward_error (a failure
  of the reward itself: it never raises). tasks.NOT_SCORED: the reasons that say the reward could not look at
  the candidate (the trainer counts them as reward failures, never as a score).
"""

import contextlib
import fcntl
import hashlib
import io
import json
import math
import os
import secrets
import shutil
import threading
import time
from collections import OrderedDict

from rewards.code import extract_code
from rewards.sandbox import refusal, run_python
from rewards.triton.lint import lint
from tasks import NOT_SCORED

# (input seed, init seed) per case: drawn per process, never shown to the candidate, so neither its module
# body nor __init__ can regenerate the inputs; the init seed alone is shared (it reproduces the reference's
# parameters when ModelNew builds them in the same order)
SEEDS = tuple((secrets.randbits(31), secrets.randbits(31)) for _ in range(3))
REFERENCE_TIMEOUT_S = 120      # the task's own code: trusted to finish, run once per task, device and rank
NATIVE_TIMEOUT_S = 20.0        # the native run's wall limit (GPU node): a kernel that hangs the GPU is killed with
                               # its process well before the reward's and the tools' limits
HARNESS_FAILED = 86            # the harness's exit code when CUDA did not start in the sandbox (harness.py)
SANITIZER_FOUND = 87           # compute-sanitizer's exit code when its tool found an error (--error-exitcode)
SANITIZER_TOOLS = ("memcheck", "initcheck")     # each a native run of its own where compute-sanitizer is installed
_CHECKED = {"device": "cpu", "checked": True, "time": False}      # the verdict's run, on every device
_NATIVE = {"device": "cuda", "checked": False, "time": True}      # what a GPU node adds
# harness.py, gpu.py, memory.py and schedule.py run in the sandbox as the top-level modules triton_harness,
# triton_gpu, triton_memory and triton_schedule (unique names beside whatever torch and triton import there)
_HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
_GPU_PATH = os.path.join(os.path.dirname(_HARNESS_PATH), "gpu.py")      # the harness imports it
_SCHEDULE_PATH = os.path.join(os.path.dirname(_HARNESS_PATH), "schedule.py")    # triton_gpu imports it
_MEMORY_PATH = os.path.join(os.path.dirname(_HARNESS_PATH), "memory.py")        # triton_gpu imports it
_SCRIPT = "import triton_harness; triton_harness.main()"
_REF_CACHE_SIZE = 256
_ref_cache: "OrderedDict[tuple, tuple]" = OrderedDict()  # (reference_code, device) -> (entry, problem)
_ref_lock = threading.Lock()                              # rewards.triton.eval scores from threads

_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}   # atol = rtol by output dtype; other floats 1e-4


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sandbox(files: dict, job: dict, timeout_s: float, out: str, stdin: bytes = b"", fsize_mb: int = 64,
             wrapper: tuple = ()):
    """Run the harness for `job` with `files` in its scratch dir, files it writes (and `out` read back here) at
    most fsize_mb MiB, under `wrapper` (a sanitizer) if given. Returns (SandboxResult, bytes of `out` or None)."""
    shipped = {}
    for name, path in (("triton_harness.py", _HARNESS_PATH), ("triton_gpu.py", _GPU_PATH),
                       ("triton_schedule.py", _SCHEDULE_PATH), ("triton_memory.py", _MEMORY_PATH)):
        with open(path) as f:
            shipped[name] = f.read()
    device = job["device"]
    env = {"TRITON_INTERPRET": "1"} if device == "cpu" else {}  # gpu: run_python shows the rank's GPU alone
    res = run_python(_SCRIPT, {**files, **shipped, "job.json": json.dumps(job)}, stdin=stdin,
                     timeout_s=timeout_s, env=env, gpu=device == "cuda", read_back=(out,), fsize_mb=fsize_mb,
                     wrapper=wrapper)
    return res, res.files.get(out)


def _reference(reference_code: str, device: str) -> tuple:
    """(reference entry, None) for the task's reference, or (None, why) when it failed; computed once per (code,
    device) and cached, failures included, in this process and, in a reward pool's workers, in the pool's shared
    directory (one computation per rank: a worker that finds another computing it waits for its file).
    entry: {"cases": ref.pt cases, "ms": float | None, "stdin": the candidate's stdin (inputs, init inputs,
    parameters, init seeds)}."""
    import torch
    from rewards.pool import SHARED_DIR_ENV
    key = (reference_code, device)
    with _ref_lock:
        if key in _ref_cache:
            _ref_cache.move_to_end(key)
            return _ref_cache[key]
    shared = os.environ.get(SHARED_DIR_ENV)
    path = shared and os.path.join(shared, f"ref-{device}-{hashlib.sha256(reference_code.encode()).hexdigest()}")
    with open(path + ".lock", "w") if path else contextlib.nullcontext() as lock:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if path and os.path.exists(path + ".pt"):      # written by this pool's workers only (out of the sandbox's reach)
            found = tuple(torch.load(path + ".pt", weights_only=True))
        else:
            found = _run_reference(reference_code, device)
            if path:
                torch.save(list(found), path + ".tmp")
                os.replace(path + ".tmp", path + ".pt")
    with _ref_lock:
        _ref_cache[key] = found
        if len(_ref_cache) > _REF_CACHE_SIZE:
            _ref_cache.popitem(last=False)
    return found


def _run_reference(reference_code: str, device: str) -> tuple:
    """The reference's sandbox run: (entry, None) or (None, why)."""
    import torch
    job = {"role": "reference", "device": device, "checked": False, "time": device == "cuda",
           "cases": [{"input_seed": i, "init_seed": s} for i, s in SEEDS]}
    res, blob = _sandbox({"reference.py": reference_code}, job, REFERENCE_TIMEOUT_S, "ref.pt")
    try:
        ref = torch.load(io.BytesIO(blob), weights_only=True) if blob else None   # the task's own code: trusted
    except Exception as e:       # a reference that saved something unloadable is the task's bug
        return None, f"unreadable ref.pt: {type(e).__name__}"
    if ref is None:
        return None, f"{res.status}: {res.stderr[-1000:]}"
    stdin = io.BytesIO()
    torch.save({"cases": [{"init_seed": s, "init_inputs": c["init_inputs"], "state": c["state"]}
                          for (_, s), c in zip(SEEDS, ref["cases"])],
                "inputs": [_as_bytes_tensor(c["inputs"]) for c in ref["cases"]]}, stdin)
    return {"cases": ref["cases"], "ms": ref["ms"], "stdin": stdin.getvalue()}, None


def prepare(row: dict) -> None:
    """A pool worker's preparation of a Triton row (tasks.prepare_row, before the job's clock starts): the reference
    on every device the candidate will run on, so the job's limit is the candidate's alone."""
    for device in {_CHECKED["device"], _device()}:
        _reference(row["reference_code"], device)


def _as_bytes_tensor(value):
    """torch.save(value) as a uint8 tensor: the harness decodes it only after building the model."""
    import torch
    blob = io.BytesIO()
    torch.save(value, blob)
    return torch.frombuffer(bytearray(blob.getvalue()), dtype=torch.uint8)


_HARNESS_ERRORS = frozenset({"compile_error", "oom", "runtime_error", "early_exit"})
_META_KEYS = frozenset({"error", "detail", "phase", "n_out", "launches", "runs", "violations", "ms"})
_MAX_RUNS = 72                 # runs of one case (triton_gpu.MAX_RUNS: schedules, autotune configs and pairs)
_PHASES = ("import", "init", "forward")     # where the harness's error happened (or null); "import": no input existed
# a run-time violation's reason by its prefix (lint_torch_op without one: aten ops, bridges, threads), and the order
# in which the reasons win: a refused launch, host compute, a kernel the GPU compiler refuses, a race, a deadlock
_VIOLATION_PREFIXES = {"launch:": "lint_launch", "gpu_compile:": "gpu_compile", "out_of_bounds:": "out_of_bounds",
                       "race:": "race", "deadlock:": "deadlock"}
_VIOLATION_ORDER = ("lint_launch", "lint_torch_op", "gpu_compile", "out_of_bounds", "race", "deadlock")
# what a tool may show (info["public"]) for a verdict that input values decide: the reason's own sentence. Which
# kernel, argument, program, element, case or run failed, how many programs waited, how many runs a case had: all
# can be chosen by the hidden inputs (a branch on a loaded value, atomics taken or not), so they stay in detail
PUBLIC = {"race": "runtime: race (a byte one program or lane stores is accessed by another without an atomic or a "
                  "tl.debug_barrier between)",
          "out_of_bounds": "runtime: out_of_bounds (a load, store or atomic outside every tensor argument of its "
                           "launch)",
          "deadlock": "runtime: deadlock (under some schedule every program still running waits in an atomic that "
                      "no program will change)",
          "input_mutated": "forward changed an input tensor"}
_MAX_HEADER = 1 << 18          # bytes of safetensors header besides the tensor entries: meta (<= 80 KB)
_ENTRY_BYTES = 256             # bytes of one tensor's header entry at most (name, dtype, 8 dims, offsets: < 200)
_MAX_OUTPUTS = 64              # outputs per case the header may list (the reference's count is checked later)
_MIN_RESULT_MB = 16            # files the candidate writes: its result, and Triton's cache on CUDA
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class Malformed(ValueError):
    """A result file that is not what the harness writes: forged, truncated or from a crashed run."""


def _int_list(value, n: int, name: str, top: int = 1 << 31) -> list:
    if not (type(value) is list and len(value) == n and all(type(v) is int and 0 <= v < top for v in value)):
        raise Malformed(f"{name} is not a list of {n} ints below {top}")
    return value


def _result_mb(cases: list) -> int:
    """MiB the candidate may write: the result file of tensors shaped as the reference's, each case run up to
    _MAX_RUNS times, with its header."""
    size = _max_header(cases) + _MAX_RUNS * sum(t.numel() * t.element_size() for c in cases
                                                for t in [*c["outputs"], *c["inputs"]] if _is_tensor(t))
    return max(_MIN_RESULT_MB, -(-size // (1 << 20)) + 1)


def _max_header(cases: list) -> int:
    """Bytes of safetensors header a result may have: meta, and an entry per tensor of every run of every case
    (outputs as many as the reference's, the tensor inputs after the call)."""
    return _MAX_HEADER + _ENTRY_BYTES * _MAX_RUNS * sum(len(c["outputs"]) + sum(map(_is_tensor, c["inputs"]))
                                                        for c in cases)


def _check_layout(header: dict, names: set, data_size: int) -> None:
    """Raises Malformed unless the header lists exactly `names`, each with a known dtype, a shape of at most 8
    dims and a byte range of exactly its size, the ranges tiling the data_size bytes after the header."""
    if set(header) != names:
        raise Malformed("tensor names")
    spans = []
    for entry in header.values():
        if not (type(entry) is dict and set(entry) == {"dtype", "shape", "data_offsets"} and
                entry["dtype"] in _ITEMSIZE and type(entry["shape"]) is list and len(entry["shape"]) <= 8):
            raise Malformed("tensor entry")
        _int_list(entry["shape"], len(entry["shape"]), "shape")
        begin, end = _int_list(entry["data_offsets"], 2, "data_offsets", data_size + 1)
        if end - begin != math.prod(entry["shape"]) * _ITEMSIZE[entry["dtype"]]:
            raise Malformed("tensor size")
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise Malformed("tensor data overlaps or leaves gaps")
        position = end
    if position != data_size:
        raise Malformed("tensor data size")


def _parse_result(blob: bytes, cases: list) -> dict:
    """The candidate's result.bin, validated field by field (type, allowed values, size) and with exactly the
    tensors the cases call for: {"error", "detail", "launches", "violations", "ms", "outputs": [[[tensor]]],
    "after": [[{input index: tensor}]]} (per case, per run). Raises Malformed. Every count and byte range is
    checked against the reference and the file's length before anything is built from it, so a forged file costs at
    most a few times its own (capped) size here. Nothing is unpickled and nothing is str()-ed."""
    from safetensors.torch import load as load_tensors
    size = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else -1
    if not 0 < size <= min(_max_header(cases), len(blob) - 8):
        raise Malformed("no safetensors header")
    try:
        header = json.loads(blob[8:8 + size])
        meta = json.loads(header.pop("__metadata__")["meta"])
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        raise Malformed(f"header: {type(e).__name__}") from None
    if type(meta) is not dict or set(meta) != _META_KEYS:
        raise Malformed("meta fields")
    error, detail, phase = meta["error"], meta["detail"], meta["phase"]
    if not (error is None or type(error) is str and error in _HARNESS_ERRORS) or type(detail) is not str or \
            not (phase is None or type(phase) is str and phase in _PHASES):
        raise Malformed("error is not one of the harness's failure reasons")
    if error is not None:
        return {"error": error, "detail": detail[:2000], "phase": phase}
    n = len(cases)
    n_out = _int_list(meta["n_out"], n, "n_out", _MAX_OUTPUTS + 1)
    launches = _int_list(meta["launches"], n, "launches")
    runs = _int_list(meta["runs"], n, "runs", _MAX_RUNS + 1)
    if 0 in runs:
        raise Malformed("runs")
    violations, ms = meta["violations"], meta["ms"]
    if not (type(violations) is list and len(violations) <= 256 and
            all(type(v) is str and len(v) <= 300 for v in violations)):
        raise Malformed("violations")
    if not (ms is None or type(ms) is float and math.isfinite(ms) and 0 < ms < 1e7):
        raise Malformed("ms")
    suffixes = [[f".{r}" if r else "" for r in range(runs[k])] for k in range(n)]
    _check_layout(header, {f"out.{k}.{i}{s}" for k in range(n) for s in suffixes[k] for i in range(n_out[k])} |
                  {f"after.{k}.{i}{s}" for k, c in enumerate(cases) for s in suffixes[k]
                   for i, x in enumerate(c["inputs"]) if _is_tensor(x)}, len(blob) - 8 - size)
    try:
        tensors = load_tensors(blob)
    except Exception as e:      # the library's own checks of offsets, dtypes and sizes
        raise Malformed(f"tensors: {type(e).__name__}") from None
    return {"error": None, "detail": "", "launches": launches, "violations": violations, "ms": ms,
            "outputs": [[[tensors[f"out.{k}.{i}{s}"] for i in range(n_out[k])] for s in suffixes[k]]
                        for k in range(n)],
            "after": [[{i: tensors[f"after.{k}.{i}{s}"] for i, x in enumerate(c["inputs"]) if _is_tensor(x)}
                       for s in suffixes[k]] for k, c in enumerate(cases)]}


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _compare(cases: list, result: dict) -> tuple:
    """(reason, detail, public, max_abs_err) for a validated result against the reference cases. public: the
    part of detail that holds no value computed from hidden inputs (the harness's own messages, shapes, dtypes;
    a candidate's exception only from before its inputs existed). Every run of every case must match."""
    if result["error"]:
        return result["error"], result["detail"], result["detail"] if result["phase"] == "import" else "", None
    if result["violations"]:
        reasons = [next((r for p, r in _VIOLATION_PREFIXES.items() if v.startswith(p)), "lint_torch_op")
                   for v in result["violations"]]
        reason = min(reasons, key=_VIOLATION_ORDER.index)
        chosen = [v for v, r in zip(result["violations"], reasons) if r == reason][:5]
        # a refused launch, torch ops and the sm_90 compile follow from the text and the shapes alone: shown
        return reason, f"runtime: {chosen}", PUBLIC.get(reason, f"runtime: {chosen}"), None
    if min(result["launches"]) < 1:
        detail = "runtime: a forward call launched no Triton kernel"
        return "lint_kernel_not_launched", detail, detail, None
    runs = [(k, case, outs, after, f"case {k}" + (f", run {r} of {len(outputs)}" if len(outputs) > 1 else ""))
            for k, (case, outputs, afters) in enumerate(zip(cases, result["outputs"], result["after"], strict=True))
            for r, (outs, after) in enumerate(zip(outputs, afters, strict=True))]
    for k, case, outs, _, where in runs:      # counts, shapes, dtypes: the host's, the same for any input values
        if len(outs) != len(case["outputs"]):
            problem = f"{len(outs)} outputs, expected {len(case['outputs'])}"
            return "wrong_output", f"{where}: {problem}", problem, None
        for o, r in zip(outs, case["outputs"]):
            if o.shape != r.shape or o.dtype != r.dtype:
                problem = f"got {o.dtype} {tuple(o.shape)}, expected {r.dtype} {tuple(r.shape)}"
                return "wrong_output", f"{where}: {problem}", problem, None
    max_err = 0.0
    for k, case, outs, after, where in runs:       # values: which case and run fail is the inputs' choice
        reason, detail, err = _compare_run(case, outs, after, where)
        max_err = max(max_err, err or 0.0)
        if reason != "ok":
            return reason, detail, PUBLIC.get(reason) or f"values differ from the reference ({_tolerances(cases)})", \
                err if err is None else max_err
    return "ok", "", "", max_err


def _tolerances(cases: list) -> str:
    """The comparison's tolerance for each dtype of the reference's outputs, in words."""
    dtypes = sorted({str(r.dtype).removeprefix("torch.") for case in cases for r in case["outputs"]})
    words = [f"atol=rtol={_TOLERANCE.get(d, 1e-4)}" if d.startswith(("float", "bfloat")) else "exact" for d in dtypes]
    return words[0] if len(set(words)) == 1 else ", ".join(f"{w} for {d}" for w, d in zip(words, dtypes))


def _compare_run(case: dict, outs: list, after: dict, where: str) -> tuple:
    """(reason, detail, max_abs_err) of one run of a case (its tensor inputs after the call, its outputs, of the
    reference's counts, shapes and dtypes) against the reference case; `where` names the case and run in detail."""
    import torch
    max_err = 0.0
    for i, y in after.items():
        x = case["inputs"][i]
        if not (y.shape == x.shape and y.dtype == x.dtype and torch.equal(x, y)):
            return "input_mutated", f"{where}: input {i} changed by forward", None
    for o, r in zip(outs, case["outputs"]):
        if not r.is_floating_point():
            if not torch.equal(o, r):
                return "wrong_output", f"{where}: integer output differs", None
            continue
        err = (o.double() - r.double()).abs().nan_to_num(float("inf")).max().item() if r.numel() else 0.0
        max_err = max(max_err, err)
        tol = _TOLERANCE.get(str(r.dtype).removeprefix("torch."), 1e-4)
        if not torch.allclose(o, r, atol=tol, rtol=tol, equal_nan=True):
            return "wrong_output", f"{where}: max abs err {err:.3g} (atol=rtol={tol})", max_err
    return "ok", "", max_err


def execute(code: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """Run code's ModelNew against task["reference_code"] in the sandbox, no linting. Returns (score, info): the
    checked run's verdict, and on a GPU node the native run's where the checked run accepted the kernel (module
    docstring; a native failure is reason native_<reason>, or a NOT_SCORED reason as it is)."""
    score, info = _run(code, task, _CHECKED, timeout_s)
    if not score or _device() != "cuda":
        return score, info
    sanitizer = _sanitizer()
    for tool in (None, *(SANITIZER_TOOLS if sanitizer else ())):
        wrapper = (sanitizer, "--tool", tool, "--error-exitcode", str(SANITIZER_FOUND), "--print-limit", "3") \
            if tool else ()
        native_score, native = _run(code, task, _NATIVE, min(timeout_s, NATIVE_TIMEOUT_S), wrapper, tool)
        if not native_score:
            reason = native["reason"]
            return 0.0, {**native, "reason": reason if reason in NOT_SCORED else f"native_{reason}"}
        info["not_enforced"] = sorted({*info["not_enforced"], *native["not_enforced"]})
        if "speedup" in native and not tool:
            info["speedup"] = native["speedup"]
    if not sanitizer:
        info["not_enforced"].append("compute-sanitizer (memcheck, initcheck): not installed")
    return score, info


def _sanitizer() -> str | None:
    """NVIDIA's compute-sanitizer on PATH or under CUDA_HOME, else None."""
    found = shutil.which("compute-sanitizer")
    home = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")
    return found or (home if os.access(home, os.X_OK) else None)


def _run(code: str, task: dict, job: dict, timeout_s: float, wrapper: tuple = (), tool: str | None = None) -> tuple:
    """(score, info) of one candidate sandbox run (the checked or the native job, under `wrapper`: compute-sanitizer
    with `tool`) against the reference on the job's device; a sanitizer's finding is reason `tool`."""
    ref, problem = _reference(task["reference_code"], job["device"])
    if problem:
        return 0.0, {"reason": "reference_error", "detail": problem, "not_enforced": []}
    res, blob = _sandbox({"candidate.py": code}, {"role": "candidate", **job}, timeout_s, "result.bin",
                         stdin=ref["stdin"], fsize_mb=_result_mb(ref["cases"]), wrapper=wrapper)
    info = {"not_enforced": list(res.not_enforced)}
    if res.status in ("timeout", "sandbox_error", "oom"):
        return 0.0, {**info, "reason": res.status, "detail": res.stderr[-500:]}
    if res.status == "exit_nonzero" and res.returncode == HARNESS_FAILED and blob is None:
        return 0.0, {**info, "reason": "harness_error", "detail": res.stderr[-500:]}
    if tool and res.status == "exit_nonzero" and res.returncode == SANITIZER_FOUND:
        return 0.0, {**info, "reason": tool, "detail": (res.stdout + res.stderr)[-500:]}
    if blob is None:
        reason = "early_exit" if res.status == "ok" else "crash"
        return 0.0, {**info, "reason": reason, "detail": f"{res.status} {res.signal or res.returncode}: "
                                                         f"{res.stderr[-500:]}"}
    try:
        result = _parse_result(blob, ref["cases"])
    except Malformed as e:
        return 0.0, {**info, "reason": "crash", "detail": f"malformed result: {e}"}
    reason, detail, public, max_err = _compare(ref["cases"], result)
    info.update(reason=reason, detail=detail, public=public, max_abs_err=max_err)
    if reason == "ok" and result["ms"] and ref["ms"]:
        info["speedup"] = ref["ms"] / result["ms"]
    return (1.0 if reason == "ok" else 0.0), info


def preflight(score) -> str | None:
    """Why the Triton reward cannot score on this rank, or None: the GPU in a mode its sandboxes cannot share
    (sandbox.gpu_problem), or a shipped solution (relu) that does not score 1.0 through `score` ([(row, completion)]
    -> [(score, info)]: the rank's reward pool, with its workers' environment, device and limits): a sandbox that
    cannot start CUDA, a reference or a candidate over its time would otherwise train on zeros."""
    from data.triton_tasks import load_tasks
    from rewards.sandbox import gpu_problem
    problem = _device() == "cuda" and gpu_problem()
    if problem:
        return problem
    task = next(t for t in load_tasks() if t["name"] == "relu")
    [(reward, info)] = score([({"task": "triton", "reference_code": task["reference_code"], "_where": "preflight"},
                               f"```python\n{task['solution']}```")])
    return None if reward == 1.0 else (f"the Triton reward's preflight: the shipped relu solution scored {reward} on "
                                       f"this rank ({info.get('reason')}: {str(info.get('detail', ''))[-300:]})")


def triton_reward(completion: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """(1.0, info) when the completion's code passes `lint` and `execute`, else (0.0, info); never raises:
    a failure of the reward itself scores 0 with reason reward_error."""
    t0 = time.monotonic()
    try:
        code = extract_code(completion if isinstance(completion, str) else "")
        refused = refusal()
        if not code:
            score, info = 0.0, {"reason": "no_code", "detail": ""}
        elif (lint_result := lint(code))[0]:
            score, info = 0.0, {"reason": lint_result[0], "detail": lint_result[1], "public": lint_result[1]}
        elif refused:
            score, info = 0.0, {"reason": "no_sandbox", "detail": refused}
        else:
            score, info = execute(code, task, timeout_s)
    except Exception as e:      # a bug here must cost one sample, not the batch (the message is not trusted)
        score, info = 0.0, {"reason": "reward_error", "detail": type(e).__name__}
    info.setdefault("public", "")
    info["time_s"] = time.monotonic() - t0
    return score, info

"""The side of the Triton reward that runs inside the sandbox; rewards/triton/kernel.py ships this file into
the scratch dir and runs `import triton_harness; triton_harness.main()`. Imports only stdlib, torch, triton,
safetensors, numpy. Nothing here decides the score: the parent validates every field and compares the outputs.

job.json: {"role": "reference" | "candidate", "device": "cpu" | "cuda", "checked": bool, "time": bool,
           "cases": [{"input_seed": int, "init_seed": int}]}  (the seeds: reference role only)
    checked (candidate, CPU only): the GPU-semantics run, the verdict on every device (rewards/triton/gpu.py);
    unchecked: the launches as they are (on CUDA the native run a GPU node adds, kernel.execute)
reference role: reads reference.py, writes ref.pt = {"cases": [case], "ms": float | None}
    case = {"init_inputs": list, "inputs": list, "state": state_dict of Model, "outputs": [tensor]}
candidate role: stdin = torch.save({"cases": [{"init_seed", "init_inputs", "state"}], "inputs": [uint8 tensor:
    torch.save(inputs of that case)]}), read and closed before candidate.py runs; writes result.bin, a
    safetensors file: tensors "out.<case>.<i>" (outputs) and "after.<case>.<i>" (tensor inputs after the
    call) of each case's run 0, "out.<case>.<i>.<run>" and "after.<case>.<i>.<run>" of its further runs,
    metadata {"meta": JSON {"error": reason | null, "detail": str, "phase": "import" | "init" | "forward" |
    null (where the error happened; "import": before any input existed), "n_out": [int], "launches": [int],
    "runs": [int], "violations": [str], "ms": float | null}}, then ends with os._exit (no atexit hook or
    finalizer runs).
Per case, in this order: torch.manual_seed(init_seed) (the reference's init seed, never its input seed),
ModelNew(*init_inputs), the reference state_dict loaded when names and shapes match, then the inputs are
decoded (they did not exist in this process before), the RNG reseeded from os.urandom, one forward; every run
builds its model from copies of the case's init inputs and state. In the checked run a case runs at least
len(_GARBAGE) times, and again on the same inputs as often as its launches asked (Interpreted.want_runs: other
schedules of programs that use atomics, each autotune config): "runs" per case, each run's outputs; each further run runs the candidate's text again as a fresh
module, so nothing a run keeps (a module-level list, an autotuner's choice) reaches a later one. Cases share the
module of the first load, as on a GPU (their inputs differ, so what one case keeps is no answer for another).
Audit, over the module body, __init__ and forward alike: the process may start no thread or process once the
candidate runs (on CPU RLIMIT_NPROC 0 and the OS thread count is checked; on CUDA, where the driver starts
threads and Triton runs ptxas, only Python threads are checked); Tensor.numpy / tolist / __array__ /
untyped_storage / storage are violations whoever calls them (no caller frame is trusted), except Triton's own
argument copies inside a kernel launch; a TorchDispatchMode records, in forward, every aten op beyond
allocation / views / copies / casts (scalar reads such as .item() included) outside kernel launches, and
beyond what the interpreter needs inside them (a kernel body's torch calls). At each launch the harness
refuses (a violation "launch: ...", and the kernel does not run) pre-run hooks and any argument that is not a
tensor, a scalar (int, float, bool, str, None), a Triton dtype or constexpr, or a tuple of those, and tensors
for tl.constexpr parameters: so no torch object reaches a kernel body. Grid and heuristics callables run in a
host window where any aten op or bridge is a violation. On CPU the autotuner launches every config while it
benchmarks, and the runs of a case take every config of every tuning (triton_gpu.hook_autotune). On CUDA the timed calls
(3 warm-up + 20) run under the same audit and launch count as the checked call. On CUDA Triton's allocator is
torch's (tl.make_tensor_descriptor needs global scratch at launch; the accepted language cannot set one).
At every checked launch the GPU's own semantics are put back: rewards/triton/gpu.py. Every torch.empty* of the
candidate's process outside kernel launches is filled with garbage (_fill_garbage), as a GPU's reused allocator
block would be, where CPU gives zero pages: in run r of a checked case floats are NaN, huge positive or huge
negative finite values by r % 3 (a forgotten initialisation that maxnum / minnum or a sum hides under one cannot
hide under all), integers random; the native run's floats are NaN.
A CUDA job first starts CUDA, before the candidate's text is read: a failure exits with HARNESS_FAILED and the
reason on stderr (the parent's harness_error: the reward did not look), which accepted code cannot forge (it
reaches no os._exit, and every SystemExit it raises is caught).
"""

import copy
import inspect
import io
import json
import os
import resource
import statistics
import sys
import threading
import time
import types

import torch
from safetensors.torch import save as save_tensors
from triton.compiler.errors import CompilationError
from triton.runtime.errors import InterpreterError
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops forward may run outside kernel launches: allocation, views, copies, casts. Anything else (add, mm,
# relu, sum, reading a scalar out with .item() / float() / if, ...) means torch or Python did part of the work.
_FORWARD_ATEN = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like new_ones
full full_like new_full fill_ zero_ arange copy_ clone contiguous _to_copy to detach alias view _unsafe_view
reshape _reshape_alias as_strided t transpose permute expand unsqueeze squeeze flatten slice select split unbind
narrow resolve_conj resolve_neg is_same_size
""".split())
# inside a launch also what the interpreter runs to move kernel arguments to numpy and back (and the
# autotuner's benchmarking); torch compute a kernel body calls through a global is still recorded
_LAUNCH_ATEN = _FORWARD_ATEN | {"set_", "lift_fresh", "_local_scalar_dense"}
# tensor -> numpy / Python data or raw memory: compute the audit can't see
_BRIDGES = ("numpy", "tolist", "__array__", "untyped_storage", "storage")
_SCALARS = (int, float, bool, str, type(None))
_EMPTY = frozenset("empty empty_like empty_strided new_empty new_empty_strided".split())   # uninitialised memory
_TIME_WARMUP, _TIME_ITERS = 3, 20
_CANDIDATE = os.path.abspath("candidate.py")
_GARBAGE = ("nan", "huge", "-huge")     # what fresh floats hold in run r of a checked case: _GARBAGE[r % 3]
HARNESS_FAILED = 86                     # exit code: the harness could not start CUDA (kernel.HARNESS_FAILED)


class _Audit(TorchDispatchMode):
    """Records violations (aten ops outside the allow-list of where they ran, bridge calls, refused launches)
    while `phase` is set, and counts kernel launches. depth > 0 inside a launch; `host` while a grid or
    heuristics callable runs, where nothing may touch tensor data."""

    def __init__(self):
        super().__init__()
        self.violations, self.launches, self.depth, self.host, self.phase = set(), 0, 0, False, None
        self.seed = int.from_bytes(os.urandom(7), "little")     # fresh memory (torch.empty*) is filled from it
        self.garbage = "nan"         # which floats fill it (_GARBAGE)

    @classmethod
    def _should_skip_dynamo(cls):
        return False      # torch's default wraps __torch_dispatch__ in dynamo.disable: a 1.7 s import, no use here

    def where(self) -> str:
        return "grid/heuristics" if self.host else "kernel body" if self.depth else self.phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.phase and self.host or self.phase == "forward" and \
                name not in (_LAUNCH_ATEN if self.depth else _FORWARD_ATEN):
            self.violations.add(f"{self.where()}: {func}")
        out = func(*args, **(kwargs or {}))
        if name in _EMPTY and not self.depth:
            _fill_garbage(out, self.garbage, self.seed)
            self.seed += 1
        return out

    def in_host(self, fn, *args):
        """fn(*args) (a grid or heuristics callable) with every aten op and bridge a violation."""
        host, self.host = self.host, True
        try:
            return fn(*args)
        finally:
            self.host = host


def _fill_garbage(t: torch.Tensor, kind: str, seed: int) -> None:
    """What a GPU's reused allocator block holds, in place of CPU's zero pages, so a kernel that leaves part of its
    output unwritten cannot pass by the zeros: floats NaN (kind "nan") or finite values of one sign near the
    dtype's largest ("huge", "-huge": U(0.25, 0.5) x max), random values in the rest."""
    generator = torch.Generator(t.device).manual_seed(seed)
    if t.is_floating_point() or t.is_complex():
        if kind == "nan" or t.is_complex():
            t.fill_(float("nan"))
        else:
            t.uniform_(0.25, 0.5, generator=generator).mul_(torch.finfo(t.dtype).max * (1 if kind == "huge" else -1))
    elif t.dtype == torch.bool:
        t.random_(0, 2, generator=generator)
    else:
        t.random_(generator=generator)


def _argument_problem(value, constexpr: bool) -> str | None:
    """Why a kernel argument must not reach a kernel body: anything but a tensor (never for a tl.constexpr
    parameter), an exact scalar, a Triton dtype or constexpr of a scalar, or a tuple of those."""
    import triton.language as tl
    if type(value) is tuple:
        return next(filter(None, (_argument_problem(v, constexpr) for v in value)), None)
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return "a tensor as tl.constexpr" if constexpr else None
    if type(value) is tl.constexpr:
        return _argument_problem(value.value, True)
    if type(value) in _SCALARS or isinstance(value, tl.dtype) and type(value).__module__.startswith("triton."):
        return None
    return f"a {type(value).__name__} (not a tensor, scalar or dtype)"


def _refused_launch(kernel, args: tuple, kwargs: dict) -> str | None:
    """Why a launch must not run: a pre-run hook (candidate code inside the launch) or an argument (default values
    included) that _argument_problem refuses."""
    if kernel.pre_run_hooks:
        return "a pre-run hook"
    constexprs = {n for n, a in inspect.get_annotations(kernel.fn).items() if "constexpr" in str(a)}
    given = {**dict(zip(kernel.arg_names, args)), **kwargs}
    defaults = {n: p.default for n, p in inspect.signature(kernel.fn).parameters.items()
                if n not in given and p.default is not inspect.Parameter.empty}
    for name, value in {**given, **defaults}.items():
        problem = _argument_problem(value, name in constexprs)
        if problem:
            return f"argument {name} of {kernel.fn.__name__} is {problem}"
    return None


_VIOLATION_CHARS = 300                 # the parent refuses longer violation strings


def _hook_launches(audit: _Audit, interpreted) -> None:
    """Count real kernel launches (jit on GPU, interpreter on CPU; autotuners end in one of these), refuse the
    ones _refused_launch names, mark the time inside them, and run grid and heuristics callables in the host
    window. Interpreted launches (CPU) also compile for sm_90 first (refused when that fails) and run their
    programs overlapping under the case's schedule with the race check (triton_gpu.Interpreted; a deadlock is a
    violation and the launch returns) and the autotuner benchmarks as on a GPU (triton_gpu.hook_autotune)."""
    from triton.runtime.autotuner import Heuristics
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def wrap(cls, checked):
        run = cls.run

        def counted_run(self, *args, grid, warmup, **kwargs):
            refused = _refused_launch(self, args, kwargs)
            if refused:
                audit.violations.add(f"launch: {refused}")
                return None
            problem = checked and checked.launch_problem(self, args, kwargs)     # may skip a config
            if problem:
                audit.violations.add(f"gpu_compile: {problem}"[:_VIOLATION_CHARS])
                return None
            audit.launches += not warmup
            audit.depth += 1
            arguments = {**dict(zip(self.arg_names, args)), **kwargs}
            try:
                if checked:
                    checked.programs.bind(arguments)
                out = run(self, *args, grid=(lambda meta: audit.in_host(grid, meta)) if callable(grid) else grid,
                          warmup=warmup, **kwargs)
                if checked:
                    audit.violations.update(v[:_VIOLATION_CHARS] for v in checked.finish(self.fn.__name__, arguments))
                return out
            except checked.Deadlock if checked else () as e:     # it never ends on a GPU: a violation, forward goes on
                audit.violations.update(v[:_VIOLATION_CHARS] for v in checked.finish(self.fn.__name__, arguments, e))
                return None
            finally:
                audit.depth -= 1
                if checked:
                    checked.programs.abandon()
        cls.run = counted_run

    def heuristics_run(self, *args, **kwargs):      # Heuristics.run with its callables in the host window
        for name, heuristic in self.values.items():
            kwargs[name] = audit.in_host(heuristic, {**dict(zip(self.arg_names, args)), **kwargs})
        return self.fn.run(*args, **kwargs)

    wrap(JITFunction, None)
    wrap(InterpretedFunction, interpreted)
    Heuristics.run = heuristics_run
    if interpreted:
        interpreted.hook()


def _guard_bridges(audit: _Audit) -> None:
    """Tensor -> numpy / Python data and raw storage are violations whoever calls them (a library wrapper in
    between changes nothing), except inside a kernel launch outside grid / heuristics callables: there only
    the interpreter runs, copying its arguments through their storages."""
    for name in _BRIDGES:
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _name=name, _original=original, **kwargs):
            if audit.phase and (audit.host or not audit.depth):
                audit.violations.add(f"{audit.where()}: Tensor.{_name}() (numpy / Python compute)")
            return _original(self, *args, **kwargs)
        setattr(torch.Tensor, name, guarded)


def _outputs(out) -> list:
    """Model output (tensor or tuple/list of tensors) as a list of detached contiguous CPU copies; raises
    TypeError else."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(type(o) is torch.Tensor for o in outs):
        raise TypeError(f"forward returned {type(out).__name__}, not tensors")
    return [o.detach().to("cpu", copy=True).contiguous() for o in outs]


def _to(device, values) -> list:
    return [v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _time_ms(fn) -> float:
    """Median CUDA-event time of fn() in ms over _TIME_ITERS runs after _TIME_WARMUP."""
    for _ in range(_TIME_WARMUP):
        fn()
    times = []
    for _ in range(_TIME_ITERS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _cpu_bench(kernel_call, quantiles) -> list:
    """Triton's do_bench for an unchecked interpreted run: one call's wall time in ms, for each quantile asked."""
    t0 = time.perf_counter()
    kernel_call()
    return [(time.perf_counter() - t0) * 1e3] * len(quantiles)


def _error(exc: BaseException, importing: bool) -> tuple:
    """(reason, detail) for an exception raised by candidate code: early_exit (SystemExit), compile_error
    (anything while importing the module, the Triton compiler, or the interpreter failing inside a kernel,
    which the compiler would have rejected on a GPU), oom, or runtime_error. Formatting the message runs
    candidate code at worst, in this sandbox and on its time."""
    if isinstance(exc, SystemExit):
        return "early_exit", "SystemExit raised"
    try:
        detail = f"{type(exc).__name__}: {exc}"[:2000]
    except Exception:        # a message that can't be formatted is no message
        detail = type(exc).__name__
    if importing or isinstance(exc, (CompilationError, InterpreterError)):
        return "compile_error", detail
    if isinstance(exc, MemoryError) or "allocate" in detail or "out of memory" in detail:
        return "oom", detail
    return "runtime_error", detail


def _run_reference(job: dict) -> dict:
    import reference as module
    cases, times = [], []
    for seeds in job["cases"]:
        torch.manual_seed(seeds["input_seed"])
        inputs, init_inputs = module.get_inputs(), module.get_init_inputs()
        torch.manual_seed(seeds["init_seed"])
        model = module.Model(*init_inputs)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model = model.to(job["device"])
        args = _to(job["device"], inputs)
        with torch.no_grad():
            outputs = _outputs(model(*args))
            if job["time"]:
                times.append(_time_ms(lambda: model(*args)))
        cases.append({"init_inputs": init_inputs, "inputs": inputs, "state": state, "outputs": outputs})
    return {"cases": cases, "ms": statistics.median(times) if times else None}


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class _Candidate:
    """One candidate run: the module, then each case; fills tensors and meta for result.bin."""

    def __init__(self, job: dict, data: dict):
        self.job, self.data = job, data
        self.audit = _Audit()
        self.tensors = {}
        self.meta = {"error": None, "detail": "", "phase": None, "n_out": [], "launches": [], "runs": [],
                     "violations": [], "ms": None}
        self.interpreted = None          # triton_gpu.Interpreted in the checked run
        self.text = None                 # the candidate's text, run again for every further run of a case

    def run(self) -> None:
        with open(_CANDIDATE, encoding="utf-8") as f:
            text = self.text = f.read()  # the text the linter read (coding declarations are rejected there)
        cpu = self.job["device"] == "cpu"
        if self.job["checked"]:
            from triton_gpu import Interpreted     # shipped beside this file (the GPU's semantics, CPU only)
            self.interpreted = Interpreted(text, self.load)     # forks the compiler
        if not cpu:    # tl.make_tensor_descriptor needs global scratch at launch, which the accepted language can't give
            import triton
            triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        elif not self.interpreted:     # the interpreter as it is: its autotuner benchmarks with a CPU clock (Triton's
            from triton.runtime.autotuner import Autotuner      # do_bench needs a GPU driver)
            Autotuner.do_bench = property(lambda tuner: _cpu_bench)
        _hook_launches(self.audit, self.interpreted)
        _guard_bridges(self.audit)
        threads = _threads()
        if cpu:     # no new thread or process from here on (on CUDA, the driver and ptxas need them)
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        importing = True
        try:
            module = self._phase("import", lambda: self.load(text))
            importing = False
            times = [self._case(module, k, case) for k, case in enumerate(self.data["cases"])]
        except BaseException as e:       # SystemExit included: a candidate failure of any kind is scored
            self.meta["error"], self.meta["detail"] = _error(e, importing)
            self.meta["phase"] = "import" if importing else self.audit.phase    # import: before any input existed
            return
        finally:
            self.audit.phase = None
            if threading.active_count() != 1 or cpu and _threads() != threads:
                self.meta["violations"].append("threads: the candidate started a thread")
            self.meta["violations"] += sorted(self.audit.violations)
        self.meta["ms"] = statistics.median(times) if self.job["time"] else None

    def _phase(self, name, fn):
        self.audit.phase = name
        with self.audit:
            out = fn()
        self.audit.phase = None
        return out

    @staticmethod
    def load(text: str):
        """The candidate's module, executed from its text."""
        module = types.ModuleType("candidate")
        module.__file__ = _CANDIDATE
        sys.modules["candidate"] = module
        exec(compile(text, _CANDIDATE, "exec"), module.__dict__)
        return module

    def _case(self, module, k: int, case: dict):
        """Case k: one run, then (CPU) as many more as the interpreted launches wanted (Interpreted.want_runs: other
        schedules of the programs, other autotune configs), each from a fresh model and copies of the same inputs.
        Each further run runs the candidate's text again as a fresh module: nothing the candidate kept from an
        earlier run (run 0's outputs in a module-level list) reaches it. Returns run 0's time (CUDA)."""
        interpreted, runs = self.interpreted, 1
        if interpreted:
            interpreted.run_index, interpreted.runs = 0, len(_GARBAGE)
        ms = self._run(module, k, case, 0)
        while interpreted and runs < interpreted.runs:
            interpreted.run_index = runs
            self.audit.garbage = _GARBAGE[runs % len(_GARBAGE)]
            fresh = self._phase("init", lambda: self.load(self.text))     # not "import": the inputs exist by now
            self._run(fresh, k, case, runs)
            runs += 1
        self.audit.garbage = _GARBAGE[0]
        self.meta["runs"].append(runs)
        return ms

    def _run(self, module, k: int, case: dict, run: int):
        device = self.job["device"]
        torch.manual_seed(case["init_seed"])
        init_inputs, state = copy.deepcopy(case["init_inputs"]), {n: v.clone() for n, v in case["state"].items()}
        model = self._phase("init", lambda: module.ModelNew(*init_inputs))
        own = self._phase("init", model.state_dict)        # the model's hooks run under the audit too
        if own.keys() == state.keys() and all(own[n].shape == v.shape for n, v in state.items()):
            self._phase("init", lambda: model.load_state_dict(state))   # the reference Model's parameters
        model = self._phase("init", lambda: model.to(device))
        args = _to(device, torch.load(io.BytesIO(self.data["inputs"][k].numpy().tobytes()), weights_only=True))
        torch.manual_seed(int.from_bytes(os.urandom(7), "little"))
        before = self.audit.launches
        with torch.no_grad():     # the timed calls too: each must launch and none may compute in torch
            outs = _outputs(self._phase("forward", lambda: model(*args)))
            ms = self._phase("forward", lambda: _time_ms(lambda: model(*args))) if self.job["time"] else None
        suffix = f".{run}" if run else ""       # run 0's names, then each further run's
        if run == 0:
            calls = 1 + (_TIME_WARMUP + _TIME_ITERS if self.job["time"] else 0)
            self.meta["launches"].append((self.audit.launches - before) // calls)     # per call, rounded down
            self.meta["n_out"].append(len(outs))
        elif len(outs) != self.meta["n_out"][k]:
            raise RuntimeError(f"forward returned {len(outs)} outputs in run {run}, {self.meta['n_out'][k]} in run 0")
        for i, o in enumerate(outs):
            self.tensors[f"out.{k}.{i}{suffix}"] = o
        for i, a in enumerate(_to("cpu", args)):
            if isinstance(a, torch.Tensor):
                self.tensors[f"after.{k}.{i}{suffix}"] = a.contiguous()
        return ms


def main() -> None:
    with open("job.json") as f:
        job = json.load(f)
    if job["role"] == "reference":
        torch.save(_run_reference(job), "ref.pt")
        return
    if job["device"] == "cuda":
        try:                             # before the candidate's text exists here: nothing of it can fail this
            torch.empty(1, device="cuda").add_(1).item()
        except Exception as e:
            sys.stderr.write(f"CUDA did not start in the sandbox: {type(e).__name__}: {e}"[:1000])
            sys.stderr.flush()
            os._exit(HARNESS_FAILED)
    data = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
    os.close(0)                          # the inputs now exist only in this process, not as a file
    cand = _Candidate(job, data)
    cand.run()
    if cand.meta["error"]:
        cand.tensors = {}
    blob = save_tensors(cand.tensors, metadata={"meta": json.dumps(cand.meta)})
    with open("result.bin", "wb") as f:
        f.write(blob)
    os._exit(0)

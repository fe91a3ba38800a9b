"""The side of the Triton reward that runs inside the sandbox; rewards/triton_kernel.py ships this file into
the scratch dir and runs `import triton_harness; triton_harness.main()`. Imports only stdlib, torch, triton,
safetensors, numpy. Nothing here decides the score: the parent validates every field and compares the outputs.

job.json: {"role": "reference" | "candidate", "device": "cpu" | "cuda", "time": bool,
           "cases": [{"input_seed": int, "init_seed": int}]}  (the seeds: reference role only)
reference role: reads reference.py, writes ref.pt = {"cases": [case], "ms": float | None}
    case = {"init_inputs": list, "inputs": list, "state": state_dict of Model, "outputs": [tensor]}
candidate role: stdin = torch.save({"cases": [{"init_seed", "init_inputs", "state"}], "inputs": [uint8 tensor:
    torch.save(inputs of that case)]}), read and closed before candidate.py runs; writes result.bin, a
    safetensors file: tensors "out.<case>.<i>" (outputs) and "after.<case>.<i>" (tensor inputs after the
    call), metadata {"meta": JSON {"error": reason | null, "detail": str, "phase": "import" | "init" |
    "forward" | null (where the error happened; "import": before any input existed), "n_out": [int],
    "launches": [int], "violations": [str], "ms": float | null}}, then ends with os._exit (no atexit hook or
    finalizer runs).
Per case, in this order: torch.manual_seed(init_seed) (the reference's init seed, never its input seed),
ModelNew(*init_inputs), the reference state_dict loaded when names and shapes match, then the inputs are
decoded (they did not exist in this process before), the RNG reseeded from os.urandom, one forward.
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
host window where any aten op or bridge is a violation. On CPU the autotuner, which has no benchmarker under
the interpreter, takes the first config. On CUDA the timed calls (3 warm-up + 20) run under the same audit and
launch count as the checked call.
What a GPU would do differently, checked on CPU at every interpreted launch (the interpreter runs a kernel body as
Python, one program after another): the kernel must compile for sm_90 with the launch's argument types,
constexprs and options, down to ptxas, and fit sm_90's shared memory (_GpuCompiler; violation "gpu_compile: ...",
the kernel does not run), and its grid CUDA's limits; its programs run in a random order other than the grid's
own, and one that stores (or updates atomically) a byte another program accesses without an atomic is a
violation "race: ..." (_Programs). Both live in Triton's own classes, patched here before the candidate's text
runs; the accepted language names neither these classes nor their modules.
"""

import inspect
import io
import json
import math
import os
import pickle
import random
import resource
import statistics
import sys
import tempfile
import threading
import types

import numpy as np
import torch
import triton.language as tl
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
_TIME_WARMUP, _TIME_ITERS = 3, 20
_CANDIDATE = os.path.abspath("candidate.py")


class _Audit(TorchDispatchMode):
    """Records violations (aten ops outside the allow-list of where they ran, bridge calls, refused launches)
    while `phase` is set, and counts kernel launches. depth > 0 inside a launch; `host` while a grid or
    heuristics callable runs, where nothing may touch tensor data."""

    def __init__(self):
        super().__init__()
        self.violations, self.launches, self.depth, self.host, self.phase = set(), 0, 0, False, None

    @classmethod
    def _should_skip_dynamo(cls):
        return False      # torch's default wraps __torch_dispatch__ in dynamo.disable: a 1.7 s import, no use here

    def where(self) -> str:
        return "grid/heuristics" if self.host else "kernel body" if self.depth else self.phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.phase and self.host or self.phase == "forward" and \
                func.overloadpacket.__name__ not in (_LAUNCH_ATEN if self.depth else _FORWARD_ATEN):
            self.violations.add(f"{self.where()}: {func}")
        return func(*args, **(kwargs or {}))

    def in_host(self, fn, *args):
        """fn(*args) (a grid or heuristics callable) with every aten op and bridge a violation."""
        host, self.host = self.host, True
        try:
            return fn(*args)
        finally:
            self.host = host


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


# sm_90 (H100 / H200), the target every interpreted kernel must also compile for, with what a launch there may use:
# shared memory per block (the opt-in maximum), warps per block (1024 threads) and CUDA's grid limits
_GPU_TARGET = ("cuda", 90, 32)
_GPU_SHARED_BYTES = 232448
_GPU_WARPS = 32
_GPU_GRID = (2**31 - 1, 65535, 65535)
_VIOLATION_CHARS = 300                 # the parent refuses longer violation strings
# accesses the race check tells apart, and which pairs conflict when two programs make them on one byte: a plain
# store with any access, an atomic update with a plain load or store (loads with loads and atomics with atomics
# are fine in any order)
_CONFLICTS = (("store", ("load", "store", "atomic", "atomic_load")), ("atomic", ("load", "store")))
_ACCESS_WORDS = {"load": "loads", "store": "stores to", "atomic": "updates atomically",
                 "atomic_load": "loads atomically"}


class _GpuCompiler:
    """Compiles each interpreted launch's kernel for sm_90 with that launch's argument types, constexprs and
    options, as JITFunction.run would on a GPU (Triton's NVIDIA backend down to ptxas); a launch whose kernel
    does not compile, or needs more shared memory or threads than an sm_90 block has, never runs. The interpreter accepts what the
    GPU compiler refuses (kernel values as Python ints and bools, host functions over them), so only code that
    compiles for a GPU is rewarded. Compiling starts processes (ptxas), which the candidate's own process may not:
    a process forked before the candidate runs (_serve_compiles) does it, one request at a time over two pipes.
    Results are cached per kernel and specialisation for the whole run."""

    def __init__(self, text: str):
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        if os.fork() == 0:
            os.close(req_w)
            os.close(rep_r)
            _serve_compiles(text, req_r, rep_w)
            os._exit(0)
        os.close(req_r)
        os.close(rep_w)
        self.requests, self.replies = os.fdopen(req_w, "wb"), os.fdopen(rep_r, "rb")
        self.backend = make_backend(GPUTarget(*_GPU_TARGET))
        self.binders, self.results = {}, {}

    def problem(self, kernel, args: tuple, kwargs: dict) -> str | None:
        """Why `kernel` launched with these arguments does not compile for sm_90, else None."""
        from triton import knobs
        from triton.runtime.jit import JITFunction, create_function_from_signature
        if kernel not in self.binders:
            jit = JITFunction(kernel.fn, **kernel.kwargs)
            self.binders[kernel] = jit, create_function_from_signature(jit.signature, jit.params, self.backend)
        jit, binder = self.binders[kernel]
        kwargs = {**kwargs, "debug": kwargs.get("debug", jit.debug) or knobs.runtime.debug,     # as JITFunction.run
                  "instrumentation_mode": knobs.compilation.instrumentation_mode,
                  "fpsan_homomorphic_casts": knobs.compilation.fpsan_homomorphic_casts}
        try:
            bound, specialization, options = binder(*args, **kwargs)
            key = (kernel, str(specialization), str(options))
            if key not in self.results:
                options, signature, constexprs, attrs = jit._pack_args(self.backend, kwargs, bound, specialization,
                                                                       options)
                self.results[key] = self._ask(kernel.fn.__name__, (signature, constexprs, attrs, options.__dict__))
        except Exception as e:          # binding the launch as a GPU would (unknown keywords, unusable arguments)
            return f"{kernel.fn.__name__}: {type(e).__name__}: {e}"
        return self.results[key]

    def _ask(self, name: str, compile_args: tuple) -> str | None:
        blob = pickle.dumps((name, *compile_args))
        try:
            self.requests.write(len(blob).to_bytes(8, "little") + blob)
            self.requests.flush()
            head = self.replies.read(8)
            reply = self.replies.read(int.from_bytes(head, "little")).decode("utf-8", "replace") \
                if len(head) == 8 else "the compiler's process ended"
        except OSError:
            reply = "the compiler's process ended"
        return f"{name}: {reply}" if reply else None


def _serve_compiles(text: str, requests: int, replies: int) -> None:
    """The compiling process (_GpuCompiler): runs the candidate's module again, in a directory of its own (its
    module body ran in the scratch dir already), with kernels as JITFunctions (not the interpreter's), then
    answers each request (kernel name, signature, constexprs, attributes, options) with ""
    or why sm_90 refuses it, until its pipe closes. This process was forked from one that imported Triton under
    TRITON_INTERPRET=1: triton.language's own @jit functions (tl.sum's combine, tl.cdiv, ...) become JITFunctions
    again first. The sandbox's Triton cache starts empty and dies with it, so its key need not identify the Triton
    build: hashing libtriton.so for it took 0.36 s of the first compile."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime import cache
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    knobs.runtime.interpret = False
    cache.triton_key = lambda: "sandbox"
    jitted = {}
    for library in [m for name, m in sys.modules.items() if name.startswith("triton.")]:
        for name, value in list(vars(library).items()):
            if isinstance(value, InterpretedFunction):
                if id(value) not in jitted:
                    jitted[id(value)] = JITFunction(value.fn, **value.kwargs)
                setattr(library, name, jitted[id(value)])
    try:
        triton.compile(ASTSource(JITFunction(_warm_up), {"x_ptr": "*fp32"}), target=GPUTarget(*_GPU_TARGET))
    except Exception:       # a compiler that cannot work here says so in its own words at the first request
        pass
    os.chdir(tempfile.mkdtemp())
    module = None
    with os.fdopen(requests, "rb") as inp, os.fdopen(replies, "wb") as out:
        while len(head := inp.read(8)) == 8:
            name, signature, constexprs, attrs, options = pickle.loads(inp.read(int.from_bytes(head, "little")))
            try:
                module = module or _Candidate.load(text)
                fn = vars(module).get(name)
                while fn is not None and not isinstance(fn, JITFunction):
                    fn = getattr(fn, "fn", None)          # Autotuner, Heuristics -> JITFunction
                if fn is None:
                    reply = "not a module-level @triton.jit kernel"
                else:
                    meta = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(*_GPU_TARGET),
                                          options=options).metadata
                    reply = f"needs {meta.shared} bytes of shared memory, sm_90 has {_GPU_SHARED_BYTES}" \
                        if meta.shared > _GPU_SHARED_BYTES else f"{meta.num_warps} warps, more than {_GPU_WARPS}" \
                        if meta.num_warps > _GPU_WARPS else ""
            except Exception as e:       # the compiler's verdict: where, the source line there, what
                lines = [line.strip() for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
                reply = " | ".join([lines[0], lines[-3], lines[-1]] if len(lines) > 3 else lines)
            data = reply.encode("utf-8", "replace")
            out.write(len(data).to_bytes(8, "little") + data)
            out.flush()


def _warm_up(x_ptr):
    """Compiled for sm_90 as soon as the compiling process starts, while the candidate's module imports: Triton's
    first compile in a process imports its code generator and asks ptxas its version (0.1 s)."""
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


class _Programs:
    """The programs of each interpreted launch, as the harness runs them: in a random order other than the grid's
    own (a GPU promises no order), recording the bytes each program loads, stores and updates atomically. A launch
    in which one program stores (or updates atomically) what another accesses without an atomic is a race: its
    result on a GPU depends on timing. Atomics among themselves are exempt."""

    def __init__(self):
        self.rng = random.Random(os.urandom(16))       # never the candidate's RNG, never a seed it could know
        self.dims = self.program = None                # the running launch's grid, and the program that runs
        self.atomic = False                            # inside an atomic operation of the interpreter

    def start(self, dims: tuple) -> None:
        n = math.prod(dims)
        self.dims, self.program, self.order = dims, None, list(range(n))
        while n > 1 and self.order == sorted(self.order):
            self.rng.shuffle(self.order)
        self.pending = {kind: [] for kind in _ACCESS_WORDS}     # byte addresses of the running program
        self.touched = {kind: [] for kind in _ACCESS_WORDS}     # (addresses, program) of the finished ones

    def enter(self, index: tuple) -> tuple:
        """The program to run at the grid's position `index`: (x, y, z) of the permuted order."""
        self._flush()
        _, ny, nz = self.dims
        self.program = self.order[(index[0] * ny + index[1]) * nz + index[2]]
        return self._index(self.program)

    def _index(self, program: int) -> tuple:
        _, ny, nz = self.dims
        return program // (ny * nz), program // nz % ny, program % nz

    def record(self, kind: str, ptrs, mask) -> None:
        """The bytes a program accesses through `ptrs` (a TensorHandle of addresses) where `mask` is set."""
        if self.program is None:
            return
        if self.atomic:
            kind = {"load": "atomic_load", "store": "atomic"}.get(kind, kind)
        addresses = ptrs.data if mask is None else ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        self.pending[kind].append((addresses.astype(np.uint64).reshape(-1, 1) +
                                   np.arange(size, dtype=np.uint64)).ravel())

    def _flush(self) -> None:
        for kind, parts in self.pending.items():
            if parts and self.program is not None:
                self.touched[kind].append((np.unique(np.concatenate(parts)), self.program))
            parts.clear()

    def abandon(self) -> None:
        self.dims = self.program = None

    def finish(self, kernel: str, arguments: dict) -> list:
        """Violations of the launch that just ran: its grid over CUDA's limits, or a race (programs, the access
        each makes, which argument and element)."""
        if self.dims is None:
            return []
        self._flush()
        found = [f"gpu_compile: {kernel}: grid {self.dims} over CUDA's limits {_GPU_GRID}"] \
            if any(d > top for d, top in zip(self.dims, _GPU_GRID)) else []
        for kind, others in _CONFLICTS:
            clash = _first_clash(self._spans((kind,)), self._spans(others))
            if clash is not None:
                found.append(f"race: {kernel}: {self._describe(clash, kind, others, arguments)}")
                break
        return found

    def _spans(self, kinds: tuple) -> tuple:
        """(addresses, lowest program, highest program) per distinct byte the programs accessed as `kinds`."""
        parts = [(a, p) for kind in kinds for a, p in self.touched[kind] if len(a)]
        if not parts:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        addresses = np.concatenate([a for a, _ in parts])
        programs = np.concatenate([np.full(len(a), p) for a, p in parts])
        order = np.lexsort((programs, addresses))
        addresses, programs = addresses[order], programs[order]
        first = np.flatnonzero(np.r_[True, addresses[1:] != addresses[:-1]])
        return addresses[first], programs[first], programs[np.r_[first[1:], len(addresses)] - 1]

    def _describe(self, address: int, kind: str, others: tuple, arguments: dict) -> str:
        def who(kinds):
            return [(p, k) for k in kinds for a, p in self.touched[k] if address in a]
        (p, k), (q, j) = next((a, b) for a in who((kind,)) for b in who(others) if a[0] != b[0])
        where = next((f"element {(address - t.data_ptr()) // t.element_size()} of {name}"
                      for name, t in arguments.items() if isinstance(t, torch.Tensor) and
                      0 <= address - t.data_ptr() < t.element_size() * (1 + sum((s - 1) * d for s, d in
                                                                                zip(t.shape, t.stride())))),
                     "memory outside the tensor arguments")
        return f"program {self._index(p)} {_ACCESS_WORDS[k]} {where}, which program {self._index(q)} " \
               f"{_ACCESS_WORDS[j]}"


def _first_clash(mine: tuple, theirs: tuple) -> int | None:
    """A byte address that some program accesses in `mine` and another program in `theirs` (both _spans), else
    None: at a common address the two sides are one and the same program only if all four bounds agree."""
    common, i, j = np.intersect1d(mine[0], theirs[0], assume_unique=True, return_indices=True)
    clash = (mine[1][i] != mine[2][i]) | (theirs[1][j] != theirs[2][j]) | (mine[1][i] != theirs[1][j])
    return int(common[np.argmax(clash)]) if clash.any() else None


def _hook_programs(programs: _Programs) -> None:
    """Route the interpreter's grid and memory operations through `programs`: set_grid_dim starts a launch,
    set_grid_idx picks the permuted program, every load, store and atomic records its bytes."""
    from triton.runtime.interpreter import InterpreterBuilder as B
    set_dim, set_idx = B.set_grid_dim, B.set_grid_idx
    load, store, rmw, cas = B.create_masked_load, B.create_masked_store, B.create_atomic_rmw, B.create_atomic_cas

    def set_grid_dim(self, nx, ny, nz):
        programs.start((nx, ny, nz))
        return set_dim(self, nx, ny, nz)

    def set_grid_idx(self, x, y, z):
        return set_idx(self, *programs.enter((x, y, z)))

    def masked_load(self, ptrs, mask, *rest):
        programs.record("load", ptrs, mask)
        return load(self, ptrs, mask, *rest)

    def masked_store(self, ptrs, value, mask, *rest):
        programs.record("store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest)

    def atomic_rmw(self, op, ptr, value, mask, *rest):
        programs.record("atomic", ptr, mask)
        return rmw(self, op, ptr, value, mask, *rest)

    def atomic_cas(self, ptr, *rest):
        programs.record("atomic", ptr, None)
        return cas(self, ptr, *rest)

    def atomically(method):      # atomic loads, stores and polls go through the masked load / store above
        def run(self, *args):
            programs.atomic = True
            try:
                return method(self, *args)
            finally:
                programs.atomic = False
        return run

    B.set_grid_dim, B.set_grid_idx, B.create_masked_load, B.create_masked_store = \
        set_grid_dim, set_grid_idx, masked_load, masked_store
    B.create_atomic_rmw, B.create_atomic_cas = atomic_rmw, atomic_cas
    for name in ("create_atomic_load", "create_atomic_store", "create_atomic_poll"):
        setattr(B, name, atomically(getattr(B, name)))


class _Interpreted:
    """What the harness adds to interpreted launches (CPU): the sm_90 compile and the permuted, race-checked grid."""

    def __init__(self, text: str):
        self.compiler, self.programs = _GpuCompiler(text), _Programs()


def _hook_launches(audit: _Audit, interpreted: "_Interpreted | None") -> None:
    """Count real kernel launches (jit on GPU, interpreter on CPU; autotuners end in one of these), refuse the
    ones _refused_launch names, mark the time inside them, and run grid and heuristics callables in the host
    window. Interpreted launches (CPU) also compile for sm_90 first (refused when that fails) and run their
    programs in a permuted order with the race check; the autotuner takes its first config there (the
    interpreter has no benchmarker)."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def wrap(cls, checked: "_Interpreted | None"):
        run = cls.run

        def counted_run(self, *args, grid, warmup, **kwargs):
            refused = _refused_launch(self, args, kwargs)
            if refused:
                audit.violations.add(f"launch: {refused}")
                return None
            problem = checked and checked.compiler.problem(self, args, kwargs)
            if problem:
                audit.violations.add(f"gpu_compile: {problem}"[:_VIOLATION_CHARS])
                return None
            audit.launches += not warmup
            audit.depth += 1
            try:
                out = run(self, *args, grid=(lambda meta: audit.in_host(grid, meta)) if callable(grid) else grid,
                          warmup=warmup, **kwargs)
                if checked:
                    audit.violations.update(v[:_VIOLATION_CHARS] for v in checked.programs.finish(
                        self.fn.__name__, {**dict(zip(self.arg_names, args)), **kwargs}))
                return out
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
        Autotuner.do_bench = property(lambda self: self._do_bench or (lambda call, quantiles: [0.0, 0.0, 0.0]))
        _hook_programs(interpreted.programs)


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
        self.meta = {"error": None, "detail": "", "phase": None, "n_out": [], "launches": [], "violations": [],
                     "ms": None}

    def run(self) -> None:
        with open(_CANDIDATE, encoding="utf-8") as f:
            text = f.read()              # the text the linter read (coding declarations are rejected there)
        cpu = self.job["device"] == "cpu"
        _hook_launches(self.audit, _Interpreted(text) if cpu else None)    # forks the compiling process on CPU
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
        device = self.job["device"]
        torch.manual_seed(case["init_seed"])
        model = self._phase("init", lambda: module.ModelNew(*case["init_inputs"]))
        own = self._phase("init", model.state_dict)        # the model's hooks run under the audit too
        if own.keys() == case["state"].keys() and all(own[n].shape == v.shape for n, v in case["state"].items()):
            self._phase("init", lambda: model.load_state_dict(case["state"]))   # the reference Model's parameters
        model = self._phase("init", lambda: model.to(device))
        args = _to(device, torch.load(io.BytesIO(self.data["inputs"][k].numpy().tobytes()), weights_only=True))
        torch.manual_seed(int.from_bytes(os.urandom(7), "little"))
        before = self.audit.launches
        with torch.no_grad():     # the timed calls too: each must launch and none may compute in torch
            outs = _outputs(self._phase("forward", lambda: model(*args)))
            ms = self._phase("forward", lambda: _time_ms(lambda: model(*args))) if self.job["time"] else None
        calls = 1 + (_TIME_WARMUP + _TIME_ITERS if self.job["time"] else 0)
        self.meta["launches"].append((self.audit.launches - before) // calls)     # per call, rounded down
        self.meta["n_out"].append(len(outs))
        for i, o in enumerate(outs):
            self.tensors[f"out.{k}.{i}"] = o
        for i, a in enumerate(_to("cpu", args)):
            if isinstance(a, torch.Tensor):
                self.tensors[f"after.{k}.{i}"] = a.contiguous()
        return ms


def main() -> None:
    with open("job.json") as f:
        job = json.load(f)
    if job["role"] == "reference":
        torch.save(_run_reference(job), "ref.pt")
        return
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

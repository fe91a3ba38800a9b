"""The GPU-semantics side of the interpreter (CPU runs, inside the sandbox): what a GPU would do differently from
Triton's interpreter, put back at every checked launch. rewards/triton/harness.py uses it; rewards/triton/kernel.py
ships it into the scratch dir as the top-level module triton_gpu, with memory.py (triton_memory: the record of
accesses, races, bounds, visibility) and schedule.py (triton_schedule). Imports only stdlib, torch, triton, numpy.

What a GPU would do differently, checked on CPU at every interpreted launch (the interpreter runs a kernel body as
Python, one program after another): the kernel must compile for sm_90 with the launch's argument types,
constexprs and options, down to ptxas, and fit sm_90's shared memory (GpuCompiler; violation "gpu_compile: ...",
the kernel does not run), and its grid CUDA's limits; its programs overlap, switching at atomics, under the
grid's order, its reverse, all resident at once and random schedules, one per run of the case
(triton_schedule.Schedule; violation "deadlock: ..." when they all wait forever), and one that stores (or updates
atomically) a byte another program accesses without an atomic is a violation "race: ..." (triton_memory.Programs);
the autotuner benchmarks every config, skipping those out of sm_90's resources, and the runs of a case take every
config of every tuning and every pair of two tunings' configs (hook_autotune, autotune_choice). All live in Triton's own classes, patched here before the candidate's text runs; the accepted
language names neither these classes nor their modules.
"""

import os
import pickle
import sys
import tempfile

import numpy as np
import triton.language as tl


# sm_90 (H100 / H200), the target every interpreted kernel must also compile for, with what a launch there may use:
# shared memory per block (the opt-in maximum) and warps per block (1024 threads); the grid limits: memory._GPU_GRID
_GPU_TARGET = ("cuda", 90, 32)
_GPU_SHARED_BYTES = 232448
_GPU_WARPS = 32
_BENCH_CALLS = 2       # launches of each config while autotuning (Triton's do_bench: warm-up, then repetitions)
SCHEDULES = 4          # runs of a case in which programs of a launch met in atomics: grid order, reverse, 2 random


class GpuCompiler:
    """Compiles each interpreted launch's kernel for sm_90 with that launch's argument types, constexprs and options, as
    JITFunction.run would on a GPU (Triton's NVIDIA backend down to ptxas); a launch whose kernel does not compile,
    or needs more shared memory or threads than an sm_90 block has, never runs. The interpreter accepts what the GPU
    compiler refuses (kernel values as Python ints and bools, host functions over them), so only code that compiles
    for a GPU is rewarded. Compiling starts processes (ptxas), which the candidate's own process may not: a process
    forked before the candidate runs (_serve_compiles) does it, one request at a time over two pipes. Results are
    cached per kernel name (what the compiling process looks up; every run of a case loads the module afresh) and
    specialisation for the whole run."""

    def __init__(self, text: str, load):
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        if os.fork() == 0:
            os.close(req_w)
            os.close(rep_r)
            _serve_compiles(text, load, req_r, rep_w)
            os._exit(0)
        os.close(req_r)
        os.close(rep_w)
        self.requests, self.replies = os.fdopen(req_w, "wb"), os.fdopen(rep_r, "rb")
        self.backend = make_backend(GPUTarget(*_GPU_TARGET))
        self.binders, self.results = {}, {}
        self.skippable = set()     # problems Triton's autotuner skips a config for (Autotuner._bench: out of resources,
        #                            ptxas, static_assert), where any other fails the launch

    def problem(self, kernel, args: tuple, kwargs: dict) -> str | None:
        """Why `kernel` launched with these arguments does not compile for sm_90, else None."""
        from triton import knobs
        from triton.runtime.jit import JITFunction, create_function_from_signature
        name = kernel.fn.__name__
        if name not in self.binders:
            jit = JITFunction(kernel.fn, **kernel.kwargs)
            self.binders[name] = jit, create_function_from_signature(jit.signature, jit.params, self.backend)
        jit, binder = self.binders[name]
        kwargs = {**kwargs, "debug": kwargs.get("debug", jit.debug) or knobs.runtime.debug,     # as JITFunction.run
                  "instrumentation_mode": knobs.compilation.instrumentation_mode,
                  "fpsan_homomorphic_casts": knobs.compilation.fpsan_homomorphic_casts}
        try:
            bound, specialization, options = binder(*args, **kwargs)
            key = (name, str(specialization), str(options))
            if key not in self.results:
                options, signature, constexprs, attrs = jit._pack_args(self.backend, kwargs, bound, specialization,
                                                                       options)
                self.results[key] = self._ask(name, (signature, constexprs, attrs, options.__dict__))
        except Exception as e:          # binding the launch as a GPU would (unknown keywords, unusable arguments)
            return f"{name}: {type(e).__name__}: {e}"
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
        if reply.startswith(_SKIPPED):
            reply = reply.removeprefix(_SKIPPED)
            self.skippable.add(f"{name}: {reply}")
        return f"{name}: {reply}" if reply else None


_SKIPPED = "\x00"     # the compiling process's mark before a reply that Triton's autotuner skips a config for


def _serve_compiles(text: str, load, requests: int, replies: int) -> None:
    """The compiling process (GpuCompiler): runs the candidate's module again, in a directory of its own (its
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
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import cache
    from triton.runtime.errors import PTXASError
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
                module = module or load(text)
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
                    reply = reply and _SKIPPED + reply       # OutOfResources at a GPU's launch
            except Exception as e:       # the compiler's verdict: where, the source line there, what
                lines = [line.strip() for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
                reply = " | ".join([lines[0], lines[-3], lines[-1]] if len(lines) > 3 else lines)
                reply = _SKIPPED + reply if isinstance(e, (CompileTimeAssertionFailure, PTXASError)) else reply
            data = reply.encode("utf-8", "replace")
            out.write(len(data).to_bytes(8, "little") + data)
            out.flush()


def _warm_up(x_ptr):
    """Compiled for sm_90 as soon as the compiling process starts, while the candidate's module imports: Triton's
    first compile in a process imports its code generator and asks ptxas its version (0.1 s)."""
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


_SEMANTICS = "_triton_gpu_semantics"      # the interpreter's global through which rewritten kernels reach _Semantics


class _Semantics:
    """Python's builtins and boolean operators on kernel values as Triton's code generator compiles them (the
    interpreter runs them as Python: max(x, slope * x) on blocks compared the blocks as a whole and returned one
    of them, `x and y` returned one operand, `not x` a Python bool). Each method mirrors its counterpart in
    triton/compiler/code_generator.py, calling the same triton.language functions with the interpreter's
    semantic, so what the compiler refuses fails here too."""

    @staticmethod
    def call(fn, *args, **kwargs):
        """fn(*args, **kwargs), where fn is the builtin min or max: builtin_min / builtin_max as the compiler's
        builtin namespace maps them (all constexprs or Python scalars: Python's min / max; else tl.minimum /
        tl.maximum folded left with propagate_nan NONE, NaN-ignoring as sm_90's minnum / maxnum)."""
        from triton.language.core import _unwrap_if_constexpr, builtin_max, builtin_min
        from triton.runtime.interpreter import interpreter_semantic
        builtin = {min: builtin_min, max: builtin_max}.get(fn) if type(fn) is type(min) else None
        if builtin is None:
            return fn(*args, **kwargs)
        return builtin(*map(_unwrap_if_constexpr, args), **kwargs, _semantic=interpreter_semantic)

    @staticmethod
    def bool_op(method: str, *operands):
        """`a and b ...` / `a or b ...` (operands: thunks, evaluated lazily): constexprs short-circuit, the kernel
        values left are combined right to left by logical_and / logical_or (code_generator's
        _apply_boolean_values)."""
        from triton.compiler.code_generator import _is_dynamic_boolean_operand
        dynamic = []
        for operand in operands:
            value = operand()
            if not _is_dynamic_boolean_operand(value):
                if bool(value) is (method == "logical_or"):
                    return value
            else:
                dynamic.append(value)
        if not dynamic:
            return value
        while len(dynamic) >= 2:
            rhs, lhs = dynamic.pop(), dynamic.pop()
            dynamic.append(getattr(lhs, method)(rhs))
        return dynamic[0]

    @staticmethod
    def not_(value):
        """`not value`: the value's __not__ (a kernel value: logical not, which sm_90 refuses for non-int1
        tensors), else constexpr(not value) (code_generator's visit_UnaryOp)."""
        return value.__not__() if hasattr(type(value), "__not__") else tl.constexpr(not value)

    @staticmethod
    def truth(value):
        """The condition of an `if`, `while` or conditional expression: a block of more than one element has no
        truth value (the compiler refuses it; the interpreter took it as True)."""
        if isinstance(value, tl.tensor) and value.handle.data.size > 1:
            raise ValueError("Boolean value of Tensor with more than one value is ambiguous")
        return value

    @staticmethod
    def assert_(test, msg=""):
        """`assert test, msg`: tl.device_assert (code_generator's visit_Assert), a no-op unless debugging."""
        from triton.runtime.interpreter import interpreter_semantic
        return tl.device_assert(test, msg, _semantic=interpreter_semantic)


def gpu_transformer():
    """Triton's interpreter rewrite (ASTTransformer) plus _Semantics: in a kernel body, calls of `min` / `max`,
    `and` / `or`, `not`, the conditions of if / while / conditional expressions and `assert` go through
    _Semantics, reached by the global _SEMANTICS that the interpreter copies into every kernel's module (the
    linter refuses files that bind it: triton_language._triton_reads)."""
    import ast
    from triton.runtime.interpreter import ASTTransformer

    def semantics(method: str, args: list, keywords=()) -> ast.Call:
        return ast.Call(ast.Attribute(ast.Name(_SEMANTICS, ast.Load()), method, ast.Load()), args, list(keywords))

    def thunk(value) -> ast.Lambda:
        return ast.Lambda(ast.arguments([], [], None, [], [], None, []), value)

    class GpuTransformer(ASTTransformer):
        def visit_Call(self, node):
            node = self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
                return ast.copy_location(semantics("call", [node.func, *node.args], node.keywords), node)
            return node

        def visit_BoolOp(self, node):
            node = self.generic_visit(node)
            method = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
            return ast.copy_location(semantics("bool_op", [ast.Constant(method), *map(thunk, node.values)]), node)

        def visit_UnaryOp(self, node):
            node = self.generic_visit(node)
            return ast.copy_location(semantics("not_", [node.operand]), node) if isinstance(node.op, ast.Not) \
                else node

        def visit_If(self, node):
            node = self.generic_visit(node)
            node.test = ast.copy_location(semantics("truth", [node.test]), node.test)
            return node

        visit_While = visit_IfExp = visit_If

        def visit_Assert(self, node):
            node = self.generic_visit(node)
            return ast.copy_location(ast.Expr(semantics("assert_", [node.test] + ([node.msg] if node.msg else []))),
                                     node)

    return GpuTransformer()


def hook_semantics() -> None:
    """Every interpreted kernel (the candidate's, its @jit helpers, triton.language's own) rewritten by
    gpu_transformer."""
    from triton.runtime import interpreter
    setattr(interpreter, _SEMANTICS, _Semantics)
    interpreter.FunctionRewriter.ast_transformer = gpu_transformer()


def hook_schedule(programs, schedule) -> None:
    """Run each interpreted launch's programs under `schedule`: the interpreter's loop over the grid defers to it
    (GridExecutor.__call__ hands it the executor, set_grid_dim the launch), every atomic operation goes through
    Schedule.atomic, and tl.atomic_poll polls with atomic loads (the interpreter's own busy loop would spin
    forever inside one program)."""
    from triton.runtime.interpreter import GridExecutor, InterpreterBuilder as B, TensorHandle, _get_np_dtype, \
        _interpreter
    from triton_memory import _bytes, _grid_index
    call, set_dim, set_idx = GridExecutor.__call__, B.set_grid_dim, B.set_grid_idx

    def grid_call(self, *args, **kwargs):
        schedule.executor, fn = self, self.fn
        try:
            return call(self, *args, **kwargs)
        finally:
            schedule.executor, self.fn = None, fn

    def set_grid_dim(self, nx, ny, nz):
        out = set_dim(self, nx, ny, nz)
        schedule.start(nx * ny * nz, lambda p: (setattr(programs, "program", p),
                                                set_idx(self, *_grid_index(p, (nx, ny, nz)))), programs.done)
        return out

    def scheduled(method, where):      # where(args) -> (pointers, mask) of the atomic
        def run(self, *args):
            ptrs, mask = where(args)
            mask = TensorHandle(np.ones(ptrs.data.shape, np.bool_), tl.int1) if mask is None else mask
            dtype = _get_np_dtype(ptrs.get_element_ty())
            return schedule.atomic(lambda: method(self, *args), lambda: _interpreter.load(
                ptrs.data, mask.data, np.zeros(ptrs.data.shape, dtype), dtype).tobytes(), _bytes(ptrs, mask))
        return run

    def atomic_poll(self, ptr, expected, timeout_ns, sem, scope):
        mask, tries = TensorHandle(np.ones(ptr.data.shape, np.bool_), tl.int1), 0
        while True:       # unchanged reads block the program until another changes the flag (Schedule.atomic)
            matched = self.create_atomic_load(ptr, mask, sem, scope).data == expected.data
            tries += 1
            if matched.all() or isinstance(timeout_ns, TensorHandle) and tries > 1:    # no timeout: an ir.value()
                return TensorHandle(matched, tl.int1)

    GridExecutor.__call__, B.set_grid_dim = grid_call, set_grid_dim
    for name, where in (("create_atomic_rmw", lambda a: (a[1], a[3])), ("create_atomic_cas", lambda a: (a[0], None)),
                        ("create_atomic_load", lambda a: (a[0], a[1])),
                        ("create_atomic_store", lambda a: (a[0], a[2]))):
        setattr(B, name, scheduled(getattr(B, name), where))
    B.create_atomic_poll = atomic_poll


def hook_autotune(interpreted) -> None:
    """The autotuner as on a GPU (the interpreter has no benchmarker). Every tuning in a run (an autotuner's first call
    of the run for a key: a "chooser", numbered in the order the run meets them) either tunes, launching every
    config that Triton's own pruning keeps _BENCH_CALLS times on the real arguments through the checked launch path
    (sm_90 compile, bounds, race, the run's schedule), with the hooks Triton runs around them (reset_to_zero,
    restore_value), or only chooses, launching nothing and leaving no trace (no reset after it), as every call
    after the first does on a GPU. Which config each chooser takes in each run is autotune_choice's: every config
    of every chooser in a run that tunes and in one that only chooses, every pair of configs of two choosers in a
    run that only chooses; the case runs autotune_runs of them (Interpreted.learn). A config whose launch runs out
    of sm_90's resources (or that ptxas or a static_assert refuses) raises OutOfResources while tuning, which
    Triton's Autotuner._bench turns into an infinite time: never chosen, as on a GPU; when every config fails, Triton
    takes the first, whose launch is a gpu_compile violation. A single config is not benchmarked (as Triton).
    Every run's first call tunes: later runs load a fresh module, and the first run of a case drops what an earlier
    case tuned (`tuned`: the run each autotuner last tuned in, kept here, out of the candidate's reach)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.errors import OutOfResources
    run, prune = Autotuner.run, Autotuner.prune_configs
    tuned = {}

    def tuned_run(self, *args, **kwargs):
        if tuned.get(self) != interpreted.serial:          # the run's first call tunes
            tuned[self] = interpreted.serial
            self.cache.clear()
        if interpreted.tunes():
            return run(self, *args, **kwargs)
        hook, self.pre_hook = self.pre_hook, lambda *_, **__: None    # only choosing leaves no trace (no
        try:                                                           # reset_to_zero after the benchmark)
            return run(self, *args, **kwargs)
        finally:
            self.pre_hook = hook

    def prune_configs(self, kwargs):
        configs = prune(self, kwargs)
        self.chooser = interpreted.chooser(len(configs)) if len(configs) > 1 else None
        return configs

    def bench(self):
        def do_bench(kernel_call, quantiles):
            chooser = self.chooser
            i = chooser["next"]
            chooser["next"] += 1
            interpreted.benchmarking = chooser["tunes"]
            try:
                for _ in range(_BENCH_CALLS if chooser["tunes"] else 0):
                    kernel_call()
                if i in chooser["skipped"]:
                    raise OutOfResources(0, 0, "the config ran out of resources while tuning")
            except OutOfResources:
                chooser["skipped"].add(i)
                raise
            finally:
                interpreted.benchmarking = False
                if chooser["next"] == chooser["configs"]:
                    interpreted.learn(chooser)
            target = chooser["target"]
            return [(0.0 if i == target else 1.0) if target is not None else 1.0 + i] * len(quantiles)
        return do_bench

    Autotuner.run, Autotuner.prune_configs, Autotuner.do_bench = tuned_run, prune_configs, property(bench)


MAX_RUNS = 72          # runs of one case at most (the parent's _MAX_RUNS): one autotuner of up to 36 configs, two
#                        of up to 8 each (autotune_runs)


def _smallest_prime(n: int) -> int:
    p = max(2, n)
    while any(p % d == 0 for d in range(2, int(p ** 0.5) + 1)):
        p += 1
    return p


def autotune_runs(sizes: list) -> int:
    """Runs of a case whose choosers (tunings met in a run, in order) have `sizes` configs that fit: a run that
    tunes and one that only chooses for each config of the largest, then runs that only choose until every pair of
    configs of two choosers has met (the product of the two sizes; for three or more, P * P runs for a prime P at
    least the largest size and the number of choosers: autotune_choice)."""
    top, multi = max(sizes, default=1), [m for m in sizes if m > 1]
    if len(multi) < 2:
        return 2 * top
    return top + (multi[0] * multi[1] if len(multi) == 2 else _smallest_prime(max(top, len(multi))) ** 2)


def autotune_choice(sizes: list, t: int, run: int) -> tuple:
    """(whether run `run` tunes, the position among chooser t's fitting configs it takes). Runs 2j < 2n (n: the
    largest size) tune and take config j; the others only choose, the q-th of them (q = j for run 2j + 1 < 2n,
    run - n after) taking config q of every chooser when at most one chooser has two configs or more; else the two
    take (q mod m0, q div m0), or, for three or more, chooser u (its rank among them) takes (a + u b) mod P with
    a = q mod P, b = q div P: for any two choosers u != v, (a + u b, a + v b) meets every pair once as q runs over
    P * P (P prime, at least the number of choosers)."""
    top = max(sizes, default=1)
    size = sizes[t] if t < len(sizes) else 1
    if run < 2 * top and run % 2 == 0:
        return True, run // 2 % size
    q = run // 2 if run < 2 * top else run - top
    multi = [u for u, m in enumerate(sizes) if m > 1]
    if size == 1 or len(multi) < 2:
        return False, q % size
    u = multi.index(t)
    if len(multi) == 2:
        return False, (q % sizes[multi[0]] if u == 0 else q // sizes[multi[0]]) % size
    p = _smallest_prime(max(top, len(multi)))
    return False, (q % p + u * (q // p)) % p % size


class Interpreted:
    """What the harness adds to interpreted launches (CPU): the sm_90 compile and the race-checked grid. A case
    runs once, then again with run_index 1, 2, ... (a fresh module and model, the same inputs) until `runs`: a
    launch raises `runs` with want_runs where one run cannot show what a GPU may do (programs that meet in
    atomics, autotune configs); the parent compares every run with the reference. The harness sets run_index
    before every run (0: a new case)."""
    def __init__(self, text: str, load):
        from triton_memory import Programs                  # shipped beside this file, as is triton_schedule
        from triton_schedule import Deadlock, Schedule
        self.compiler, self.programs, self.schedule = GpuCompiler(text, load), Programs(), Schedule()
        self.Deadlock = Deadlock
        self.runs, self.serial = 1, 0           # serial: counts runs (of every case)
        self.fitting, self.skipped = [], []     # per chooser of the case: the configs that fit, those skipped
        self.met, self.benchmarking, self.refused = 0, False, []   # choosers met in this run; inside a benchmark

    @property
    def run_index(self) -> int:
        """Which run of the case runs now (0 first; the harness sets it): picks the schedule."""
        return self.schedule.run_index

    @run_index.setter
    def run_index(self, value: int) -> None:
        self.schedule.run_index, self.serial, self.met = value, self.serial + 1, 0
        if value == 0:
            self.fitting, self.skipped, self.refused = [], [], []

    def want_runs(self, n: int) -> None:
        """The case that runs now needs n runs in all (at most MAX_RUNS)."""
        self.runs = max(self.runs, min(n, MAX_RUNS))

    def tunes(self) -> bool:
        """Whether the run that runs now tunes (autotune_choice)."""
        return autotune_choice([len(f) for f in self.fitting], 0, self.run_index)[0]

    def chooser(self, configs: int) -> dict:
        """The next tuning of this run, among `configs` configs: whether it tunes, which config it takes (its
        position; None until its first tuning has shown which fit: then the first that fits), those skipped."""
        t, self.met = self.met, self.met + 1
        tunes, target = self.tunes(), None
        if t < len(self.fitting) and self.fitting[t]:
            target = self.fitting[t][autotune_choice([len(f) for f in self.fitting], t, self.run_index)[1]]
        return {"t": t, "configs": configs, "next": 0, "tunes": tunes, "target": target,
                "skipped": set(self.skipped[t]) if t < len(self.skipped) else set()}

    def learn(self, chooser: dict) -> None:
        """A chooser's first tuning ended: which of its configs fit; the case needs autotune_runs for all."""
        if chooser["t"] < len(self.fitting) or not chooser["tunes"]:
            return
        skipped = chooser["skipped"]
        self.skipped.append(skipped)
        self.fitting.append([i for i in range(chooser["configs"]) if i not in skipped] or [0])
        need = autotune_runs([len(f) for f in self.fitting])
        if need <= MAX_RUNS:
            self.want_runs(need)
        elif not self.refused:        # refused: no run more
            self.refused.append(f"launch: autotune: {len(self.fitting)} tunings with {[len(f) for f in self.fitting]} "
                                f"configs that fit need {need} runs to check each config and each pair, more than "
                                f"{MAX_RUNS}")

    def launch_problem(self, kernel, args: tuple, kwargs: dict) -> str | None:
        """Why sm_90 refuses this launch (GpuCompiler.problem), else None; while tuning, a problem that Triton's
        autotuner skips a config for raises OutOfResources instead (Autotuner._bench catches it)."""
        from triton.runtime.errors import OutOfResources
        problem = self.compiler.problem(kernel, args, kwargs)
        if problem and self.benchmarking and problem in self.compiler.skippable:
            raise OutOfResources(0, 0, problem)
        return problem

    def finish(self, kernel: str, arguments: dict, deadlock: BaseException | None = None) -> list:
        """The violations of the launch that just ran (or deadlocked), and an autotuner's refusal; a launch whose
        programs met in atomics asks for SCHEDULES runs of its case."""
        found = self.programs.finish(kernel, arguments)
        if len(self.schedule.atomics) > 1:
            self.want_runs(SCHEDULES)
        return found + self.refused + ([f"deadlock: {kernel}: {deadlock} (run {self.run_index})"] if deadlock else [])

    def hook(self) -> None:
        from triton_memory import hook_programs
        hook_programs(self.programs)
        hook_schedule(self.programs, self.schedule)
        hook_autotune(self)
        hook_numerics()
        hook_reorder()
        hook_semantics()


def hook_numerics() -> None:
    """tl.dot as sm_90 computes it: fp32 operands rounded to TF32 (10 mantissa bits) when the effective input
    precision is tf32, the default for fp32 there; ieee and tf32x3 stay exact (tf32x3 is within fp32 rounding of
    it). The interpreter multiplies in full fp32 whatever the precision, so a kernel that needs ieee for the task's
    1e-4 tolerance and does not ask for it passed on CPU and failed on a GPU."""
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder as B, TensorHandle, _round_f32_to_tf32
    dot = B.create_dot

    def create_dot(self, a, b, d, input_precision, *rest):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = (TensorHandle(_round_f32_to_tf32(x.data), x.dtype.scalar) if x.dtype.scalar == tl.float32 else x
                    for x in (a, b))
        return dot(self, a, b, d, input_precision, *rest)
    B.create_dot = create_dot



def hook_reorder() -> None:
    """Elements in an order a GPU may produce: `tl.cat` (`can_reorder=True`; Triton's cat op "always may reorder
    elements": sm_90 concatenates each thread's registers, so the result's order follows the layout) and
    `tl.reshape(..., can_reorder=True)` / `tl.view` leave the order of the result unspecified, where the
    interpreter keeps it. Their result comes out in a random order (a permutation drawn at every call, from
    os.urandom), so only uses that do not depend on it (reductions, a sum of the whole) give the same answer."""
    from triton.runtime.interpreter import InterpreterBuilder as B, TensorHandle
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    cat, reshape = B.create_cat, B.create_reshape

    def shuffled(handle):
        data = handle.data.ravel()
        return TensorHandle(data[rng.permutation(data.size)].reshape(handle.data.shape), handle.dtype.scalar)

    def create_cat(self, lhs, rhs):
        return shuffled(cat(self, lhs, rhs))

    def create_reshape(self, arg, shape, allow_reorder):
        out = reshape(self, arg, shape, allow_reorder)
        return shuffled(out) if allow_reorder else out

    B.create_cat, B.create_reshape = create_cat, create_reshape

"""AutoTriton reward: 1.0 only if the completion's code passes the rule-based Triton linter AND matches the
PyTorch reference in the sandbox; else 0.0 with a reason code.

    score, info = triton_reward(completion, task, timeout_s=60)
    task: {"name": str, "reference_code": str defining Model, get_inputs(), get_init_inputs(), ...}
    completion: model output; the code is the last ```python block (an unclosed last block counts), or the
                whole text if there is none
    info: {"reason": str, "detail": str, "time_s": float, "not_enforced": [str], "max_abs_err": float,
           "speedup": float (CUDA only)}

AutoTriton (SFT then GRPO): reward = is_triton(code) AND passes tests. The linter (`lint`) reads exactly the
text that will run (utf-8, no other coding declaration) and needs an `@triton.jit` kernel launched on
ModelNew.forward's call path, no torch compute op standing in for it (called or loaded as an attribute), no
tensor -> numpy / Python bridge, no try/except fallback, no monkey-patching, only exact allowed names of torch
/ torch.nn / triton(.language) / math / typing / functools (never a module reached through one, never a
module as a value), no eval/exec/open/getattr/type/dunder or frame access, kernels reading only constexpr
globals. Execution (`execute`): the reference runs once per task in its own sandboxed process (cached) on
inputs from seeds drawn per process and never shown to the candidate; the candidate runs in another sandbox
(rewards/triton_harness.py) that gets the init seed, init inputs and parameters, builds ModelNew, and only
then decodes the inputs; its outputs, its inputs after the call and its audit come back as a safetensors
file that this process validates field by field before comparing (torch.allclose, atol = rtol = 1e-4 fp32,
1e-2 fp16/bf16, exact for integers) and checking mutation, so patching allclose, timers or the harness inside
the sandbox changes nothing here. The audit (no threads, no numpy bridges, no torch compute in forward
outside kernels, real launches) runs in the candidate's process: it binds code that passed the linter, which
cannot reach it. On CPU the kernels run under TRITON_INTERPRET=1; on CUDA on the GPU, with the speedup.

Reason codes, in the order they are checked:
  no_code; lint_encoding, syntax_error, lint_try_except, lint_monkeypatch, lint_forbidden_call, lint_import,
  lint_no_model, lint_no_kernel, lint_kernel_not_launched, lint_torch_op (static, or at run time: detail
  starts "runtime"); no_sandbox (no bwrap and no opt-out: rewards/sandbox.py); reference_error (the task's
  own code failed), sandbox_error; timeout, oom (the sandbox's memory cgroup), crash (killed by a signal,
  exited non-zero or wrote a malformed result), early_exit (exited before writing a result, or SystemExit);
  compile_error (module import or Triton compilation failed), oom, runtime_error; input_mutated,
  wrong_output; ok; reward_error (a failure of the reward itself: it never raises).
"""

import ast
import builtins
import codecs
import functools
import importlib
import io
import json
import math
import os
import secrets
import threading
import time
import tokenize
import types
from collections import OrderedDict

from rewards.code import extract_code
from rewards.sandbox import refusal, run_python

# (input seed, init seed) per case: drawn per process, never shown to the candidate, so neither its module
# body nor __init__ can regenerate the inputs; the init seed alone is shared (it reproduces the reference's
# parameters when ModelNew builds them in the same order)
SEEDS = tuple((secrets.randbits(31), secrets.randbits(31)) for _ in range(3))
REFERENCE_TIMEOUT_S = 120      # the task's own code: trusted to finish, run once per task and process
_HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_harness.py")
_SCRIPT = "import triton_harness; triton_harness.main()"
_REF_CACHE_SIZE = 256
_ref_cache: "OrderedDict[tuple, dict]" = OrderedDict()   # (reference_code, device) -> parsed ref.pt
_ref_lock = threading.Lock()                              # triton_eval scores from threads

_ALLOWED_MODULES = ("torch", "torch.nn", "triton", "triton.language", "triton.language.math",
                    "triton.language.extra", "triton.language.extra.libdevice", "math", "typing", "functools",
                    "__future__")
# modules whose public names (their __all__, else dir(); never a module) are allowed as exact paths
_API_MODULES = ("triton.language", "triton.language.math", "triton.language.extra.libdevice", "math", "typing",
                "functools")
_TRITON_TOP = ("jit", "autotune", "Config", "heuristics", "cdiv", "next_power_of_2")
_FORBIDDEN_NAMES = frozenset("eval exec compile open __import__ getattr setattr delattr globals locals vars "
                             "breakpoint input exit quit memoryview help type".split())
# introspection attributes (frames, code objects, generator and traceback internals) reach the harness's
# variables without a dunder; `handle` is the interpreter's numpy array behind a Triton value
_FORBIDDEN_ATTRS = frozenset("""
gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code ag_await f_back f_globals f_locals
f_builtins f_code f_trace tb_frame tb_next co_code co_consts co_names func_globals handle
""".split())
_ALLOWED_DUNDERS = frozenset(("__init__", "__name__"))
# torch names code outside ModelNew.__init__ may use: allocation, dtypes, devices, types; the rest is compute.
_TORCH_OK = frozenset("torch." + n for n in """
empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange Tensor Size device dtype
finfo iinfo is_tensor no_grad inference_mode get_default_dtype cuda.current_device cuda.is_available
cuda.device nn.Module nn.Parameter autograd.Function float float16 float32 float64 half bfloat16 double int int8
int16 int32 int64 long uint8 bool
""".split())
# ModelNew.__init__ and kernels may also build parameters; nothing may reach torch.utils (C++ extensions),
# torch.compile / jit / ops / _C / library, loading files, ...: every torch name outside these two sets.
_TORCH_INIT_OK = _TORCH_OK | frozenset("torch." + n for n in """
randn rand randint randn_like rand_like randint_like tensor as_tensor manual_seed
""".split())
# torch.nn names __init__ may use to build parameters (exact: torch.nn.functional.* and anything reached
# through a module attribute, like torch.nn.functional.torch, are not in the list)
_TORCH_INIT_OK |= frozenset("torch.nn." + n for n in """
Linear Bilinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d Embedding EmbeddingBag
LayerNorm GroupNorm RMSNorm BatchNorm1d BatchNorm2d BatchNorm3d InstanceNorm1d InstanceNorm2d InstanceNorm3d
Dropout Identity Sequential ModuleList ModuleDict ParameterList ParameterDict Buffer MultiheadAttention PReLU
init.uniform_ init.normal_ init.constant_ init.ones_ init.zeros_ init.eye_ init.xavier_uniform_
init.xavier_normal_ init.kaiming_uniform_ init.kaiming_normal_ init.trunc_normal_ init.orthogonal_
init.calculate_gain init._calculate_fan_in_and_fan_out
""".split())
# method names that compute on a tensor (also with a trailing "_": add_ is add; apply_ only with it, as
# autograd.Function.apply is fine); loading one as an attribute counts as much as calling it (f = x.exp)
_COMPUTE_METHODS = frozenset("""
abs absolute neg negative add sub subtract mul multiply div divide true_divide floor_divide remainder fmod pow
reciprocal sqrt rsqrt exp exp2 expm1 log log2 log10 log1p sin cos tan tanh sinh cosh asin acos atan atan2
sigmoid logit relu relu6 gelu silu mish elu selu celu softplus softsign hardtanh hardswish hardsigmoid
leaky_relu erf erfc erfinv sign clamp clip clamp_min clamp_max maximum minimum max min amax amin aminmax sum
nansum mean nanmean prod std var norm cumsum cumprod cummax cummin logcumsumexp logsumexp softmax log_softmax
matmul mm bmm mv dot vdot addmm addbmm baddbmm addmv addr addcmul addcdiv einsum outer ger inner lerp where
masked_fill masked_scatter argmax argmin topk sort argsort kthvalue median mode any all square tril triu diff
layer_norm rms_norm group_norm batch_norm linear bilinear conv1d conv2d conv3d floor ceil round trunc frac eq ne
lt le gt ge logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not
scatter scatter_add scatter_reduce index_add index_select index_put gather take put cross kron tensordot
apply_ map_ map2_ renorm dist cdist histc bincount unique nan_to_num item
""".split())
# tensor -> numpy / Python data or raw memory: forbidden everywhere, __init__ and kernels included
_BRIDGE_METHODS = frozenset("numpy tolist untyped_storage storage _typed_storage".split())
_LINT_ORDER = ("lint_encoding", "lint_try_except", "lint_monkeypatch", "lint_forbidden_call", "lint_import",
               "lint_no_model", "lint_no_kernel", "lint_kernel_not_launched", "lint_torch_op")
_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}   # atol = rtol by output dtype; other floats 1e-4


@functools.cache
def _api_names() -> frozenset:
    """Exact dotted names of triton, triton.language (.math, .extra.libdevice), math, typing and functools that
    code may use: their public non-module names. A module reached as an attribute (typing.sys, triton.knobs)
    is never one of them."""
    names = {f"triton.{n}" for n in _TRITON_TOP}
    for mod in _API_MODULES:
        module = importlib.import_module(mod)
        for n in getattr(module, "__all__", None) or dir(module):
            value = getattr(module, n, None)
            if n.startswith("_") or isinstance(value, types.ModuleType) or \
                    mod.startswith("triton") and not (getattr(value, "__module__", None) or "triton").startswith("triton"):
                continue
            names.add(f"{mod}.{n}")
    return frozenset(names)


@functools.cache
def _allowed_paths(strict: bool) -> tuple:
    """(exact names, their proper prefixes) allowed in strict code (outside ModelNew.__init__ and kernels) or in
    the rest."""
    exact = _api_names() | (_TORCH_OK if strict else _TORCH_INIT_OK)
    prefixes = {name.rsplit(".", k)[0] for name in exact for k in range(1, name.count(".") + 1)}
    return exact, frozenset(prefixes)


def _dotted(node) -> str | None:
    """"a.b.c" for an Attribute chain on a Name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


class _Linter(ast.NodeVisitor):
    """Collects (reason, detail) problems of one module; `lint` reports the first in _LINT_ORDER."""

    def __init__(self, tree: ast.Module):
        self.problems = []
        self.aliases = {}          # local name -> dotted module path or torch/triton object, from imports
        self.scopes = []           # stack of local-name sets of the enclosing functions
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
        self.visit(tree)
        self._structure(tree)

    def flag(self, reason: str, node, what: str) -> None:
        self.problems.append((reason, f"line {node.lineno}: {what}" if hasattr(node, "lineno") else what))

    def resolve(self, node) -> str | None:
        """Dotted name with its root import alias expanded (tl.load -> triton.language.load); None if the
        root is not an imported name."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        root, _, rest = dotted.partition(".")
        if root not in self.aliases:
            return None
        return self.aliases[root] + ("." + rest if rest else "")

    # ---- imports, forbidden names, try/except, monkey-patching: the whole module ----
    def _import(self, node) -> None:
        if isinstance(node, ast.Import):
            pairs = [(a.name, a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                     for a in node.names]
        else:
            pairs = [(node.module or "", a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
        exact = _allowed_paths(False)[0]
        for module, local, target in pairs:
            if local == "*":
                self.flag("lint_import", node, f"from {module} import *")
            elif module.startswith("torch") and module not in _ALLOWED_MODULES:
                self.flag("lint_torch_op", node, f"imports {module}")
            elif module not in _ALLOWED_MODULES:
                self.flag("lint_import", node, f"imports {module}")
            elif not (target in _ALLOWED_MODULES or target in exact or module == "__future__"):
                self.flag("lint_torch_op" if target.startswith("torch") else "lint_import", node,
                          f"imports {target} (not an allowed name)")
            self.aliases[local] = target

    def visit_Try(self, node):
        self.flag("lint_try_except", node, "try/except (a fallback path)")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Name(self, node):
        if node.id in _FORBIDDEN_NAMES:
            self.flag("lint_forbidden_call", node, f"uses {node.id}")
        elif node.id.startswith("__") and node.id not in _ALLOWED_DUNDERS:
            self.flag("lint_forbidden_call", node, f"uses {node.id}")

    def visit_Attribute(self, node):
        if node.attr.startswith("__") and node.attr not in _ALLOWED_DUNDERS or node.attr in _FORBIDDEN_ATTRS:
            self.flag("lint_forbidden_call", node, f"uses .{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node)
        self.generic_visit(node)

    def _check_store(self, node) -> None:
        """An attribute/item store is a monkey-patch when its root is a module, a builtin, or (for attributes)
        anything that is not a local of the enclosing functions (module-level `Class.attr = ...` included)."""
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
            root = root.func if isinstance(root, ast.Call) else root.value
        name = root.id if isinstance(root, ast.Name) else None
        local = any(name in scope for scope in self.scopes)
        if name in self.aliases or (name in vars(builtins) and not local) or \
                (isinstance(node, ast.Attribute) and not local):
            self.flag("lint_monkeypatch", node, f"assigns to {ast.unparse(node)}")

    def visit_FunctionDef(self, node):
        if getattr(node, "name", "").startswith("__") and node.name not in _ALLOWED_DUNDERS:
            self.flag("lint_forbidden_call", node, f"defines {node.name} (only __init__ may be defined)")
        self.scopes.append(_local_names(node))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    # ---- kernels and the forward call path ----
    def _is_jit(self, fn) -> bool:
        return any(self.resolve(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in fn.decorator_list)

    def _structure(self, tree: ast.Module) -> None:
        funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes = {n.name: {m.name: m for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                   for n in tree.body if isinstance(n, ast.ClassDef)}
        kernels = {name for name, fn in funcs.items() if self._is_jit(fn)}
        for name in kernels:
            self._kernel_globals(funcs[name], tree, kernels)
        model = classes.get("ModelNew", {})
        if "forward" not in model:
            self.flag("lint_no_model", tree, "no class ModelNew with a forward method")
            return
        if not kernels:
            self.flag("lint_no_kernel", tree, "no @triton.jit kernel")
            return
        reachable = self._reachable(funcs, classes, kernels)
        launched = {node.func.value.id for fn in reachable.values() for node in ast.walk(fn)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in kernels}
        if not launched:
            self.flag("lint_kernel_not_launched", model["forward"],
                      f"kernels {sorted(kernels)} are never launched (kernel[grid](...)) from ModelNew")
        exempt = {id(n) for fn in [model.get("__init__"), *(funcs[k] for k in kernels)] if fn
                  for stmt in fn.body for n in ast.walk(stmt)}
        submodules = {f"self.{s}" for s in self._submodules(model.get("__init__"))}
        for node in ast.walk(tree):
            self._torch_ops(node, submodules, strict=id(node) not in exempt)

    def _kernel_globals(self, kernel, tree: ast.Module, kernels: set) -> None:
        """A kernel body may read only its own names, imports, other kernels and `X = tl.constexpr(...)`
        globals: what the GPU compiler accepts. Anything else (a dict of tensors, a helper function) only works
        under the interpreter, where it runs as plain Python."""
        constexpr, module_names = set(), set()
        for node in tree.body:
            for target in _assigned(node):
                module_names.add(target)
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                        self.resolve(node.value.func) == "triton.language.constexpr":
                    constexpr.add(target)
        local = _local_names(kernel)
        for node in ast.walk(kernel):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in module_names and \
                    node.id not in local | kernels | constexpr | set(self.aliases):
                self.flag("lint_forbidden_call", node, f"kernel {kernel.name} reads global {node.id} (only "
                          "tl.constexpr globals and other kernels compile on a GPU)")

    def _reachable(self, funcs, classes, kernels) -> dict:
        """{(class or None, name): function node} for every method of ModelNew and everything they reach by
        name (calls, callbacks, self.method; SomeClass.apply or SomeClass(...) pull in all of SomeClass)."""
        todo, seen = [("ModelNew", m) for m in classes["ModelNew"]], {}
        while todo:
            cls, name = todo.pop()
            if (cls, name) in seen:
                continue
            fn = classes[cls][name] if cls else funcs[name]
            seen[(cls, name)] = fn
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and node.id in funcs and node.id not in kernels:
                    todo.append((None, node.id))
                elif isinstance(node, ast.Name) and node.id in classes:
                    todo.extend((node.id, m) for m in classes[node.id])
                elif cls and isinstance(node, ast.Attribute) and _dotted(node) == f"self.{node.attr}" \
                        and node.attr in classes[cls]:
                    todo.append((cls, node.attr))
        return seen

    def _submodules(self, init) -> set:
        """Names X of `self.X = nn.Something(...)` in ModelNew.__init__ (torch modules, except Parameter)."""
        found = set()
        for node in ast.walk(init) if init else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                target = self.resolve(node.value.func) or ""
                if target.startswith("torch.nn.") and target != "torch.nn.Parameter":
                    found |= {t.attr for t in node.targets if _dotted(t) == f"self.{getattr(t, 'attr', '')}"}
        return found

    def _torch_ops(self, node, submodules: set, strict: bool) -> None:
        """Flag, at one node: an imported name outside the exact allow-list (strict: everywhere but
        ModelNew.__init__ and kernel bodies, where only allocation / dtype / device names of torch are allowed;
        a module used as a value is never allowed); tensor -> numpy / Python bridges; and in strict code `@`,
        compute methods (called or only loaded) and calls of torch submodules (self.linear(x))."""
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            self._check_path(node, strict)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and self.resolve(node.value) is None:
            if node.attr in _BRIDGE_METHODS:
                self.flag("lint_torch_op", node, f"tensor method .{node.attr} (numpy / Python compute)")
            elif strict and (node.attr in _COMPUTE_METHODS or node.attr.rstrip("_") in _COMPUTE_METHODS) and \
                    _dotted(node) not in submodules:          # self.linear.weight is a parameter, not a call
                self.flag("lint_torch_op", node, f"tensor method .{node.attr}")
        if not strict:
            return
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            self.flag("lint_torch_op", node, "@ (matmul) on tensors")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func, receiver = node.func, node.func.value
            if _dotted(receiver) in submodules or _dotted(func) in submodules:
                self.flag("lint_torch_op", node, f"calls torch module {ast.unparse(func)}")

    def _check_path(self, node, strict: bool) -> None:
        """An imported name's full path (tl.load -> triton.language.load) must be an allowed exact name; a part
        of a longer chain may also be a prefix of one (torch.cuda in torch.cuda.is_available)."""
        path = self.resolve(node)
        if path is None:
            return
        parent = self.parents.get(node)
        exact, prefixes = _allowed_paths(strict)
        inner = isinstance(parent, ast.Attribute) and parent.value is node
        if path in exact or inner and (path in prefixes or path in _ALLOWED_MODULES):
            return
        what = f"uses {path}" + ("" if inner or "." in path and path not in _ALLOWED_MODULES else " as a value")
        self.flag("lint_torch_op" if path.split(".")[0] == "torch" else "lint_import", node, what)


def _local_names(fn) -> set:
    """Parameters of fn and every name it assigns."""
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    return names | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _assigned(stmt) -> list:
    """Names a module-level statement binds (assignments, defs, classes, loops, with, imports excluded)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return []
    return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _encoding_problem(code: str) -> str | None:
    """Why the bytes the sandbox writes would not decode back to exactly this text, else None: a coding
    declaration other than utf-8 (Python, and Triton reading kernel source, would run another program than
    the one linted) or characters utf-8 cannot encode (lone surrogates)."""
    try:
        data = code.encode("utf-8")
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except (UnicodeEncodeError, SyntaxError) as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    if codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        return f"coding declaration {encoding!r}: only utf-8 source is run"
    return None


def lint(code: str) -> tuple:
    """(None, "") when the code passes the rule-based check, else (reason, detail)."""
    problem = _encoding_problem(code)
    if problem:
        return "lint_encoding", problem
    try:
        problems = dict(reversed(_Linter(ast.parse(code)).problems))      # first problem of each reason wins
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:   # ValueError: NUL bytes; the others:
        return "syntax_error", f"{type(e).__name__}: {str(e)[:500]}"      # absurdly deep nesting
    for reason in _LINT_ORDER:
        if reason in problems:
            return reason, problems[reason]
    return None, ""


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sandbox(files: dict, job: dict, timeout_s: float, out: str, stdin: bytes = b""):
    """Run the harness for `job` with `files` in its scratch dir. Returns (SandboxResult, bytes of `out` or None)."""
    with open(_HARNESS_PATH) as f:
        harness = f.read()
    device = job["device"]
    env = {"TRITON_INTERPRET": "1"} if device == "cpu" else \
        {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in os.environ}
    res = run_python(_SCRIPT, {**files, "triton_harness.py": harness, "job.json": json.dumps(job)}, stdin=stdin,
                     timeout_s=timeout_s, env=env, gpu=device == "cuda", read_back=(out,))
    return res, res.files.get(out)


def _reference(reference_code: str, device: str) -> tuple:
    """(reference entry, None) for the task's reference, cached per (code, device); (None, why) on failure.
    entry: {"cases": ref.pt cases, "ms": float | None, "stdin": the candidate's stdin (inputs, init inputs,
    parameters, init seeds)}."""
    import torch
    key = (reference_code, device)
    with _ref_lock:
        if key in _ref_cache:
            _ref_cache.move_to_end(key)
            return _ref_cache[key], None
    job = {"role": "reference", "device": device, "time": device == "cuda",
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
    entry = {"cases": ref["cases"], "ms": ref["ms"], "stdin": stdin.getvalue()}
    with _ref_lock:
        _ref_cache[key] = entry
        if len(_ref_cache) > _REF_CACHE_SIZE:
            _ref_cache.popitem(last=False)
    return entry, None


def _as_bytes_tensor(value):
    """torch.save(value) as a uint8 tensor: the harness decodes it only after building the model."""
    import torch
    blob = io.BytesIO()
    torch.save(value, blob)
    return torch.frombuffer(bytearray(blob.getvalue()), dtype=torch.uint8)


_HARNESS_ERRORS = frozenset({"compile_error", "oom", "runtime_error", "early_exit"})
_META_KEYS = frozenset({"error", "detail", "n_out", "launches", "violations", "ms"})
_MAX_HEADER = 1 << 20          # bytes of safetensors header (tensor index + metadata) accepted


class Malformed(ValueError):
    """A result file that is not what the harness writes: forged, truncated or from a crashed run."""


def _int_list(value, n: int, name: str) -> list:
    if not (type(value) is list and len(value) == n and all(type(v) is int and 0 <= v < 1 << 31 for v in value)):
        raise Malformed(f"{name} is not a list of {n} small ints")
    return value


def _parse_result(blob: bytes, cases: list) -> dict:
    """The candidate's result.bin, validated field by field (type, allowed values, size) and with exactly the
    tensors the cases call for: {"error", "detail", "launches", "violations", "ms", "outputs": [[tensor]],
    "after": [{input index: tensor}]}. Raises Malformed. Nothing is unpickled and nothing is str()-ed."""
    from safetensors.torch import load as load_tensors
    if len(blob) < 8 or int.from_bytes(blob[:8], "little") > min(_MAX_HEADER, len(blob) - 8):
        raise Malformed("no safetensors header")
    try:
        header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
        meta = json.loads(header["__metadata__"]["meta"])
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise Malformed(f"header: {type(e).__name__}") from None
    if type(meta) is not dict or set(meta) != _META_KEYS:
        raise Malformed("meta fields")
    error, detail = meta["error"], meta["detail"]
    if not (error is None or type(error) is str and error in _HARNESS_ERRORS) or type(detail) is not str:
        raise Malformed("error is not one of the harness's failure reasons")
    if error is not None:
        return {"error": error, "detail": detail[:2000]}
    n = len(cases)
    n_out, launches = _int_list(meta["n_out"], n, "n_out"), _int_list(meta["launches"], n, "launches")
    violations, ms = meta["violations"], meta["ms"]
    if not (type(violations) is list and len(violations) <= 256 and
            all(type(v) is str and len(v) <= 300 for v in violations)):
        raise Malformed("violations")
    if not (ms is None or type(ms) is float and math.isfinite(ms) and 0 < ms < 1e7):
        raise Malformed("ms")
    expected = {f"out.{k}.{i}" for k in range(n) for i in range(n_out[k])} | \
        {f"after.{k}.{i}" for k, c in enumerate(cases) for i, x in enumerate(c["inputs"]) if _is_tensor(x)}
    try:
        tensors = load_tensors(blob)
    except Exception as e:      # the library's own checks of offsets, dtypes and sizes
        raise Malformed(f"tensors: {type(e).__name__}") from None
    if set(tensors) != expected:
        raise Malformed("tensor names")
    return {"error": None, "detail": "", "launches": launches, "violations": violations, "ms": ms,
            "outputs": [[tensors[f"out.{k}.{i}"] for i in range(n_out[k])] for k in range(n)],
            "after": [{i: tensors[f"after.{k}.{i}"] for i, x in enumerate(c["inputs"]) if _is_tensor(x)}
                      for k, c in enumerate(cases)]}


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _compare(cases: list, result: dict) -> tuple:
    """(reason, detail, max_abs_err) for a validated result against the reference cases."""
    import torch
    if result["error"]:
        return result["error"], result["detail"], None
    if result["violations"]:
        return "lint_torch_op", f"runtime: {result['violations'][:5]}", None
    if min(result["launches"]) < 1:
        return "lint_kernel_not_launched", "runtime: a forward call launched no Triton kernel", None
    max_err = 0.0
    for k, (case, outs, after) in enumerate(zip(cases, result["outputs"], result["after"], strict=True)):
        for i, y in after.items():
            x = case["inputs"][i]
            if not (y.shape == x.shape and y.dtype == x.dtype and torch.equal(x, y)):
                return "input_mutated", f"case {k}: input {i} changed by forward", None
        if len(outs) != len(case["outputs"]):
            return "wrong_output", f"{len(outs)} outputs, expected {len(case['outputs'])}", None
        for o, r in zip(outs, case["outputs"]):
            if o.shape != r.shape or o.dtype != r.dtype:
                return "wrong_output", f"case {k}: got {o.dtype} {tuple(o.shape)}, expected {r.dtype} " \
                                       f"{tuple(r.shape)}", None
            if not r.is_floating_point():
                if not torch.equal(o, r):
                    return "wrong_output", f"case {k}: integer output differs", None
                continue
            err = (o.double() - r.double()).abs().nan_to_num(float("inf")).max().item() if r.numel() else 0.0
            max_err = max(max_err, err)
            tol = _TOLERANCE.get(str(r.dtype).removeprefix("torch."), 1e-4)
            if not torch.allclose(o, r, atol=tol, rtol=tol, equal_nan=True):
                return "wrong_output", f"case {k}: max abs err {err:.3g} (atol=rtol={tol})", max_err
    return "ok", "", max_err


def execute(code: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """Run code's ModelNew against task["reference_code"] in the sandbox, no linting. Returns (score, info)."""
    device = _device()
    ref, problem = _reference(task["reference_code"], device)
    if problem:
        return 0.0, {"reason": "reference_error", "detail": problem}
    job = {"role": "candidate", "device": device, "time": device == "cuda"}
    res, blob = _sandbox({"candidate.py": code}, job, timeout_s, "result.bin", stdin=ref["stdin"])
    info = {"not_enforced": list(res.not_enforced)}
    if res.status in ("timeout", "sandbox_error", "oom"):
        return 0.0, {**info, "reason": res.status, "detail": res.stderr[-500:]}
    if blob is None:
        reason = "early_exit" if res.status == "ok" else "crash"
        return 0.0, {**info, "reason": reason, "detail": f"{res.status} {res.signal or res.returncode}: "
                                                         f"{res.stderr[-500:]}"}
    try:
        result = _parse_result(blob, ref["cases"])
    except Malformed as e:
        return 0.0, {**info, "reason": "crash", "detail": f"malformed result: {e}"}
    reason, detail, max_err = _compare(ref["cases"], result)
    info.update(reason=reason, detail=detail, max_abs_err=max_err)
    if reason == "ok" and result["ms"] and ref["ms"]:
        info["speedup"] = ref["ms"] / result["ms"]
    return (1.0 if reason == "ok" else 0.0), info


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
            score, info = 0.0, {"reason": lint_result[0], "detail": lint_result[1]}
        elif refused:
            score, info = 0.0, {"reason": "no_sandbox", "detail": refused}
        else:
            score, info = execute(code, task, timeout_s)
    except Exception as e:      # a bug here must cost one sample, not the batch (the message is not trusted)
        score, info = 0.0, {"reason": "reward_error", "detail": type(e).__name__}
    info["time_s"] = time.monotonic() - t0
    return score, info

"""AutoTriton reward: 1.0 only if the completion's code passes the rule-based Triton linter AND matches the
PyTorch reference in the sandbox; else 0.0 with a reason code.

    score, info = triton_reward(completion, task, timeout_s=60)
    task: {"name": str, "reference_code": str defining Model, get_inputs(), get_init_inputs(), ...}
    completion: model output; the code is the last ```python block (an unclosed last block counts), or the
                whole text if there is none
    info: {"reason": str, "detail": str, "time_s": float, "not_enforced": [str], "max_abs_err": float,
           "speedup": float (CUDA only)}

AutoTriton (SFT then GRPO): reward = is_triton(code) AND passes tests. The linter (`lint`) needs an
`@triton.jit` kernel launched on ModelNew.forward's call path, no torch compute op standing in for it, no
try/except fallback, no monkey-patching, no imports beyond torch / torch.nn / triton(.language) / math /
typing / functools, no eval/exec/open/getattr/dunder access (the ways to read the reference or escape the
rules). Execution (`execute`): the reference runs once per task in its own sandboxed process (cached), which
saves seeded inputs, its parameters and its outputs; the candidate runs in another sandbox that only gets the
inputs and parameters, loaded before its code is imported; its outputs and its inputs after the call come
back to this process, which does the comparison (torch.allclose, atol = rtol = 1e-4 fp32, 1e-2 fp16/bf16,
exact for integers) and the mutation check, so patching allclose, timers or the harness inside the sandbox
changes nothing here. Inside the sandbox the harness also records aten ops run by forward outside Triton
launches (anything beyond allocation / views / copies is torch doing the work) and counts real launches.
On CPU the kernels run under TRITON_INTERPRET=1; on CUDA on the GPU, with the speedup vs the reference.

Reason codes, in the order they are checked:
  no_code, syntax_error; lint_try_except, lint_monkeypatch, lint_forbidden_call, lint_import, lint_no_model,
  lint_no_kernel, lint_kernel_not_launched, lint_torch_op (static, or at run time: detail starts "runtime");
  reference_error (the task's own code failed), sandbox_error; timeout, crash (killed by a signal, exited
  non-zero or wrote a malformed result), early_exit (exited 0 before writing a result, e.g. sys.exit(0));
  compile_error (module import or Triton compilation failed), oom, runtime_error; input_mutated,
  wrong_output; ok.
"""

import ast
import builtins
import io
import json
import os
import threading
import time
from collections import OrderedDict

from rewards.code import extract_code
from rewards.sandbox import run_python

SEEDS = (1, 2, 3)
REFERENCE_TIMEOUT_S = 120      # the task's own code: trusted to finish, run once per task and process
_HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_harness.py")
_SCRIPT = "import triton_harness; triton_harness.main()"
_REF_CACHE_SIZE = 256
_ref_cache: "OrderedDict[tuple, dict]" = OrderedDict()   # (reference_code, device) -> parsed ref.pt
_ref_lock = threading.Lock()                              # triton_eval scores from threads

_ALLOWED_MODULES = ("torch", "torch.nn", "triton", "triton.language", "math", "typing", "functools",
                    "__future__")
_FORBIDDEN_NAMES = frozenset("eval exec compile open __import__ getattr setattr delattr globals locals vars "
                             "breakpoint input exit quit memoryview help".split())
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
_TORCH_INIT_PREFIXES = ("torch.nn.",)
# method names that compute on a tensor (also with a trailing "_": add_ is add; apply_ only with it, as
# autograd.Function.apply is fine)
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
numpy tolist apply_ map_ map2_ renorm dist cdist histc bincount unique nan_to_num
""".split())
_LINT_ORDER = ("lint_try_except", "lint_monkeypatch", "lint_forbidden_call", "lint_import", "lint_no_model",
               "lint_no_kernel", "lint_kernel_not_launched", "lint_torch_op")
_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}   # atol = rtol by output dtype; other floats 1e-4


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
        for module, local, target in pairs:
            if local == "*":
                self.flag("lint_import", node, f"from {module} import *")
            elif module.startswith("torch") and module not in _ALLOWED_MODULES:
                self.flag("lint_torch_op", node, f"imports {module}")
            elif not (module in _ALLOWED_MODULES or module.startswith("triton.language.")):
                self.flag("lint_import", node, f"imports {module}")
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
        if node.attr.startswith("__") and node.attr not in _ALLOWED_DUNDERS:
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
        args = node.args
        names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.scopes.append(names)
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
        """Flag torch compute at one node. strict (everywhere but ModelNew.__init__ and kernel bodies): only
        _TORCH_OK names, no `@`, no compute methods, no calls of torch submodules (self.linear(x)); else only
        the names of _TORCH_INIT_OK."""
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            target = self.resolve(node) or ""
            allowed = _TORCH_OK if strict else _TORCH_INIT_OK
            if target.startswith("torch") and not (target in allowed or any(a.startswith(target + ".") for a in allowed)
                                                   or not strict and target.startswith(_TORCH_INIT_PREFIXES)):
                self.flag("lint_torch_op", node, f"uses {target}")
        if not strict:
            return
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            self.flag("lint_torch_op", node, "@ (matmul) on tensors")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func, receiver = node.func, node.func.value
            if _dotted(receiver) in submodules or _dotted(func) in submodules:
                self.flag("lint_torch_op", node, f"calls torch module {ast.unparse(func)}")
            elif (func.attr in _COMPUTE_METHODS or func.attr.rstrip("_") in _COMPUTE_METHODS) and \
                    self.resolve(receiver) is None:
                self.flag("lint_torch_op", node, f"tensor method .{func.attr}()")


def lint(code: str) -> tuple:
    """(None, "") when the code passes the rule-based check, else (reason, detail)."""
    try:
        problems = dict(reversed(_Linter(ast.parse(code)).problems))      # first problem of each reason wins
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:   # ValueError: NUL bytes; the others:
        return "syntax_error", f"{type(e).__name__}: {e}"                 # absurdly deep nesting
    for reason in _LINT_ORDER:
        if reason in problems:
            return reason, problems[reason]
    return None, ""


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sandbox(files: dict, role: str, device: str, timeout_s: float, out: str):
    """Run the harness in `role` with `files` in its scratch dir. Returns (SandboxResult, parsed `out` or None)."""
    import torch
    with open(_HARNESS_PATH) as f:
        harness = f.read()
    job = {"role": role, "seeds": list(SEEDS), "device": device, "time": device == "cuda"}
    env = {"TRITON_INTERPRET": "1"} if device == "cpu" else \
        {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in os.environ}
    res = run_python(_SCRIPT, {**files, "triton_harness.py": harness, "job.json": json.dumps(job)},
                     timeout_s=timeout_s, env=env, gpu=device == "cuda", read_back=(out,))
    if out not in res.files:
        return res, None
    try:
        return res, torch.load(io.BytesIO(res.files[out]), weights_only=True)
    except Exception:           # a malformed file from untrusted code fails in many ways; it scores as a crash
        return res, None


def _reference(reference_code: str, device: str) -> tuple:
    """(parsed ref.pt, None) for the task's reference, cached per (code, device); (None, why) on failure."""
    key = (reference_code, device)
    with _ref_lock:
        if key in _ref_cache:
            _ref_cache.move_to_end(key)
            return _ref_cache[key], None
    res, ref = _sandbox({"reference.py": reference_code}, "reference", device, REFERENCE_TIMEOUT_S, "ref.pt")
    if ref is None:
        return None, f"{res.status}: {res.stderr[-1000:]}"
    with _ref_lock:
        _ref_cache[key] = ref
        if len(_ref_cache) > _REF_CACHE_SIZE:
            _ref_cache.popitem(last=False)
    return ref, None


def _compare(cases: list, result: dict) -> tuple:
    """(reason, detail, max_abs_err) for a candidate's result.pt against the reference cases."""
    import torch
    if "error" in result:
        return result["error"], str(result.get("detail", "")), None
    if result["torch_ops"]:
        return "lint_torch_op", f"runtime: forward ran torch ops {result['torch_ops'][:5]}", None
    if len(result["outputs"]) != len(cases) or min(result["launches"], default=0) < 1:
        return "lint_kernel_not_launched", "runtime: a forward call launched no Triton kernel", None
    max_err = 0.0
    for case, outs, after in zip(cases, result["outputs"], result["inputs_after"], strict=True):
        for i, (x, y) in enumerate(zip(case["inputs"], after, strict=True)):
            if isinstance(x, torch.Tensor) and not (isinstance(y, torch.Tensor) and y.shape == x.shape
                                                   and y.dtype == x.dtype and torch.equal(x, y)):
                return "input_mutated", f"seed {case['seed']}: input {i} changed by forward", None
        if len(outs) != len(case["outputs"]):
            return "wrong_output", f"{len(outs)} outputs, expected {len(case['outputs'])}", None
        for o, r in zip(outs, case["outputs"]):
            if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
                what = f"{o.dtype} {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
                return "wrong_output", f"seed {case['seed']}: got {what}, expected {r.dtype} {tuple(r.shape)}", None
            if not r.is_floating_point():
                if not torch.equal(o, r):
                    return "wrong_output", f"seed {case['seed']}: integer output differs", None
                continue
            err = (o.double() - r.double()).abs().nan_to_num(float("inf")).max().item() if r.numel() else 0.0
            max_err = max(max_err, err)
            tol = _TOLERANCE.get(str(r.dtype).removeprefix("torch."), 1e-4)
            if not torch.allclose(o, r, atol=tol, rtol=tol, equal_nan=True):
                return "wrong_output", f"seed {case['seed']}: max abs err {err:.3g} (atol=rtol={tol})", max_err
    return "ok", "", max_err


def execute(code: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """Run code's ModelNew against task["reference_code"] in the sandbox, no linting. Returns (score, info)."""
    import torch
    device = _device()
    ref, problem = _reference(task["reference_code"], device)
    if problem:
        return 0.0, {"reason": "reference_error", "detail": problem}
    cases = ref["cases"]
    blob = io.BytesIO()
    torch.save({"cases": [{k: v for k, v in c.items() if k != "outputs"} for c in cases]}, blob)
    res, result = _sandbox({"candidate.py": code, "inputs.pt": blob.getvalue()}, "candidate", device,
                           timeout_s, "result.pt")
    info = {"not_enforced": list(res.not_enforced)}
    if res.status in ("timeout", "sandbox_error"):
        return 0.0, {**info, "reason": res.status, "detail": res.stderr[-500:]}
    if result is None:
        reason = "early_exit" if res.status == "ok" else "crash"
        return 0.0, {**info, "reason": reason, "detail": f"{res.status} {res.signal or res.returncode}: "
                                                         f"{res.stderr[-500:]}"}
    try:
        reason, detail, max_err = _compare(cases, result)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:    # forged or broken result.pt
        return 0.0, {**info, "reason": "crash", "detail": f"malformed result: {type(e).__name__}: {e}"}
    info.update(reason=reason, detail=detail, max_abs_err=max_err)
    if reason == "ok" and result.get("ms") and ref.get("ms"):
        info["speedup"] = ref["ms"] / result["ms"]
    return (1.0 if reason == "ok" else 0.0), info


def triton_reward(completion: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """(1.0, info) when the completion's code passes `lint` and `execute`, else (0.0, info); never raises."""
    t0 = time.monotonic()
    code = extract_code(completion if isinstance(completion, str) else "")
    if not code:
        score, info = 0.0, {"reason": "no_code", "detail": ""}
    else:
        reason, detail = lint(code)
        score, info = (0.0, {"reason": reason, "detail": detail}) if reason else execute(code, task, timeout_s)
    info["time_s"] = time.monotonic() - t0
    return score, info

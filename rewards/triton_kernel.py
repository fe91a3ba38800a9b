"""AutoTriton reward: 1.0 only if the completion's code is written in the accepted language below AND matches the
PyTorch reference in the sandbox; else 0.0 with a reason code.

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
the reference (once per task, cached) and the candidate in two sandboxes (rewards/triton_harness.py), on inputs
from seeds drawn per process and never shown to the candidate, and compares here (torch.allclose, atol = rtol =
1e-4 fp32, 1e-2 fp16/bf16, exact for integers) after validating every field of the result file against the
reference. On CPU the kernels run under TRITON_INTERPRET=1; on CUDA on the GPU, with the speedup.

The accepted language (an allowlist: what is not described here is refused; reason in brackets).
  L0 size [lint_size]: at most _CODE_MAX bytes and _NODES_MAX syntax-tree nodes. The linter runs in the scoring
     process without a time limit, so every pass is linear in the file: one index of the tree (parents, subtrees,
     scopes, stores per scope and name) that the other passes read instead of searching, climbs up the tree
     remembered per node, symtable's raw flags.
  L1 text [lint_encoding]: utf-8 without another coding declaration or a carriage return, so Python, the
     sandbox and Triton's line-based re-read of a kernel (linecache) all see the same lines.
  L2 imports [lint_import]: at module level only, of torch, torch.nn, triton, triton.language (.math,
     .extra.libdevice), math and typing; a module is only the head of an attribute chain, and every chain is an
     exact allowed name: the public non-module names of triton.language(.math, .extra.libdevice) and math,
     triton.{jit, autotune, heuristics, Config, cdiv, next_power_of_2}, the torch names listed below, and
     typing.{Any, Optional, Union, Tuple, List, Dict, Sequence} inside annotations only.
  L3 names [lint_name; lint_forbidden_call for other builtins]: every name loaded (Python's own scoping, from
     symtable) is a local of its function or an enclosing one, a binding of a module-level statement, or one
     of _BUILTINS. Module level holds only imports, defs, classes, assignments, calls and a docstring (plus an
     `if __name__ == "__main__":` block, which never runs and is ignored); each name is bound there once; code
     that runs while the module imports (assignments, decorators, defaults, annotations, class bodies) calls
     only API names and builtins and names no function or class of the file but as a base class; no `global`,
     no `del` of a name, no `:=`; nothing is named like what Triton's rewritten kernels read from the module
     (interpreter_semantic, _InterpreterComparison: _triton_reads).
  L4 objects [lint_forbidden_call]: no dunder attribute but __init__, no `_private` attribute but a class's own
     (`self._x` where the class defines or assigns it), none of the frame / code / traceback attributes or
     `.handle`; in kernel bodies only the public attributes of Triton's tensor, dtype and constexpr; classes at
     module level, derived only from nn.Module, torch.autograd.Function or classes of the file, without
     decorators or keywords; no generators or coroutines (yield, async, await).
  L5 strings [lint_string]: no bytes; a str constant is a docstring, a call argument, a subscript key, a
     comparison operand, an assert message, an assigned or default value, or a dict key or value (inside
     list / tuple / dict literals in those places too); at most 200 characters and on one line, except
     docstrings, which may span lines; f-strings only in assert messages, raise statements and print calls;
     no annotation holds a string.
  L6 kernels and launches [lint_launch]: a kernel is a module-level def whose decorators are `@triton.jit`
     (bare, or with literal debug / noinline / do_not_specialize(_on_alignment)) innermost, optionally under
     `@triton.heuristics({"NAME": lambda args: <size expr or comparison>})` and `@triton.autotune(configs,
     key=[...], reset_to_zero=[...], restore_value=[...])`; its parameter defaults are constants;
     `triton.Config(dict, num_warps=, num_stages=, num_ctas=, maxnreg=)`. jit / autotune / heuristics appear
     nowhere else, and triton.language is called only in kernel bodies (but `X = tl.constexpr(<constant>)` at
     module level). A kernel's name is used only as `kernel[grid](...)` in host code, and in kernel bodies
     called or passed to a triton.language function. grid: a tuple, a one-argument lambda whose body is a
     tuple of size expressions, or a name its scope assigns only those. Size expression: int constants,
     names, attribute chains, `x.shape[i]`, `x.numel()`, `x.size(i)`, `x.stride(i)`, `x.dim()`,
     `meta["KEY"]`, + - * // % << >>, triton.cdiv, triton.next_power_of_2, min, max. A kernel body uses a
     tl.constexpr parameter only as a value (no attribute, item or call on it) and stores only to names.
     Method decorators: staticmethod, torch.no_grad(), torch.inference_mode(); none elsewhere.
  L7 kernel source [lint_source]: for every kernel, the text Triton compiles (the interpreter: from the last
     line of the decorated block, as inspect reads it, that starts with `def `; the GPU compiler: from the
     first `^def name(`) parses to exactly the linted function, and no other line of the block starts with
     `def `.
  L8 the task's rules: no try [lint_try_except]; stores only to names, to items of containers that are not
     modules or builtins, and to attributes of a method's first parameter (self.x, ctx.x) [lint_monkeypatch];
     a ModelNew with forward [lint_no_model], an @triton.jit kernel [lint_no_kernel] launched on forward's
     call path [lint_kernel_not_launched]; outside ModelNew.__init__ and kernel bodies only allocation /
     dtype / device names of torch, no `@`, no tensor compute method called or loaded, no call of a torch
     submodule; nowhere a tensor -> numpy / Python bridge, torch.compile, C++ extensions, torch.ops / load /
     nn.functional [lint_torch_op]; a kernel body reads no module global but tl.constexpr(...) ones and kernels
     [lint_forbidden_call].

Why accepted code reaches no exec, frame, numpy or host compute (check rule by rule):
  exec / eval / import: none is a builtin in _BUILTINS (L3), none is an allowed API name and no allowed name
     is a module (L2; a test checks the closure), and no attribute leads to one without a dunder (function
     globals, class dicts, modules of objects: L4). No string is read as code: functools / __future__ are not
     importable, typing only for type hints (L2), annotations hold no strings (L5), eval-like builtins are
     unbound (L3).
  frames: reached only through sys / inspect (not importable, and Triton's injected `inspect` is not a binding
     of the file: L2, L3), generator / coroutine / traceback objects (no yield / async, no try: L4, L8) or
     frame attributes (L4).
  numpy: through `import numpy` (L2), Triton's injected `np` (L3), a Triton value's `.handle` (L4) or a tensor
     bridge (.numpy / .tolist / storages / __array__: L4, L8).
  host compute: torch ops outside __init__ and kernels are refused by name (L8) and recorded at run time by the
     harness's dispatch audit; Python on tensor values needs a scalar read (aten._local_scalar_dense, recorded
     outside kernel launches) or a bridge (refused here, recorded at run time whoever calls it). Inside a
     launch the only candidate code that runs is kernel bodies, grid and heuristics lambdas: kernel bodies
     hold only Triton values (L4, L6: no module global but constexprs and kernels, constant defaults, no
     tl.constexpr wrapping a tensor in host code; the harness refuses any launch argument that is not a
     tensor, a scalar, a dtype or a tuple of those, and tensors as tl.constexpr), the lambdas are size
     expressions that store nothing (L6; the harness runs them in a window where any aten op or bridge is a
     violation). Hooks, `triton.jit(fn)` calls and kernels as values are not in the language (L6), nor names
     Triton's rewrite calls (L3). The text that runs is the text linted (L1, L7), and Triton's injected
     globals are never read: every name loaded is bound by the file, and no kernel launches while the module
     imports (L3).
  the audit: it lives in the harness's frames and in modules no allowed name reaches, so accepted code cannot
     switch it off; the run-time checks are defence in depth for what no static rule sees (the types of launch
     arguments). `execute` alone runs code without this rule (the sandbox and the parent's validation hold).

Reason codes, in the order they are checked:
  no_code; lint_size, lint_encoding, syntax_error, lint_try_except, lint_monkeypatch, lint_forbidden_call,
  lint_import, lint_name, lint_string, lint_source, lint_launch, lint_no_model, lint_no_kernel,
  lint_kernel_not_launched, lint_torch_op (static, or at run time: detail starts "runtime"; a launch the harness
  refused is lint_launch "runtime: launch ..."), gpu_compile (at run time: a launch's kernel does not compile for
  sm_90 with that launch's types and constexprs, or its grid is over CUDA's limits), race (at run time: one
  program of a launch stores, or updates atomically, what another accesses without an atomic); no_sandbox (no
  bwrap and no opt-out: rewards/sandbox.py); reference_error (the task's own code failed), sandbox_error; timeout,
  oom (the sandbox's memory cgroup), crash (killed by a signal, exited non-zero or wrote a malformed result),
  early_exit (exited before writing a result, or SystemExit); compile_error (module import or Triton compilation
  failed), oom, runtime_error; input_mutated, wrong_output; ok; reward_error (a failure of the reward itself: it
  never raises).
"""

import ast
import builtins
import codecs
import copy
import functools
import importlib
import inspect
import io
import json
import math
import os
import re
import secrets
import symtable
import textwrap
import threading
import time
import tokenize
import types
from collections import Counter, OrderedDict

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
                    "triton.language.extra", "triton.language.extra.libdevice", "math", "typing")
# modules whose public names (their __all__, else dir(); never a module) are allowed as exact paths
_API_MODULES = ("triton.language", "triton.language.math", "triton.language.extra.libdevice", "math")
_TRITON_TOP = ("jit", "autotune", "Config", "heuristics", "cdiv", "next_power_of_2")
# typing names for type hints, allowed only inside annotations (which hold no strings, so nothing evaluates one)
_TYPING = frozenset("typing." + n for n in "Any Optional Union Tuple List Dict Sequence".split())
# the builtins a name may resolve to: none evaluates text, imports, reads frames or reaches an attribute by
# name; on tensors they act through protocol methods (aten ops, scalar reads) that the run-time audit records
_BUILTINS = frozenset("""
abs all any bool dict divmod enumerate float int isinstance len list max min pow print range reversed round slice
sorted sum super tuple zip staticmethod AssertionError Exception IndexError KeyError NotImplementedError
RuntimeError TypeError ValueError
""".split())
# introspection attributes (frames, code objects, generator and traceback internals) reach the harness's
# variables without a dunder; `handle` is the interpreter's numpy array behind a Triton value
_FRAME_ATTRS = frozenset("""
gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code ag_await f_back f_globals f_locals
f_builtins f_code f_trace tb_frame tb_next co_code co_consts co_names func_globals handle
""".split())
_ALLOWED_DUNDERS = frozenset(("__init__",))
_STRING_MAX = 200              # characters of a str constant that is not a docstring
_CODE_MAX = 100_000            # bytes of code linted at all (honest candidates are a few KB)
_NODES_MAX = 50_000            # syntax-tree nodes linted at all: honest code has at most 0.38 per byte (the shipped
                               # solutions, the honest sets), a unary chain 2: its 100 KB would take 4x as long
_KERNEL_DECORATORS = {"triton.jit": {"debug", "noinline", "do_not_specialize", "do_not_specialize_on_alignment"},
                      "triton.autotune": {"configs", "key", "reset_to_zero", "restore_value"},
                      "triton.heuristics": {"values"}}
_CONFIG_KEYWORDS = frozenset(("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg"))
_SIZE_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.LShift, ast.RShift)
_SIZE_METHODS = frozenset(("numel", "size", "stride", "dim"))
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
init.calculate_gain
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
_LINT_ORDER = ("lint_size", "lint_encoding", "lint_try_except", "lint_monkeypatch", "lint_forbidden_call",
               "lint_import", "lint_name", "lint_string", "lint_source", "lint_launch", "lint_no_model",
               "lint_no_kernel", "lint_kernel_not_launched", "lint_torch_op")
_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}   # atol = rtol by output dtype; other floats 1e-4
_MAIN_GUARD = ast.dump(ast.parse('__name__ == "__main__"', mode="eval").body)


@functools.cache
def _api_names() -> frozenset:
    """Exact dotted names of triton, triton.language (.math, .extra.libdevice) and math that code may use:
    their public non-module names. A module reached as an attribute (triton.knobs, tl.core) is never one."""
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
    exact = _api_names() | _TYPING | (_TORCH_OK if strict else _TORCH_INIT_OK)
    prefixes = {name.rsplit(".", k)[0] for name in exact for k in range(1, name.count(".") + 1)}
    return exact, frozenset(prefixes)


@functools.cache
def _kernel_attrs() -> frozenset:
    """Attributes a kernel body may read on a value: the public ones of Triton's tensor, dtype and constexpr
    classes and their instance fields (none is a mutating method of a torch tensor)."""
    import triton.language as tl
    names = {"dtype", "shape", "type", "numel", "element_ty", "value", "primitive_bitwidth", "name"}
    for cls in (tl.tensor, tl.dtype, tl.pointer_type, tl.block_type, tl.constexpr):
        names |= {n for n in dir(cls) if not n.startswith("_")}
    return frozenset(names - _FRAME_ATTRS)


@functools.cache
def _triton_reads() -> frozenset:
    """Names the interpreter's rewrite of a kernel loads from the kernel's module (assignments go through
    interpreter_semantic, chained comparisons through _InterpreterComparison): found by rewriting a probe with
    Triton's own ASTTransformer. A file binding one would run its own code inside every launch."""
    from triton.runtime.interpreter import ASTTransformer
    probe = ast.parse("def k(a, b, c):\n    d = a < b < c\n    d += a\n    e: int = b\n    if a and b or not c:\n"
                      "        return [f(a) for f in c][0].x\n    while a == b != c:\n        a, b = b, a\n")
    before = {n.id for n in ast.walk(probe) if isinstance(n, ast.Name)}
    rewritten = ASTTransformer().visit(copy.deepcopy(probe))
    params = {a.arg for a in ast.walk(rewritten) if isinstance(a, ast.arg)}
    return frozenset(n.id for n in ast.walk(rewritten) if isinstance(n, ast.Name)) - before - params


def _root(dotted: str | None) -> str | None:
    return dotted.partition(".")[0] if dotted else None


def _docstrings(nodes: list) -> dict:
    """{id(Constant): Constant} of the docstrings among nodes (modules, classes and functions)."""
    found = {}
    for node in nodes:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) and \
                isinstance(node.body[0].value.value, str):
            found[id(node.body[0].value)] = node.body[0].value
    return found


def _at_import(node):
    """The nodes of a module-level statement that run while the module imports, in source order: everything but
    the bodies of functions and lambdas (their decorators, defaults and annotations run)."""
    todo = [node]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            children = [*a.defaults, *filter(None, a.kw_defaults)]
            if not isinstance(node, ast.Lambda):
                children += [*node.decorator_list, node.returns, *(x.annotation for x in
                             [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x)]
        else:
            children = list(ast.iter_child_nodes(node))
        todo.extend(child for child in reversed(children) if child is not None)


def _undecorated(fn: ast.FunctionDef) -> str:
    """ast.dump of fn without its decorators (ast.dump ignores positions)."""
    bare = copy.copy(fn)
    bare.decorator_list = []
    return ast.dump(bare)


def _same_function(src: str, undecorated: str) -> bool:
    """Whether src parses to exactly one statement, a function whose _undecorated dump is `undecorated`."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return False
    return len(tree.body) == 1 and ast.dump(tree.body[0]) == undecorated


def _triton_sources(lines: list, fn: ast.FunctionDef) -> tuple:
    """(block, interpreter source, GPU source) of the kernel fn, taken from the file's lines the way Triton takes
    them: inspect.getsourcelines reads the block from the first decorator (the function's co_firstlineno);
    the interpreter (FunctionRewriter) compiles the dedented block from its LAST line starting with `def `, the
    GPU compiler (JITCallable) from the first `^def name(` of the dedented block."""
    start = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
    block = inspect.getblock(lines[start:])
    defs = [i for i, line in enumerate(block) if line.strip().startswith("def ")]
    text = textwrap.dedent("".join(block))
    first = re.search(r"^def\s+\w+\s*\(", text, re.MULTILINE)
    return (block, textwrap.dedent("".join(block[defs[-1]:])) if defs else "",
            text[first.start():] if first else "")


class _Linter(ast.NodeVisitor):
    """Collects (reason, detail) problems of one module; `lint` reports the first in _LINT_ORDER."""

    def __init__(self, code: str, tree: ast.Module):
        self.problems = []
        self.aliases = {}          # local name -> dotted module path or API name, from imports
        self.scopes = []           # stack of local-name sets of the enclosing functions
        self.methods = []          # stack of (first parameter, own attributes of its class) of enclosing methods
        self.kernel = None         # the kernel whose body is being visited
        body = [s for s in tree.body if ast.dump(getattr(s, "test", ast.Pass())) != _MAIN_GUARD or s.orelse]
        self.module = ast.Module(body=body, type_ignores=[])      # an `if __name__ == "__main__":` never runs
        lines, kept = code.splitlines(keepends=True), {id(s) for s in body}
        for stmt in (s for s in tree.body if id(s) not in kept):
            lines[stmt.lineno - 1:stmt.end_lineno] = ["\n"] * (stmt.end_lineno - stmt.lineno + 1)
        self.text = "".join(lines)                                 # the code without that block, line for line
        self.nodes, self.spans, self.parents, self.scope_of, self.locals, self.stores = _index(self.module)
        self.names = {}            # id(node) -> its dotted name (dotted), computed once per node
        self.climbed = {}          # (id(node), through) -> _climb's answer
        self.call_args = {id(a) for n in self.nodes if isinstance(n, ast.Call) for a in n.args}
        self.bases = {id(b) for n in self.nodes if isinstance(n, ast.ClassDef) for b in n.bases}
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._import(stmt)
        self.funcs = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
        self.classes = {n.name: n for n in body if isinstance(n, ast.ClassDef)}
        self.kernels = {name: fn for name, fn in self.funcs.items() if self._is_jit(fn)}
        self.constexprs = {fn: {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
                                if a.annotation and self.resolve(a.annotation) == "triton.language.constexpr"}
                           for fn in self.kernels.values()}
        self.own_attrs = set()     # attributes the class being visited assigns on its methods' first parameter
        self.grids = {}            # (id of a scope, name) -> whether the name is a grid there
        self.annotations = set()   # ids of the nodes inside annotations
        for node in self.nodes:
            found = node.annotation if isinstance(node, (ast.arg, ast.AnnAssign)) else \
                node.returns if isinstance(node, ast.FunctionDef) else None
            self.annotations |= {id(n) for n in self.below(found)} if found else set()
        self.visit(self.module)
        self._names(self._module_bindings())
        self._import_time()
        self._strings(code)
        self._kernel_sources(code)
        self._launches()
        self._structure()

    def flag(self, reason: str, node, what: str) -> None:
        self.problems.append((reason, f"line {node.lineno}: {what}" if hasattr(node, "lineno") else what))

    def below(self, node) -> list:
        """node and every node under it (ast.walk's nodes, in source order), a slice of the index."""
        start, end = self.spans[id(node)]
        return self.nodes[start:end]

    def dotted(self, node) -> str | None:
        """"a.b.c" for an Attribute chain on a Name, else None (each link of a chain computed once)."""
        if id(node) not in self.names:
            base = self.dotted(node.value) if isinstance(node, ast.Attribute) else None
            self.names[id(node)] = node.id if isinstance(node, ast.Name) else \
                f"{base}.{node.attr}" if base is not None else None
        return self.names[id(node)]

    def resolve(self, node) -> str | None:
        """Dotted name with its root import alias expanded (tl.load -> triton.language.load); None if the
        root is not an imported name."""
        dotted = self.dotted(node)
        if dotted is None:
            return None
        root, _, rest = dotted.partition(".")
        if root not in self.aliases:
            return None
        return self.aliases[root] + ("." + rest if rest else "")

    # ---- L2 imports ----
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
            elif module not in _ALLOWED_MODULES or getattr(node, "level", 0):
                self.flag("lint_import", node, f"imports {module}")
            elif not (target in _ALLOWED_MODULES or target in exact):
                self.flag("lint_torch_op" if target.startswith("torch") else "lint_import", node,
                          f"imports {target} (not an allowed name)")
            self.aliases[local] = target

    def visit_Import(self, node):
        if self.parents.get(node) is not self.module:
            self.flag("lint_import", node, "imports only at module level")

    visit_ImportFrom = visit_Import

    # ---- L3 names, L4 attributes, L8 try and stores: one pass over the module ----
    def visit_Try(self, node):
        self.flag("lint_try_except", node, "try/except (a fallback path)")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Name(self, node):
        if node.id.startswith("__") and node.id not in _ALLOWED_DUNDERS:
            self.flag("lint_forbidden_call", node, f"uses {node.id}")
        self._triton_name(node, node.id)
        if self.kernel and node.id in self.constexprs[self.kernel] and isinstance(node.ctx, ast.Load):
            parent = self.parents.get(node)
            if isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is node or \
                    isinstance(parent, ast.Call) and parent.func is node:
                self.flag("lint_launch", node, f"tl.constexpr parameter {node.id} used as an object (only its "
                          "value: a tensor passed as constexpr would run as torch inside the kernel)")

    def visit_Attribute(self, node):
        attr = node.attr
        owner = self.methods[-1] if self.methods else (None, ())
        on_self = isinstance(node.value, ast.Name) and node.value.id == owner[0]
        if attr.startswith("__") and attr not in _ALLOWED_DUNDERS or attr in _FRAME_ATTRS:
            self.flag("lint_forbidden_call", node, f"uses .{attr}")
        elif attr.startswith("_") and attr not in _ALLOWED_DUNDERS and not (on_self and attr in owner[1]):
            self.flag("lint_forbidden_call", node, f"uses .{attr} (private: only a class's own self._x)")
        elif self.kernel and isinstance(node.ctx, ast.Load) and self.resolve(node) is None and \
                attr not in _kernel_attrs():
            self.flag("lint_forbidden_call", node, f"kernel {self.kernel.name} uses .{attr} (not an attribute "
                      "of a Triton tensor, dtype or constexpr)")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and (self.kernel or not on_self):
            self.flag("lint_monkeypatch", node, f"assigns to {ast.unparse(node)} (only self.x = ... or ctx.x = ...)")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                root = root.func if isinstance(root, ast.Call) else root.value
            name = root.id if isinstance(root, ast.Name) else None
            local = any(name in scope for scope in self.scopes)
            if self.kernel or name in self.aliases or (name in vars(builtins) and not local):
                self.flag("lint_monkeypatch", node, f"assigns to {ast.unparse(node)}")
        self.generic_visit(node)

    def _triton_name(self, node, name: str) -> None:
        if name in _triton_reads():
            self.flag("lint_name", node, f"{name}: Triton's interpreter reads this name from the module in every "
                      "rewritten kernel")

    def visit_arg(self, node):
        self._triton_name(node, node.arg)

    def visit_alias(self, node):
        self._triton_name(node, node.asname or node.name)

    def visit_Global(self, node):
        self.flag("lint_name", node, "global (rebinds module names at run time)")

    def visit_Delete(self, node):
        if any(isinstance(t, ast.Name) for t in node.targets):
            self.flag("lint_name", node, "del of a name (an unbound global reads Triton's injected globals)")
        self.generic_visit(node)

    def visit_NamedExpr(self, node):
        self.flag("lint_name", node, "assignment expression (:=)")
        self.generic_visit(node)

    def _generator(self, node):
        self.flag("lint_forbidden_call", node, "generators and coroutines (yield, async, await: their frames)")
        self.generic_visit(node)

    visit_Yield = visit_YieldFrom = visit_Await = visit_AsyncFunctionDef = visit_AsyncFor = visit_AsyncWith = \
        _generator

    def visit_ClassDef(self, node):
        self._triton_name(node, node.name)
        if self.parents.get(node) is not self.module or node.decorator_list or node.keywords:
            self.flag("lint_name", node, f"class {node.name}: classes only at module level, with bases only")
        for base in node.bases:
            if not (self.resolve(base) in ("torch.nn.Module", "torch.autograd.Function") or
                    isinstance(base, ast.Name) and base.id in self.classes):
                self.flag("lint_forbidden_call", base, f"class {node.name} derives from {ast.unparse(base)} (only "
                          "nn.Module, torch.autograd.Function and classes of the file)")
        own = {n.id for stmt in node.body if isinstance(stmt, (ast.Assign, ast.AnnAssign)) for n in self.below(stmt)
               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for m in node.body:
            if isinstance(m, ast.FunctionDef):
                own.add(m.name)
                own |= {t.attr for t in self.below(m) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                        and isinstance(t.value, ast.Name) and m.args.args and t.value.id == m.args.args[0].arg}
        self.own_attrs = own
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        self._triton_name(node, node.name)
        if node.name.startswith("__") and node.name not in _ALLOWED_DUNDERS:
            self.flag("lint_forbidden_call", node, f"defines {node.name} (only __init__ may be defined)")
        parent = self.parents.get(node)
        if node.name in self.kernels and parent is self.module:
            self._kernel_decorators(node)
            if not all(isinstance(d, ast.Constant) for d in [*node.args.defaults, *node.args.kw_defaults] if d):
                self.flag("lint_launch", node, f"kernel {node.name}: parameter defaults other than constants")
        elif isinstance(parent, ast.ClassDef):
            for d in node.decorator_list:
                if not (isinstance(d, ast.Name) and d.id == "staticmethod" or isinstance(d, ast.Call) and
                        not d.args and not d.keywords and self.resolve(d.func) in ("torch.no_grad", "torch.inference_mode")):
                    self.flag("lint_launch", d, f"decorator {ast.unparse(d)} (methods: staticmethod, torch.no_grad())")
        elif node.decorator_list:
            self.flag("lint_launch", node, f"decorators on {node.name} (kernels are module-level @triton.jit defs)")
        method = isinstance(parent, ast.ClassDef) and node.args.args
        if method:
            self.methods.append((node.args.args[0].arg, self.own_attrs))
        kernel, self.kernel = self.kernel, self.kernels.get(node.name) if parent is self.module else self.kernel
        self._scoped(node)
        self.kernel = kernel
        if method:
            self.methods.pop()

    def _scoped(self, node):
        self.scopes.append(self.locals[id(node)])
        self.generic_visit(node)
        self.scopes.pop()

    visit_Lambda = _scoped

    # ---- L3: names resolve to the file's own bindings ----
    def _module_bindings(self) -> set:
        """Names the module-level statements bind; flags other statements and names bound twice (an import
        repeated as is excepted)."""
        bound, imported = Counter(), {}
        for i, stmt in enumerate(self.module.body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for a in stmt.names:
                    target = f"{stmt.module}.{a.name}" if isinstance(stmt, ast.ImportFrom) else \
                        a.name if a.asname else a.name.split(".")[0]
                    imported.setdefault(a.asname or target.split(".")[0] if isinstance(stmt, ast.Import)
                                        else a.asname or a.name, set()).add(target)
            elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                bound[stmt.name] += 1
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and \
                    (not isinstance(stmt, ast.AnnAssign) or stmt.value is not None):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                bound.update(n.id for t in targets for n in ast.walk(t)
                             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            elif not (isinstance(stmt, ast.Pass) or isinstance(stmt, ast.Expr) and
                      (isinstance(stmt.value, ast.Call) or i == 0 and isinstance(stmt.value, ast.Constant))):
                self.flag("lint_name", stmt, f"module level holds only imports, defs, classes, assignments and "
                          f"calls, not {type(stmt).__name__} (names must be bound unconditionally)")
        bound.update({name: len(targets) for name, targets in imported.items()})
        for name, count in bound.items():
            if count > 1:
                self.flag("lint_name", self.module, f"{name} is bound {count} times at module level")
        return set(bound)

    def _names(self, bound: set) -> None:
        """Every name a scope reads from the globals (symtable: Python's own scoping) is bound by the module or
        is one of _BUILTINS: after a launch the interpreter copies its own globals (np, inspect, ...) into this
        module for every name the file does not bind. Flags the first such builtin and the first other name."""
        todo, unbound, known = [symtable.symtable(self.text, "candidate.py", "exec")], {}, bound | _BUILTINS
        while todo and len(unbound) < 2:
            table = todo.pop()
            todo.extend(table.get_children())
            module_scope = table.get_type() == "module"
            for name, flags in table._table.symbols.items():   # get_symbols() matches every symbol against every
                sym = symtable.Symbol(name, flags, module_scope=module_scope)     # child table: quadratic
                if sym.is_referenced() and sym.is_global() and name not in known:
                    unbound.setdefault(hasattr(builtins, name), name)
        for node in self.nodes if unbound else ():
            if isinstance(node, ast.Name) and node.id in unbound.values():
                if hasattr(builtins, node.id):
                    self.flag("lint_forbidden_call", node, f"uses builtin {node.id}")
                else:
                    self.flag("lint_name", node, f"{node.id} is not bound in the file (not an import, definition "
                              "or assignment of it)")
                unbound = {k: v for k, v in unbound.items() if v != node.id}
                if not unbound:
                    break

    def _import_time(self) -> None:
        """Code that runs while the module imports calls only API names and builtins and names no function or
        class of the file (but as a base class): no kernel can launch before the import ends, so every global
        a function reads later is the file's own."""
        defined = set(self.funcs) | set(self.classes)
        for stmt in self.module.body:
            for node in _at_import(stmt):
                parent = self.parents.get(node)
                if isinstance(node, ast.Call) and self.resolve(node.func) is None and \
                        not (isinstance(node.func, ast.Name) and node.func.id in _BUILTINS):
                    self.flag("lint_name", node, f"{ast.unparse(node.func)}(...) runs at import (module level "
                              "calls only imported API names and builtins)")
                elif isinstance(node, ast.Name) and node.id in defined and isinstance(node.ctx, ast.Load) and \
                        not (isinstance(parent, ast.ClassDef) and id(node) in self.bases):
                    self.flag("lint_name", node, f"{node.id} used at import time")

    # ---- L5 strings ----
    def _strings(self, code: str) -> None:
        docs = _docstrings(self.nodes)
        lines = code.splitlines(keepends=True)
        for node in self.nodes:     # a literal over several lines: is one of its tokens (not just the literal) so?
            if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno != node.lineno and id(node) not in \
                    docs and not isinstance(self.parents.get(node), (ast.JoinedStr, ast.FormattedValue)):
                first, last = (lines[i - 1].encode() for i in (node.lineno, node.end_lineno))  # offsets: utf-8
                text = "(" + first[node.col_offset:].decode() + "".join(lines[node.lineno:node.end_lineno - 1]) + \
                    last[:node.end_col_offset].decode() + ")"
                if any(t.type == tokenize.STRING and t.start[0] != t.end[0]
                       for t in tokenize.generate_tokens(io.StringIO(text).readline)):
                    self.flag("lint_string", node, "a string spanning lines (only docstrings may)")
        for node in self.nodes:
            parent = self.parents.get(node)
            if id(node) in self.annotations and (isinstance(node, ast.JoinedStr) or
                                            isinstance(node, ast.Constant) and isinstance(node.value, str)):
                self.flag("lint_string", node, "a string annotation (Triton and typing read it as code)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
                self.flag("lint_string", node, "bytes literal")
            elif isinstance(node, ast.JoinedStr):
                if not self._message(node):
                    self.flag("lint_string", node, "f-string outside assert messages, raise and print")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs and \
                    not isinstance(parent, (ast.JoinedStr, ast.FormattedValue)):
                if len(node.value) > _STRING_MAX:
                    self.flag("lint_string", node, f"a string of {len(node.value)} characters (at most {_STRING_MAX})")
                elif not self._string_place(node):
                    self.flag("lint_string", node, f"string {node.value[:40]!r} in a place Triton code has none")

    def _string_place(self, node) -> bool:
        """A call argument, subscript key, comparison operand, assert message, assigned or default value, or a
        dict key / value; possibly inside list / tuple / dict literals there."""
        child, parent = self._climb(node, _in_literal)
        return isinstance(parent, (ast.keyword, ast.Compare, ast.arguments, ast.Dict)) or \
            isinstance(parent, ast.Call) and id(child) in self.call_args or \
            isinstance(parent, ast.Subscript) and child is parent.slice or \
            isinstance(parent, ast.Assert) and child is parent.msg or \
            isinstance(parent, (ast.Assign, ast.AnnAssign)) and child is parent.value

    def _message(self, node) -> bool:
        """Whether an f-string is an assert message, part of a raise, or a print argument: text the program
        never reads back."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "print":
            return True
        node, parent = self._climb(node, _in_statement)
        return isinstance(parent, ast.Raise) or isinstance(parent, ast.Assert) and node is parent.msg

    def _climb(self, node, through) -> tuple:
        """(child, ancestor): the first ancestor of node for which through(ancestor) is false (None past the
        module), and its child on the way. Each node's answer is kept, so a deep chain is climbed once, not once
        for every node below it."""
        key = (id(node), through)
        if key not in self.climbed:
            parent = self.parents.get(node)
            self.climbed[key] = self._climb(parent, through) if parent is not None and through(parent) else \
                (node, parent)
        return self.climbed[key]

    # ---- L7 the text Triton compiles ----
    def _kernel_sources(self, code: str) -> None:
        lines = io.StringIO(code).readlines()
        for fn in self.kernels.values():
            try:
                block, interpreted, compiled = _triton_sources(lines, fn)
            except (SyntaxError, tokenize.TokenError) as e:
                self.flag("lint_source", fn, f"kernel {fn.name}: inspect can't read its block ({type(e).__name__})")
                continue
            defs = sum(line.strip().startswith("def ") for line in block)
            undecorated = _undecorated(fn)     # dumped once, each distinct text parsed once
            if defs != 1 or not all(_same_function(text, undecorated) for text in {interpreted, compiled}):
                self.flag("lint_source", fn, f"kernel {fn.name}: the text Triton re-reads and compiles is not the "
                          f"linted function ({defs} lines of its block start with 'def ')")

    # ---- L6 kernels, decorators, grids ----
    def _is_jit(self, fn) -> bool:
        return any(self.resolve(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in fn.decorator_list)

    def _kernel_decorators(self, fn) -> None:
        """@triton.jit innermost, above it only triton.autotune / triton.heuristics calls, each with its own
        literal keywords."""
        for i, d in enumerate(fn.decorator_list):
            call = d if isinstance(d, ast.Call) else None
            path = self.resolve(call.func if call else d)
            innermost = i == len(fn.decorator_list) - 1
            if path not in _KERNEL_DECORATORS or (path == "triton.jit") != innermost or call is None and not innermost:
                self.flag("lint_launch", d, f"decorator {ast.unparse(d)} on kernel {fn.name} (@triton.jit innermost, "
                          "triton.autotune / triton.heuristics calls above it)")
            elif call and not self._decorator_args(path, call):
                self.flag("lint_launch", d, f"{path}(...) arguments outside the literal language")

    def _decorator_args(self, path: str, call: ast.Call) -> bool:
        keywords = {k.arg: k.value for k in call.keywords}
        if None in keywords or not set(keywords) <= _KERNEL_DECORATORS[path]:
            return False
        if path == "triton.jit":
            return not call.args and all(self._literal(v) for v in keywords.values())
        if path == "triton.heuristics":
            values = [*call.args, *keywords.values()]
            return len(values) == 1 and isinstance(values[0], ast.Dict) and all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Lambda) and
                self._lambda(v, self._condition) for k, v in zip(values[0].keys, values[0].values))
        positional = dict(zip(("configs", "key"), call.args))
        return len(call.args) <= 2 and not positional.keys() & keywords.keys() and all(
            isinstance(v, (ast.List, ast.Tuple)) and all(isinstance(c, ast.Constant) and isinstance(c.value, str)
                                                         for c in v.elts)
            for k, v in {**positional, **keywords}.items() if k != "configs")

    @staticmethod
    def _literal(node) -> bool:
        """A constant, or a list / tuple of constants."""
        return isinstance(node, ast.Constant) or isinstance(node, (ast.List, ast.Tuple)) and \
            all(isinstance(e, ast.Constant) for e in node.elts)

    def _launches(self) -> None:
        """jit / autotune / heuristics only as kernel decorators; triton.Config with its literal keywords; a
        kernel's name only launched (host) or called / passed to triton.language (kernel bodies); triton.language
        called only in kernels, but for module-level `X = tl.constexpr(<constant>)`."""
        decorators = {id(d.func if isinstance(d, ast.Call) else d) for fn in self.kernels.values()
                      for d in fn.decorator_list}
        in_kernel = {id(n) for fn in self.kernels.values() for stmt in fn.body for n in self.below(stmt)}
        for node in self.nodes:
            if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in decorators and \
                    self.resolve(node) in _KERNEL_DECORATORS:
                self.flag("lint_launch", node, f"{self.resolve(node)} used other than as a kernel's decorator")
            elif isinstance(node, ast.Call) and self.resolve(node.func) == "triton.Config" and \
                    (len(node.args) > 1 or any(k.arg not in _CONFIG_KEYWORDS for k in node.keywords)):
                self.flag("lint_launch", node, "triton.Config takes one dict and num_warps / num_stages / "
                          "num_ctas / maxnreg (no pre_hook)")
            elif isinstance(node, ast.Name) and node.id in self.kernels and isinstance(node.ctx, ast.Load):
                self._kernel_use(node, id(node) in in_kernel)
            if isinstance(node, ast.Call) and id(node) not in in_kernel and \
                    (self.resolve(node.func) or "").startswith("triton.language.") and not (
                    self.resolve(node.func) == "triton.language.constexpr" and
                    isinstance(self.parents.get(node), ast.Assign) and
                    self.parents.get(self.parents[node]) is self.module and
                    all(isinstance(a, ast.Constant) for a in node.args)):
                self.flag("lint_launch", node, f"{ast.unparse(node.func)}(...) outside a kernel (only "
                          "X = tl.constexpr(<constant>) at module level)")

    def _kernel_use(self, node, in_kernel: bool) -> None:
        parent = self.parents.get(node)
        call = self.parents.get(parent) if isinstance(parent, ast.keyword) else parent
        if not in_kernel and isinstance(parent, ast.Subscript) and parent.value is node and \
                isinstance(self.parents.get(parent), ast.Call) and self.parents[parent].func is parent:
            if not self._grid(parent.slice, self.scope_of[id(node)]):
                self.flag("lint_launch", parent.slice, f"grid {ast.unparse(parent.slice)[:80]}: a tuple, or a "
                          "lambda over meta returning a tuple of size expressions")
        elif not (in_kernel and isinstance(call, ast.Call) and
                  (call.func is node or (self.resolve(call.func) or "").startswith("triton.language."))):
            self.flag("lint_launch", node, f"kernel {node.id} used as a value (only kernel[grid](...) launches it; "
                      "kernels may call it)")

    def _grid(self, expr, scope) -> bool:
        """A tuple of size expressions, a one-argument lambda returning one, or a name that its scope (else the
        module) binds only to those (remembered per scope and name)."""
        if isinstance(expr, ast.Name):
            key = (id(scope), expr.id)
            if key not in self.grids:
                self.grids[key] = self._grid_name(expr, scope)
            return self.grids[key]
        if isinstance(expr, ast.Tuple):
            return all(self._size(e, None) for e in expr.elts)
        if isinstance(expr, ast.Lambda):
            return self._lambda(expr, lambda body, meta: isinstance(body, ast.Tuple) and
                                all(self._size(e, meta) for e in body.elts))
        return False

    def _grid_name(self, expr: ast.Name, scope) -> bool:
        if not isinstance(scope, ast.Module) and expr.id not in self.locals[id(scope)]:
            scope = self.module
        stores = self.stores.get((id(scope), expr.id), [])
        values = [self.parents[n].value for n in stores if getattr(self.parents[n], "value", None) is not None and (
            isinstance(self.parents[n], ast.Assign) and self.parents[n].targets == [n] or
            isinstance(self.parents[n], ast.AnnAssign) and self.parents[n].target is n)]
        params = {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)} if not isinstance(scope, ast.Module) else set()
        return bool(values) and len(values) == len(stores) and expr.id not in params and \
            all(isinstance(v, (ast.Tuple, ast.Lambda)) and self._grid(v, scope) for v in values)

    @staticmethod
    def _lambda(node: ast.Lambda, body_ok) -> bool:
        a = node.args
        return len(a.args) == 1 and not (a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults) and \
            body_ok(node.body, a.args[0].arg)

    def _size(self, e, meta) -> bool:
        """An integer expression of sizes (see L6); `meta` is the lambda's argument, read only as meta["KEY"]."""
        if isinstance(e, ast.Constant):
            return type(e.value) in (int, bool)
        if isinstance(e, (ast.Name, ast.Attribute)):
            return self.dotted(e) is not None and _root(self.dotted(e)) != meta
        if isinstance(e, ast.Subscript):
            if isinstance(e.value, ast.Name) and e.value.id == meta:
                return isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str)
            index = e.slice.operand if isinstance(e.slice, ast.UnaryOp) and isinstance(e.slice.op, ast.USub) else e.slice
            return self._size(e.value, meta) and isinstance(index, ast.Constant) and type(index.value) is int
        if isinstance(e, ast.BinOp):
            return isinstance(e.op, _SIZE_OPS) and self._size(e.left, meta) and self._size(e.right, meta)
        if isinstance(e, ast.UnaryOp):
            return isinstance(e.op, (ast.USub, ast.UAdd)) and self._size(e.operand, meta)
        if not isinstance(e, ast.Call) or e.keywords:
            return False
        if self.resolve(e.func) in ("triton.cdiv", "triton.next_power_of_2") or \
                isinstance(e.func, ast.Name) and e.func.id in ("min", "max"):
            return all(self._size(a, meta) for a in e.args)
        return isinstance(e.func, ast.Attribute) and e.func.attr in _SIZE_METHODS and \
            _root(self.dotted(e.func.value)) not in (None, meta) and \
            all(isinstance(a, ast.Constant) and type(a.value) is int for a in e.args)

    def _condition(self, e, meta) -> bool:
        """A heuristic's value: a size expression, or comparisons of them joined by and / or / not."""
        if isinstance(e, ast.Compare):
            return all(self._size(x, meta) for x in [e.left, *e.comparators])
        if isinstance(e, ast.BoolOp):
            return all(self._condition(x, meta) for x in e.values)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            return self._condition(e.operand, meta)
        return self._size(e, meta)

    # ---- L8 the task's rules: a model, launched kernels, no torch compute ----
    def _structure(self) -> None:
        funcs = self.funcs
        classes = {name: {m.name: m for m in c.body if isinstance(m, ast.FunctionDef)}
                   for name, c in self.classes.items()}
        kernels = set(self.kernels)
        module_names = {target for node in self.module.body for target in _assigned(node)}
        readable = kernels | set(self.aliases) | {
            target for node in self.module.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and self.resolve(node.value.func) == "triton.language.constexpr" for target in _assigned(node)}
        for name in kernels:
            self._kernel_globals(funcs[name], module_names - readable)
        model = classes.get("ModelNew", {})
        if "forward" not in model:
            self.flag("lint_no_model", self.module, "no class ModelNew with a forward method")
            return
        if not kernels:
            self.flag("lint_no_kernel", self.module, "no @triton.jit kernel")
            return
        launched = self._launched(funcs, classes, kernels)
        if not launched:
            self.flag("lint_kernel_not_launched", model["forward"],
                      f"kernels {sorted(kernels)} are never launched (kernel[grid](...)) from ModelNew")
        exempt = {id(n) for fn in [model.get("__init__"), *(funcs[k] for k in kernels)] if fn
                  for stmt in fn.body for n in self.below(stmt)}
        submodules = {f"self.{s}" for s in self._submodules(model.get("__init__"))}
        for node in self.nodes:
            self._torch_ops(node, submodules, strict=id(node) not in exempt)

    def _kernel_globals(self, kernel, unreadable: set) -> None:
        """A kernel body may read only its own names, imports, other kernels and `X = tl.constexpr(...)`
        globals (module names outside those: `unreadable`): what the GPU compiler accepts. Anything else (a dict
        of tensors, a helper function) only works under the interpreter, where it runs as plain Python."""
        local = self.locals[id(kernel)]
        for node in (n for stmt in kernel.body for n in self.below(stmt)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in unreadable and \
                    node.id not in local:
                self.flag("lint_forbidden_call", node, f"kernel {kernel.name} reads global {node.id} (only "
                          "tl.constexpr globals and other kernels compile on a GPU)")

    def _launched(self, funcs, classes, kernels) -> set:
        """Names of the kernels launched (kernel[grid](...)) in the methods of ModelNew and everything they
        reach by name (calls, callbacks, self.method; SomeClass.apply or SomeClass(...) pull in all of
        SomeClass), each function walked once."""
        todo, seen, pulled, launched = [("ModelNew", m) for m in classes["ModelNew"]], set(), {"ModelNew"}, set()
        while todo:
            cls, name = todo.pop()
            if (cls, name) in seen:
                continue
            seen.add((cls, name))
            for node in self.below(classes[cls][name] if cls else funcs[name]):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                        isinstance(node.func.value, ast.Name) and node.func.value.id in kernels:
                    launched.add(node.func.value.id)
                elif isinstance(node, ast.Name) and node.id in funcs and node.id not in kernels:
                    todo.append((None, node.id))
                elif isinstance(node, ast.Name) and node.id in classes and node.id not in pulled:
                    pulled.add(node.id)
                    todo.extend((node.id, m) for m in classes[node.id])
                elif cls and isinstance(node, ast.Attribute) and self.dotted(node) == f"self.{node.attr}" \
                        and node.attr in classes[cls]:
                    todo.append((cls, node.attr))
        return launched

    def _submodules(self, init) -> set:
        """Names X of `self.X = nn.Something(...)` in ModelNew.__init__ (torch modules, except Parameter)."""
        found = set()
        for node in self.below(init) if init else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                target = self.resolve(node.value.func) or ""
                if target.startswith("torch.nn.") and target != "torch.nn.Parameter":
                    found |= {t.attr for t in node.targets if self.dotted(t) == f"self.{getattr(t, 'attr', '')}"}
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
                    self.dotted(node) not in submodules:          # self.linear.weight is a parameter, not a call
                self.flag("lint_torch_op", node, f"tensor method .{node.attr}")
        if not strict:
            return
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            self.flag("lint_torch_op", node, "@ (matmul) on tensors")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func, receiver = node.func, node.func.value
            if self.dotted(receiver) in submodules or self.dotted(func) in submodules:
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
        if (path in _TYPING or path == "typing" and inner) and id(node) not in self.annotations:
            self.flag("lint_import", node, f"uses {path} outside an annotation")
        elif path in exact or inner and (path in prefixes or path in _ALLOWED_MODULES):
            return
        what = f"uses {path}" + ("" if inner or "." in path and path not in _ALLOWED_MODULES else " as a value")
        self.flag("lint_torch_op" if path.split(".")[0] == "torch" else "lint_import", node, what)


def _in_literal(node) -> bool:
    return isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Starred))


def _in_statement(node) -> bool:
    return not isinstance(node, ast.stmt)


class _TooLarge(Exception):
    """The code has more than _NODES_MAX syntax-tree nodes: _index stops there."""


def _index(module: ast.Module) -> tuple:
    """One pass over the module, which every later pass reads instead of walking the tree again: (every node in
    depth-first source order, {id(node): (start, end) of its subtree in that list}, {child: parent}, {id(node): the
    innermost function, lambda or the module holding it (a function or lambda holds itself)}, {id(scope): its
    parameters and the names it assigns outside nested functions and lambdas}, {(id(scope), name): [the Name nodes
    storing name there]})."""
    nodes, spans, parents, scope_of, names, stores = [], {}, {}, {}, {id(module): set()}, {}
    todo = [(module, module)]
    while todo:
        node, scope = todo.pop()
        if scope is None:                  # the end of node's subtree
            spans[id(node)] = (spans[id(node)], len(nodes))
            continue
        kind, start = type(node), len(nodes)
        if start == _NODES_MAX:
            raise _TooLarge(f"over {_NODES_MAX} syntax-tree nodes")
        nodes.append(node)
        if kind is ast.FunctionDef or kind is ast.Lambda:
            scope, a = node, node.args
            names[id(node)] = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        scope_of[id(node)] = scope
        if kind is ast.Name and type(node.ctx) is ast.Store:
            names[id(scope)].add(node.id)
            stores.setdefault((id(scope), node.id), []).append(node)
        children = []                      # ast.iter_child_nodes, without its generators' cost
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                children.append(value)
            elif type(value) is list:
                children += [v for v in value if isinstance(v, ast.AST)]
        if not children:
            spans[id(node)] = (start, start + 1)
            continue
        spans[id(node)] = start
        todo.append((node, None))
        for child in reversed(children):
            parents[child] = node
            todo.append((child, scope))
    return nodes, spans, parents, scope_of, names, stores


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
    the one linted), characters utf-8 cannot encode (lone surrogates), or a carriage return."""
    try:
        data = code.encode("utf-8")
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except (UnicodeEncodeError, SyntaxError) as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    if codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        return f"coding declaration {encoding!r}: only utf-8 source is run"
    if "\r" in code:
        return "a carriage return (Python and line readers would split the lines differently)"
    return None


def lint(code: str) -> tuple:
    """(None, "") when the code passes the rule-based check, else (reason, detail)."""
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > _CODE_MAX:
        return "lint_size", f"{size} bytes of code (at most {_CODE_MAX})"
    problem = _encoding_problem(code)
    if problem:
        return "lint_encoding", problem
    try:
        problems = dict(reversed(_Linter(code, ast.parse(code)).problems))      # first problem of each reason wins
    except _TooLarge as e:
        return "lint_size", str(e)
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError) as e:   # ValueError: NUL
        return "syntax_error", f"{type(e).__name__}: {str(e)[:500]}"      # bytes; Recursion/Memory: deep nesting
    for reason in _LINT_ORDER:
        if reason in problems:
            return reason, problems[reason]
    return None, ""

def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sandbox(files: dict, job: dict, timeout_s: float, out: str, stdin: bytes = b"", fsize_mb: int = 64):
    """Run the harness for `job` with `files` in its scratch dir, files it writes (and `out` read back here) at
    most fsize_mb MiB. Returns (SandboxResult, bytes of `out` or None)."""
    with open(_HARNESS_PATH) as f:
        harness = f.read()
    device = job["device"]
    env = {"TRITON_INTERPRET": "1"} if device == "cpu" else {}  # gpu: run_python shows the rank's GPU alone
    res = run_python(_SCRIPT, {**files, "triton_harness.py": harness, "job.json": json.dumps(job)}, stdin=stdin,
                     timeout_s=timeout_s, env=env, gpu=device == "cuda", read_back=(out,), fsize_mb=fsize_mb)
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
_META_KEYS = frozenset({"error", "detail", "phase", "n_out", "launches", "violations", "ms"})
_PHASES = ("import", "init", "forward")     # where the harness's error happened (or null); "import": no input existed
# a run-time violation's reason by its prefix (lint_torch_op without one: aten ops, bridges, threads), and the order
# in which the reasons win: a refused launch, host compute, a kernel the GPU compiler refuses, a race
_VIOLATION_PREFIXES = {"launch:": "lint_launch", "gpu_compile:": "gpu_compile", "race:": "race"}
_VIOLATION_ORDER = ("lint_launch", "lint_torch_op", "gpu_compile", "race")
_MAX_HEADER = 1 << 18          # bytes of safetensors header: a few dozen tensor entries and meta (<= 80 KB)
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
    """MiB the candidate may write: the result file of tensors shaped as the reference's, with its header."""
    size = _MAX_HEADER + sum(t.numel() * t.element_size() for c in cases for t in [*c["outputs"], *c["inputs"]]
                             if _is_tensor(t))
    return max(_MIN_RESULT_MB, -(-size // (1 << 20)) + 1)


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
    tensors the cases call for: {"error", "detail", "launches", "violations", "ms", "outputs": [[tensor]],
    "after": [{input index: tensor}]}. Raises Malformed. Every count and byte range is checked against the
    reference and the file's length before anything is built from it, so a forged file costs at most a few
    times its own (capped) size here. Nothing is unpickled and nothing is str()-ed."""
    from safetensors.torch import load as load_tensors
    size = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else -1
    if not 0 < size <= min(_MAX_HEADER, len(blob) - 8):
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
    violations, ms = meta["violations"], meta["ms"]
    if not (type(violations) is list and len(violations) <= 256 and
            all(type(v) is str and len(v) <= 300 for v in violations)):
        raise Malformed("violations")
    if not (ms is None or type(ms) is float and math.isfinite(ms) and 0 < ms < 1e7):
        raise Malformed("ms")
    _check_layout(header, {f"out.{k}.{i}" for k in range(n) for i in range(n_out[k])} |
                  {f"after.{k}.{i}" for k, c in enumerate(cases) for i, x in enumerate(c["inputs"]) if _is_tensor(x)},
                  len(blob) - 8 - size)
    try:
        tensors = load_tensors(blob)
    except Exception as e:      # the library's own checks of offsets, dtypes and sizes
        raise Malformed(f"tensors: {type(e).__name__}") from None
    return {"error": None, "detail": "", "launches": launches, "violations": violations, "ms": ms,
            "outputs": [[tensors[f"out.{k}.{i}"] for i in range(n_out[k])] for k in range(n)],
            "after": [{i: tensors[f"after.{k}.{i}"] for i, x in enumerate(c["inputs"]) if _is_tensor(x)}
                      for k, c in enumerate(cases)]}


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _compare(cases: list, result: dict) -> tuple:
    """(reason, detail, public, max_abs_err) for a validated result against the reference cases. public: the
    part of detail that holds no value computed from hidden inputs (the harness's own messages, shapes, dtypes;
    a candidate's exception only from before its inputs existed)."""
    import torch
    if result["error"]:
        return result["error"], result["detail"], result["detail"] if result["phase"] == "import" else "", None
    if result["violations"]:
        reasons = [next((r for p, r in _VIOLATION_PREFIXES.items() if v.startswith(p)), "lint_torch_op")
                   for v in result["violations"]]
        reason = min(reasons, key=_VIOLATION_ORDER.index)
        detail = f"runtime: {[v for v, r in zip(result['violations'], reasons) if r == reason][:5]}"
        return reason, detail, detail, None
    if min(result["launches"]) < 1:
        detail = "runtime: a forward call launched no Triton kernel"
        return "lint_kernel_not_launched", detail, detail, None
    max_err = 0.0
    for k, (case, outs, after) in enumerate(zip(cases, result["outputs"], result["after"], strict=True)):
        for i, y in after.items():
            x = case["inputs"][i]
            if not (y.shape == x.shape and y.dtype == x.dtype and torch.equal(x, y)):
                return "input_mutated", *[f"case {k}: input {i} changed by forward"] * 2, None
        if len(outs) != len(case["outputs"]):
            return "wrong_output", *[f"{len(outs)} outputs, expected {len(case['outputs'])}"] * 2, None
        for o, r in zip(outs, case["outputs"]):
            if o.shape != r.shape or o.dtype != r.dtype:
                return "wrong_output", *[f"case {k}: got {o.dtype} {tuple(o.shape)}, expected {r.dtype} "
                                         f"{tuple(r.shape)}"] * 2, None
            if not r.is_floating_point():
                if not torch.equal(o, r):
                    return "wrong_output", *[f"case {k}: integer output differs"] * 2, None
                continue
            err = (o.double() - r.double()).abs().nan_to_num(float("inf")).max().item() if r.numel() else 0.0
            max_err = max(max_err, err)
            tol = _TOLERANCE.get(str(r.dtype).removeprefix("torch."), 1e-4)
            if not torch.allclose(o, r, atol=tol, rtol=tol, equal_nan=True):
                return "wrong_output", f"case {k}: max abs err {err:.3g} (atol=rtol={tol})", \
                    f"case {k}: values differ (atol=rtol={tol})", max_err
    return "ok", "", "", max_err


def execute(code: str, task: dict, timeout_s: float = 60.0) -> tuple:
    """Run code's ModelNew against task["reference_code"] in the sandbox, no linting. Returns (score, info)."""
    device = _device()
    ref, problem = _reference(task["reference_code"], device)
    if problem:
        return 0.0, {"reason": "reference_error", "detail": problem}
    job = {"role": "candidate", "device": device, "time": device == "cuda"}
    res, blob = _sandbox({"candidate.py": code}, job, timeout_s, "result.bin", stdin=ref["stdin"],
                         fsize_mb=_result_mb(ref["cases"]))
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
    reason, detail, public, max_err = _compare(ref["cases"], result)
    info.update(reason=reason, detail=detail, public=public, max_abs_err=max_err)
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

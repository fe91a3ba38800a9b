"""The language the AutoTriton reward accepts (rewards/triton/lint.py checks it; rewards/triton/kernel.py
is the reward): its rules, the names they allow, and the one-pass index of a module the linter reads.

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
     (interpreter_semantic, _InterpreterComparison, triton_gpu's _triton_gpu_semantics: _triton_reads).
  L4 objects [lint_forbidden_call]: no dunder attribute but __init__, no `_private` attribute but a class's own
     (`self._x` where the class defines or assigns it), none of the frame / code / traceback attributes or
     `.handle`; in kernel bodies only the public attributes of Triton's tensor, tensor descriptor, dtype and
     constexpr; classes at module level, derived only from nn.Module, torch.autograd.Function or classes of the
     file, without decorators or keywords; no generators or coroutines (yield, async, await).
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
  L9 devices [lint_device]: a device is a value the code passes on, never one it inspects: `x.device`,
     `torch.device(...)` and `torch.cuda.current_device()` only as the value of a `device=` keyword, an argument
     of `.to(...)`, `torch.device(...)` or `torch.cuda.device(...)` (itself only a `with` item), or assigned to a
     name whose every load is one of those; no device query (`.is_cuda`, `.is_cpu`, `.get_device()`, ...:
     _DEVICE_QUERIES, `torch.cuda.is_available`). Rules lint_torch.py (_TorchRules).

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
  one path: the reward runs a candidate on one device (the checked run on CPU, issue 52), so code that branched
     on the device (`if x.is_cuda:`) could keep a path the reward never runs, there to do what the checks refuse
     (a racy or partial launch, a torch fallback on a GPU node). Refusing the queries (L9) rather than running
     every branch: a device value can reach a condition only through a query, a comparison, an attribute
     (`.type`, `.index`) or a call of the file's, and each of those is outside L9's places; running both branches
     would need a second device the sandbox does not have, or a fake one that a query could tell apart.
  the audit: it lives in the harness's frames and in modules no allowed name reaches, so accepted code cannot
     switch it off; the run-time checks are defence in depth for what no static rule sees (the types of launch
     arguments). `execute` alone runs code without this rule (the sandbox and the parent's validation hold).
"""

import ast
import codecs
import copy
import functools
import importlib
import inspect
import io
import re
import textwrap
import tokenize
import types

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
               "lint_no_kernel", "lint_kernel_not_launched", "lint_device", "lint_torch_op")
# tensor attributes that ask which device a tensor is on (L9: refused; .device itself may only be passed on)
_DEVICE_QUERIES = frozenset("is_cuda is_cpu is_mps is_xpu is_meta is_ipu is_hpu is_mtia is_xla is_vulkan "
                            "is_privateuseone get_device is_pinned".split())
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
    """Attributes a kernel body may read on a value: the public ones of Triton's tensor, tensor descriptor
    (tl.make_tensor_descriptor's load / store / atomics), dtype and constexpr classes and their instance fields
    (none is a mutating method of a torch tensor; no torch object reaches a kernel body anyway)."""
    import triton.language as tl
    names = {"dtype", "shape", "type", "numel", "element_ty", "value", "primitive_bitwidth", "name"}
    for cls in (tl.tensor, tl.tensor_descriptor, tl.dtype, tl.pointer_type, tl.block_type, tl.constexpr):
        names |= {n for n in dir(cls) if not n.startswith("_")}
    return frozenset(names - _FRAME_ATTRS)


@functools.cache
def _triton_reads() -> frozenset:
    """Names the interpreter's rewrite of a kernel loads from the kernel's module (assignments go through
    interpreter_semantic, chained comparisons through _InterpreterComparison, builtins and boolean operators
    through triton_gpu's _SEMANTICS): found by rewriting a probe with the rewrite the sandbox gives Triton's
    interpreter. A file binding one would run its own code inside every launch."""
    from rewards.triton.gpu import gpu_transformer
    probe = ast.parse("def k(a, b, c):\n    d = a < b < c\n    d += a\n    e: int = b\n    if a and b or not c:\n"
                      "        return [f(a) for f in c][0].x\n    while a == b != c:\n        a, b = b, max(a, 1)\n"
                      "    assert a, b\n")
    before = {n.id for n in ast.walk(probe) if isinstance(n, ast.Name)}
    rewritten = gpu_transformer().visit(copy.deepcopy(probe))
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

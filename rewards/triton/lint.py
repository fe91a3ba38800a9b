"""The Triton reward's linter: `lint(code)` -> (None, "") when code is written in the accepted language
(rewards/triton/language.py, rule by rule), else (reason, detail) of the first problem in _LINT_ORDER."""

import ast
import builtins
import io
import symtable
import tokenize
from collections import Counter

from rewards.triton.language import (_ALLOWED_DUNDERS, _ALLOWED_MODULES, _BUILTINS, _CODE_MAX,
                                     _CONFIG_KEYWORDS, _FRAME_ATTRS, _KERNEL_DECORATORS,
                                     _LINT_ORDER, _MAIN_GUARD, _SIZE_METHODS, _SIZE_OPS, _STRING_MAX,
                                     _TooLarge, _allowed_paths, _assigned, _at_import, _docstrings,
                                     _encoding_problem, _in_literal, _in_statement, _index, _kernel_attrs, _root,
                                     _same_function, _triton_reads, _triton_sources, _undecorated)
from rewards.triton.lint_torch import _TorchRules


class _Linter(_TorchRules, ast.NodeVisitor):
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
        self._devices()

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
                      "of a Triton tensor, tensor descriptor, dtype or constexpr)")
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

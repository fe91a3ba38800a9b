"""The torch side of the Triton reward's linter (rewards/triton/lint.py's _Linter derives from _TorchRules): which
kernels ModelNew launches, torch names and tensor methods outside ModelNew.__init__ and kernel bodies (L8 of
rewards/triton/language.py), and devices (L9): a device is a value the code passes on, never one it inspects or
branches on, since the reward runs a candidate on one device only."""

import ast

from rewards.triton.language import (_ALLOWED_MODULES, _BRIDGE_METHODS, _COMPUTE_METHODS, _DEVICE_QUERIES, _TYPING,
                                     _allowed_paths)

# where a device value may go: torch.cuda.device(d) only as a `with` item, torch.device(...) and .to(...) take one
_DEVICE_TAKERS = ("torch.cuda.device", "torch.device")
_DEVICE_VALUES = ("torch.device", "torch.cuda.current_device")       # calls that make a device value


class _TorchRules:
    """Methods of _Linter (self.nodes, parents, resolve, flag ... are its index and helpers)."""

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

    # ---- L9 devices ----
    def _devices(self) -> None:
        """A device (`x.device`, `torch.device(...)`, `torch.cuda.current_device()`) is only passed on: as the
        value of a `device=` keyword, an argument of `.to(...)`, `torch.device(...)` or of `torch.cuda.device(...)`
        (itself only a `with` item), or assigned to a name whose every load in its scope is one of those. Device
        queries (`.is_cuda`, `.is_cpu`, `.get_device()`, ... and torch.cuda.is_available) are not in the language:
        a branch on the device would hide a path from a reward that runs on one device (L9)."""
        loads = {}
        for node in self.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loads.setdefault((id(self.scope_of[id(node)]), node.id), []).append(node)
        for node in self.nodes:
            path = self.resolve(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            if isinstance(node, ast.Attribute) and path is None and node.attr in _DEVICE_QUERIES or \
                    path == "torch.cuda.is_available":
                self.flag("lint_device", node, f"asks for the device ({ast.unparse(node)}): a branch on it would "
                          "hide a path from a reward that runs on one device")
            elif path == "torch.cuda.device" and not self._with_item(node):
                self.flag("lint_device", node, "torch.cuda.device(...) only as a `with` item")
            elif isinstance(node, ast.Attribute) and node.attr == "device" and path is None or \
                    isinstance(node, ast.Call) and self.resolve(node.func) in _DEVICE_VALUES:
                if not self._passed_on(node, loads):
                    self.flag("lint_device", node, f"uses the device {ast.unparse(node)} as a value (a device is only "
                              "passed on: device=..., .to(...))")

    def _with_item(self, node) -> bool:
        call = self.parents.get(node)
        return isinstance(call, ast.Call) and call.func is node and \
            isinstance(self.parents.get(call), ast.withitem) and self.parents[call].optional_vars is None

    def _passed_on(self, node, loads: dict) -> bool:
        parent = self.parents.get(node)
        if isinstance(parent, ast.keyword):
            return parent.arg == "device"
        if isinstance(parent, ast.Call) and node in parent.args:
            func = parent.func
            return isinstance(func, ast.Attribute) and func.attr == "to" and self.resolve(func) is None or \
                self.resolve(func) in _DEVICE_TAKERS
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
            uses = loads.get((id(self.scope_of[id(parent)]), parent.targets[0].id), [])
            return all(self._passed_on(use, {}) for use in uses)
        return False

"""The AST walk behind static_check: resolve names through imports and assignments, apply the rules."""

from __future__ import annotations

import ast

from kopt.integrity import rules as R
from kopt.integrity.rules import Finding

_BROAD = {"Exception", "BaseException"}
_FILE_LOADERS = {"importlib.util.spec_from_file_location", "importlib.machinery.SourceFileLoader",
                 "runpy.run_path", "runpy.run_module"}


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reraises(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Raise) for s in body for n in ast.walk(s))


def _returns_value(body: list[ast.stmt]) -> bool:
    for s in body:
        for n in ast.walk(s):
            if isinstance(n, ast.Return) and n.value is not None and not (
                    isinstance(n.value, ast.Constant) and n.value.value is None):
                return True
    return False


class Checker(ast.NodeVisitor):
    """One file's walk: resolve names, then apply the rule table to what they resolve to."""

    def __init__(self, file: str, strict: bool, local: set[str]):
        self.file, self.strict, self.local = file, strict, local
        self.alias: dict[str, set[str]] = {}
        self.defined: set[str] = set()
        self.imported: list[str] = []
        self.named_siblings = False
        self.loads_by_path = False
        self.findings: list[Finding] = []
        self._tree: ast.AST = ast.Module(body=[], type_ignores=[])
        self._warners: set[str] | None = None
        """Functions of this file that call warnings.warn (an except clause calling one reports its failure)."""

    def add(self, code: str, node, message: str) -> None:
        """Record a finding at the node's line with the rule's severity."""
        self.findings.append(Finding(code, R.RULES[code][0], message, getattr(node, "lineno", 0), self.file))

    # ---- name resolution ---------------------------------------------------------------
    def check(self, tree: ast.Module) -> None:
        """Collect aliases (two passes, so `a = b` after `b = torch` resolves), then visit."""
        self._doc = _docstrings(tree)
        self._tree, self._warners = tree, None
        for node in ast.walk(tree):
            self._collect(node)
        for node in ast.walk(tree):  # assignments once more: imports are recorded once, aliases settle
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                self._collect(node)
        self.visit(tree)
        if self.loads_by_path and not self.named_siblings:
            self.imported.append("*")  # loads code by a computed path: check every sibling module

    def _warns(self, body: list[ast.stmt]) -> bool:
        """Whether a handler reports its failure: it calls warnings.warn, or a function of this file that does."""
        if self._warners is None:
            self._warners = {f.name for f in ast.walk(self._tree) if isinstance(f, ast.FunctionDef)
                             and any(isinstance(n, ast.Call) and self._call_name(n) in R.WARNS for n in ast.walk(f))}
        return any(isinstance(n, ast.Call) and (self._call_name(n) in R.WARNS or
                                                 (isinstance(n.func, ast.Name) and n.func.id in self._warners))
                   for st in body for n in ast.walk(st))

    def _bind(self, name: str, qual: str) -> None:
        self.alias.setdefault(name, set()).add(qual)

    def _collect(self, node) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self._bind(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                self.imported.append(a.name)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod:
                self.imported.append(mod)
            for a in node.names:
                full = f"{mod}.{a.name}" if mod else a.name
                if a.name != "*":
                    self._bind(a.asname or a.name, full)
                    self.imported.append(full)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            quals = self.qualify(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    for q in quals:
                        self._bind(t.id, q)

    def qualify(self, node) -> set[str]:
        """Dotted names (module paths) an expression may stand for; empty when unknown."""
        if isinstance(node, ast.Name):
            return set(self.alias.get(node.id, ()))
        if isinstance(node, ast.Attribute):
            return {f"{q}.{node.attr}" for q in self.qualify(node.value)}
        if isinstance(node, ast.Call):
            fn = self._call_name(node)
            arg0 = _literal(node.args[0]) if node.args else None
            if fn in ("importlib.import_module", "__import__") and arg0:
                return {arg0 if fn != "__import__" else arg0.split(".")[0]}
            if fn == "getattr" and len(node.args) >= 2 and _literal(node.args[1]):
                return {f"{q}.{_literal(node.args[1])}" for q in self.qualify(node.args[0])}
        if isinstance(node, ast.Subscript):
            key = _literal(node.slice)
            if key and any(q == "sys.modules" for q in self.qualify(node.value)):
                return {key}
        return set()

    def _call_name(self, node: ast.Call) -> str | None:
        f = node.func
        if isinstance(f, ast.Name) and f.id not in self.alias and f.id not in self.defined:
            return f.id  # a builtin
        quals = self.qualify(f)
        return next(iter(sorted(quals)), None)

    def _external(self, quals: set[str]) -> list[str]:
        return sorted(q for q in quals if q.split(".")[0] not in self.local)

    # ---- rules on resolved names -------------------------------------------------------
    def _check_qual(self, q: str, node) -> None:
        if self.strict:  # the first backend rule that matches; the integrity rules below apply as well
            if R.matches(q, R.ATTENTION_LIBS):
                self.add("KS101", node, f"{q}: prebuilt attention kernel in a tilelang candidate")
            elif R.matches(q, R.OTHER_KERNEL_SYSTEMS):
                self.add("KS106", node, f"{q}: not TileLang")
            elif R.matches(q, ("torch.ops", "torch._C")):
                self.add("KS103", node, f"{q}: direct operator call")
            elif q != "torch.nn.functional.pad" and R.matches(q, R.TORCH_MATH):
                self.add("KS102", node, f"{q}: attention math on the host in a tilelang candidate")
            elif q.startswith("torch.") and not R.matches(q, R.TORCH_GLUE_QUALIFIED):
                self.add("KS107", node, f"{q}: host torch op outside the glue allowlist")
        hit = R.matches(q, R.HARNESS_NAMES)
        if hit:
            self.add("KS201" if hit == "kopt" else "KS202", node, f"{q}: reaches into the harness")
        for code, names, what in (("KS205", R.GC, "gc"), ("KS206", R.INTROSPECTION, "introspection"),
                                  ("KS207", R.CONCURRENCY, "threads or processes"),
                                  ("KS208", R.ENVIRON, "environment"), ("KS209", R.NATIVE, "native code"),
                                  ("KS210", R.STREAMS, "side stream"), ("KS215", R.PROCESS_CONTROL, "process control"),
                                  ("KS216", R.PROGRAMS, "external program")):
            if R.matches(q, names):
                self.add(code, node, f"{q}: {what}")
        if R.matches(q, ("sys.modules",)):
            self.add("KS213", node, f"{q}: module table lookup")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_qual(a.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:
            return
        self._check_qual(mod, node)
        for a in node.names:
            if a.name == "*":
                if self.strict and R.matches(mod, ("torch", "numpy") + R.ATTENTION_LIBS):
                    self.add("KS102", node, f"from {mod} import *: hides which ops are used")
                continue
            self._check_qual(f"{mod}.{a.name}", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        for q in self.qualify(node):
            self._check_qual(q, node)
        base = node
        while isinstance(base, ast.Attribute):  # inner prefixes of a chain are not checked on their own
            if base.attr in R.FRAME_ATTRS:
                self.add("KS206", base, f".{base.attr}: frame / globals introspection")
            base = base.value
        if not self.qualify(node.value) and isinstance(node.ctx, ast.Load):
            if self.strict and node.attr in R.TENSOR_MATH_METHODS:
                self.add("KS105", node, f".{node.attr}(: tensor math on the host in a tilelang candidate")
            elif self.strict and node.attr in R.TENSOR_REDUCTIONS:
                self.add("KS108", node, f".{node.attr}(: host reduction")
        if not isinstance(base, ast.Name):
            self.visit(base)

    def visit_Name(self, node: ast.Name) -> None:
        for q in (self.qualify(node) if isinstance(node.ctx, ast.Load) else ()):
            self._check_qual(q, node)
        if node.id in ("__builtins__", "__subclasses__"):
            self.add("KS206", node, f"{node.id}: interpreter internals")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self._doc:
            low = node.value.lower()
            if R.KOPT_STRING.search(node.value):
                self.add("KS201", node, f"string {node.value[:60]!r}: names the harness")
            elif any(s in low for s in R.HARNESS_STRINGS):
                self.add("KS202", node, f"string {node.value[:60]!r}: harness state")
            elif any(p in low for p in R.HARNESS_PATH_PARTS) and not R.TUNING_TABLE.match(node.value):
                self.add("KS217", node, f"path {node.value[:60]!r}: workspace output")
            if node.value in self.local or node.value.removesuffix(".py") in self.local:
                # loaded by name, e.g. a spec_from_file_location helper
                self.imported.append(node.value.removesuffix(".py"))
                self.named_siblings = True
            if node.value == "BACKEND":
                self.add("KS002", node, "BACKEND must not be set or read dynamically")

    def visit_Call(self, node: ast.Call) -> None:
        fn = self._call_name(node)
        name_arg = node.args[1] if len(node.args) > 1 else None
        if fn in ("setattr", "delattr", "object.__setattr__", "type.__setattr__", "object.__delattr__"):
            ext = self._external(self.qualify(node.args[0])) if node.args else []
            if ext:
                self.add("KS203", node, f"{fn}({ext[0]}, ...): patches a module")
            elif name_arg is not None and _literal(name_arg) is None:
                self.add("KS213", node, f"{fn} with a computed name")
        elif fn == "getattr" and name_arg is not None:
            if _literal(name_arg) is None:
                self.add("KS213", node, "getattr with a computed name")
            for q in self.qualify(node):  # getattr(torch, "softmax") is torch.softmax
                self._check_qual(q, node)
        elif fn in ("importlib.import_module", "__import__", "importlib.__import__"):
            arg = _literal(node.args[0]) if node.args else None
            if arg is None:
                self.add("KS213", node, f"{fn} with a computed module name")
            else:
                self.imported.append(arg)
                self._check_qual(arg, node)
        elif fn in R.DYNAMIC_BUILTINS:
            self.add("KS213", node, f"{fn}(): dynamic code")
        elif fn in _FILE_LOADERS:
            self.loads_by_path = True
        elif fn in ("contextlib.suppress",):
            self.add("KS211", node, "contextlib.suppress hides failures")
        self.generic_visit(node)

    def _patch_target(self, t) -> None:
        if isinstance(t, ast.Attribute):
            ext = self._external(self.qualify(t.value))
            if any(q.startswith("torch.backends") for q in ext):
                self.add("KS204", t, f"{ext[0]}.{t.attr} = ...: torch backend flag")
            elif ext:
                self.add("KS203", t, f"{ext[0]}.{t.attr} = ...: patches a module")
        elif isinstance(t, ast.Subscript):
            ext = self._external(self.qualify(t.value))
            if any(q.endswith("__dict__") for q in ext):
                self.add("KS203", t, f"{ext[0]}[...] = ...: patches a module")
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._patch_target(e)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._patch_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._patch_target(node.target)
        if self.strict and isinstance(node.op, ast.MatMult):
            self.add("KS104", node, "@=: matrix multiply on the host")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._patch_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._patch_target(t)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if self.strict and isinstance(node.op, ast.MatMult):
            self.add("KS104", node, "@: matrix multiply on the host")
        self.generic_visit(node)

    def visit_Try(self, node) -> None:
        for h in node.handlers:
            names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
            broad = h.type is None or any(isinstance(n, ast.Name) and n.id in _BROAD for n in names)
            if broad and _returns_value(h.body):
                self.add("KS212", h, "broad except returns another computation (silent fallback)")
            elif not _reraises(h.body) and not self._warns(h.body):
                self.add("KS211", h, "except clause neither re-raises nor warns")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            if any(R.matches(q, ("torch.Tensor",)) for q in self.qualify(b)):
                self.add("KS214", node, f"class {node.name}: tensor subclass")
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add("KS214", node, f"{node.name}: intercepts torch calls")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

"""Static, module tables: what each top-level statement of a module (or a class body) binds a name to.

The tables are what the interpreter would leave in the module's (or class's) `__dict__`, read from
the source alone, in execution order (a later binding wins):

- a `def` or `class` binds its node; `import a.b` binds `a`, `import a.b as c` binds `c`, to a module;
  `from m import x as y` binds `y` to `m:x` (relative imports made absolute); `from m import *` is
  remembered and searched when a name is not bound here;
- `x = <expr>` binds `x` to the expression (followed later when it is a name or a dotted name);
  tuple unpacking binds each name to "some value" (not evaluated); `del x` unbinds;
- `if TYPE_CHECKING:` binds only its `else`; for other `if`/`try` blocks both branches are recorded,
  the first branch last, so it wins over `else`/`except` (what a normal deployment runs); `with` bodies bind.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional, Union

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Import:
    module: str
    name: str


@dataclass(frozen=True)
class ModuleRef:
    module: str


@dataclass(frozen=True)
class Value:
    node: Optional[ast.expr]  # None: bound by something we do not evaluate (tuple unpacking, ...)


Binding = Union[ast.AST, Import, ModuleRef, Value]


@dataclass
class Scope:
    names: dict[str, Binding] = field(default_factory=dict)
    star: list[str] = field(default_factory=list)


@dataclass
class ModuleTable:
    name: str
    path: str
    package: str  # the package relative imports start from
    scope: Scope


def parse_module(name: str, path: str, raw: bytes) -> ModuleTable:
    """The table of module `name`, from the text of its file `path` (a package's `__init__.py` or not)."""
    tree = ast.parse(raw, filename=path)
    package = name if path.rpartition("/")[2] == "__init__.py" else name.rpartition(".")[0]
    scope = Scope()
    bind(tree.body, scope, package)
    return ModuleTable(name, path, package, scope)


def class_scope(node: ast.ClassDef, package: str) -> Scope:
    scope = Scope()
    bind(node.body, scope, package)
    return scope


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def absolute(module: Optional[str], level: int, package: str) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `package`."""
    if level == 0:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, module] if module else base)


def _field_without_default(value: ast.expr) -> bool:
    """`x: T = field(...)` with no `default=`: a dataclass deletes the class attribute (its default is MISSING;
    `default_factory` too), so instances have it and the class does not — as vLLM 0.34.0's
    `KVCacheConfig.needs_kv_cache_zeroing` (a property on 0.33.0) is. Read as no class attribute, as live."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name == "field" and not value.args and all(k.arg != "default" for k in value.keywords)


def bind(stmts: list[ast.stmt], scope: Scope, package: str) -> None:
    """Record what each statement binds, in execution order (a later binding wins)."""
    for st in stmts:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.names[st.name] = st
        elif isinstance(st, ast.Import):
            for a in st.names:
                if a.asname:
                    scope.names[a.asname] = ModuleRef(a.name)
                else:
                    top = a.name.split(".")[0]
                    scope.names[top] = ModuleRef(top)
        elif isinstance(st, ast.ImportFrom):
            mod = absolute(st.module, st.level, package)
            for a in st.names:
                if a.name == "*":
                    scope.star.append(mod)
                else:
                    scope.names[a.asname or a.name] = Import(mod, a.name)
        elif isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    scope.names[t.id] = Value(st.value)
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for e in t.elts:
                        if isinstance(e, ast.Name):
                            scope.names[e.id] = Value(None)
        elif isinstance(st, ast.AnnAssign) and st.value is not None and isinstance(st.target, ast.Name):
            if not _field_without_default(st.value):
                scope.names[st.target.id] = Value(st.value)
        elif isinstance(st, ast.If):
            if _is_type_checking(st.test):
                bind(st.orelse, scope, package)
            else:
                bind(st.orelse, scope, package)
                bind(st.body, scope, package)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            for h in st.handlers:
                bind(h.body, scope, package)
            bind(st.body, scope, package)
            bind(st.orelse, scope, package)
            bind(st.finalbody, scope, package)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            bind(st.body, scope, package)
        elif isinstance(st, ast.Delete):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    scope.names.pop(t.id, None)


# -- attributes of each object: `self.attr = ...` in a class's methods -----------------------------------------
_NOT_METHODS = frozenset({"staticmethod", "classmethod"})
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _methods(stmts: list[ast.stmt]):
    """The instance methods a class body defines (also inside its `if`/`try` blocks), in source order."""
    for st in stmts:
        if isinstance(st, FUNCS):
            if not any((dotted(d.func if isinstance(d, ast.Call) else d) or "").rpartition(".")[2] in _NOT_METHODS
                       for d in st.decorator_list):
                yield st
        elif isinstance(st, (ast.If, ast.Try)) or type(st).__name__ == "TryStar":
            for block in _BLOCKS:
                for part in getattr(st, block, None) or ():
                    yield from _methods(getattr(part, "body", None) if isinstance(part, ast.ExceptHandler) else [part])


def _statements(stmts: list) -> "list[ast.stmt]":
    """Every statement of a function body, nested blocks included, nested functions and classes excluded."""
    out = []
    for st in stmts:
        out.append(st)
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for block in _BLOCKS:
            for part in getattr(st, block, None) or ():
                out.extend(_statements(part.body if isinstance(part, (ast.ExceptHandler, ast.match_case)) else [part]))
    return out


def instance_assignments(node: ast.ClassDef) -> dict[str, list[tuple[str, Optional[ast.expr]]]]:
    """What the class's own methods assign on the object: attribute -> [(method, value)], in source order.

    Counted: `self.x = v`, `self.x: T = v`, `self.x = self.y = v`, and each `self.x` of a tuple target (value
    None: not one expression), where `self` is the method's first parameter. Not counted: an annotation alone
    (`self.x: T`, it assigns nothing), `self.x += 1` (the attribute must exist already), assignments in nested
    functions and classes, `setattr(self, ...)`, and static and class methods. The loader reads the same from the
    class's source (`fingerprint.live_instance_attribute`), so both readings agree."""
    out: dict[str, list[tuple[str, Optional[ast.expr]]]] = {}
    for fn in _methods(node.body):
        params = [*fn.args.posonlyargs, *fn.args.args]
        if not params:
            continue
        me = params[0].arg

        def mine(t: ast.expr) -> Optional[str]:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                return t.attr
            return None

        for st in _statements(fn.body):
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    if mine(t):
                        out.setdefault(mine(t), []).append((fn.name, st.value))
                    elif isinstance(t, (ast.Tuple, ast.List)):
                        for e in t.elts:
                            e = e.value if isinstance(e, ast.Starred) else e
                            if mine(e):
                                out.setdefault(mine(e), []).append((fn.name, None))
            elif isinstance(st, ast.AnnAssign) and st.value is not None and mine(st.target):
                out.setdefault(mine(st.target), []).append((fn.name, st.value))
    return out


def dotted(expr: ast.expr) -> Optional[str]:
    """`a.b.c` for a name or an attribute chain on a name; None for anything else."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = dotted(expr.value)
        return f"{head}.{expr.attr}" if head else None
    return None


__all__ = ["FUNCS", "Binding", "Import", "ModuleRef", "ModuleTable", "Scope", "Value", "absolute", "bind",
           "class_scope", "dotted", "instance_assignments", "parse_module"]

"""Static, lazy exports: the names a package serves through a module-level `__getattr__` (PEP 562) from a table.

`from vllm import LLM` works although `vllm/__init__.py` binds no `LLM`: its `__getattr__` looks the name up in a
module-level dict literal (`MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM", ...}`), imports the module and returns
its attribute. A reader of the module's bindings alone calls that name missing. Read here, generally: every
module-level dict literal whose keys and values are all strings and which the module's `__getattr__` reads by name.

- a value `"module:attr"` is the attribute `attr` of `module`;
- a value `"module"` is the attribute of the requested name of `module` when `__getattr__` calls `getattr(...)`
  (vLLM's processor and config tables: `getattr(importlib.import_module(path), name)`), else the module itself;
- a value with leading dots is relative to the package the module is in (`import_module(path, __package__)`).

Traps: a `__getattr__` that computes its answer some other way (a branch per name, `globals()`, a platform test)
is not read: those names stay missing, as before. The table is read as written, not as the function's test
(`if name in TABLE`) narrows it.
"""

from __future__ import annotations

import ast
from typing import Optional

from vllm_patchkit.upstream.static_tables import FUNCS, Scope, Value, absolute

LazyExports = dict[str, tuple[str, Optional[str]]]  # name -> (absolute module, attribute or None: the module)


def _string_table(node: Optional[ast.expr]) -> Optional[dict[str, str]]:
    if not isinstance(node, ast.Dict) or not node.keys:
        return None
    out = {}
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)
                and isinstance(v, ast.Constant) and isinstance(v.value, str)):
            return None
        out[k.value] = v.value
    return out


def _locals(fn: ast.AST) -> set[str]:
    a = fn.args
    names = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]}
    return names | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _calls_getattr(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
               for n in ast.walk(fn))


def _target(path: str, package: str) -> str:
    stripped = path.lstrip(".")
    level = len(path) - len(stripped)
    return absolute(stripped or None, level, package) if level else stripped


def lazy_exports(scope: Scope, package: str) -> LazyExports:
    """What the module's `__getattr__` serves from its name tables: name -> (module, attribute or None)."""
    fn = scope.names.get("__getattr__")
    if not isinstance(fn, FUNCS):
        return {}
    own = _locals(fn)
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in own}
    by_name = _calls_getattr(fn)
    out: LazyExports = {}
    for table_name in sorted(read):
        b = scope.names.get(table_name)
        table = _string_table(b.node) if isinstance(b, Value) else None
        for name, path in (table or {}).items():
            module, sep, attr = path.partition(":")
            if not module:
                continue
            out.setdefault(name, (_target(module, package), attr if sep else (name if by_name else None)))
    return out


__all__ = ["LazyExports", "lazy_exports"]

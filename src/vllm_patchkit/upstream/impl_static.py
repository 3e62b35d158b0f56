"""A patch's implementation read from its source, never imported.

`check` and `pin` judge call conventions (`convention.py`) and how an override
meets an upstream change (`compat.py`). For that they need the implementation's
signatures, and whether an override calls `super().<name>`: both are in the
source. Importing the implementation module would run it, and a plugin's module
imports vLLM (18 s and 700 MiB for one real set) or worse, aborts the process
(a platform module of another platform). So here:

- the module's file is found without executing anything: each dotted component
  is looked up with the meta path finders (`find_spec(name, parent_locations)`),
  the parent's `submodule_search_locations` handed down — never
  `importlib.util.find_spec("a.b")`, which imports `a`. A module already imported
  is taken from its `__spec__`;
- the file is parsed with `ast`; `module:Qualname` is followed through `def`,
  `class`, `from x import y` (also relative) and simple aliases `x = y`;
- a method is the class's own `def` (then the mixins of the plugin's own side,
  never a vLLM base), with the class's bases named as written; what is read off
  the def found (its signature, its `super()` calls) is `impl_def.ImplDef`'s.

What cannot be found or parsed raises `ImplUnreadable` ("implementation module X
cannot be read: ..."); callers turn it into a finding. A name bound by code that
runs at import (a decorator factory's result, `setattr`) has no readable
signature: `ImplDef.signature` is None and nothing is judged on it.

The loader does not use this module: at start-up it runs inside vLLM anyway and
judges the live objects.
"""

from __future__ import annotations

import ast
import importlib.machinery
import inspect
import os
import sys
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.impl_def import FUNC, ImplDef
from vllm_patchkit.upstream.source_fingerprint import _default
from vllm_patchkit.upstream.static_tables import dotted


class ImplUnreadable(Exception):
    """The implementation cannot be read statically; the message says why. `missing`: its module is not on
    this Python's path at all (not installed where the check runs)."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


# -- finding the file ---------------------------------------------------------------------------
def _spec_of(name: str, path) -> Optional[importlib.machinery.ModuleSpec]:
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__spec__", None) is not None:
        return mod.__spec__
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except Exception:  # a third-party finder's trouble: try the next one
            continue
        if spec is not None:
            return spec
    return None


def locate(module: str) -> Path:
    """The source file of `module`, found without importing it or any parent package."""
    path = None
    parts = module.split(".")
    spec = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        spec = _spec_of(name, path)
        if spec is None:
            if path is None:
                searched = f"sys.path: {_shown([p or os.getcwd() for p in sys.path])}"
            else:
                searched = f"the folders of package {name.rpartition('.')[0]}: {_shown(list(path))}"
            raise ImplUnreadable(f"implementation module {module} cannot be read: no module named {name!r} "
                                 f"on this Python's path (searched {searched})", missing=True)
        if i < len(parts) - 1:
            path = spec.submodule_search_locations
            if path is None:
                raise ImplUnreadable(f"implementation module {module} cannot be read: {name} is not a package")
            path = list(path)
    origin = getattr(spec, "origin", None)
    if not origin or origin in ("built-in", "frozen") or not origin.endswith(".py"):
        raise ImplUnreadable(f"implementation module {module} cannot be read: it has no Python source "
                             f"({origin or 'a namespace package'})")
    return Path(origin)


def _shown(paths: list[str], limit: int = 8) -> str:
    shown = ", ".join(paths[:limit]) or "nothing: the path is empty"
    return shown + (f", and {len(paths) - limit} more" if len(paths) > limit else "")


# -- parsing ------------------------------------------------------------------------------------
_PARSED: dict[str, tuple[float, int, ast.Module]] = {}


def _parse(module: str) -> tuple[Path, ast.Module]:
    file = locate(module)
    try:
        st = os.stat(file)
        hit = _PARSED.get(str(file))
        if hit is not None and hit[:2] == (st.st_mtime, st.st_size):
            return file, hit[2]
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImplUnreadable(f"implementation module {module} cannot be read: {type(exc).__name__}: {exc}") from None
    _PARSED[str(file)] = (st.st_mtime, st.st_size, tree)
    return file, tree


def _bindings(body: list[ast.stmt], out: Optional[dict] = None, fallback: bool = False) -> dict[str, ast.AST]:
    """What each top-level statement binds, in order (an `else`/`except` branch does not override)."""
    out = {} if out is None else out

    def bind(name: str, node: ast.AST) -> None:
        if not (fallback and name in out):
            out[name] = node

    for st in body:
        if isinstance(st, (*FUNC, ast.ClassDef)):
            bind(st.name, st)
        elif isinstance(st, ast.ImportFrom):
            for a in st.names:
                if a.name != "*":
                    bind(a.asname or a.name, st)
        elif isinstance(st, ast.Import):
            for a in st.names:
                bind(a.asname or a.name.split(".")[0], st)
        elif isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    bind(t.id, st.value)
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            bind(st.target.id, st.value)
        elif isinstance(st, ast.If):
            _bindings(st.body, out, fallback)
            _bindings(st.orelse, out, True)
        elif isinstance(st, ast.Try):
            _bindings(st.body, out, fallback)
            for h in st.handlers:
                _bindings(h.body, out, True)
            _bindings(st.orelse, out, fallback)
            _bindings(st.finalbody, out, fallback)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _bindings(st.body, out, fallback)
    return out


def _relative(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


def _decorator_kind(node: ast.AST, in_class: bool) -> str:
    if not isinstance(node, FUNC):
        return "class" if isinstance(node, ast.ClassDef) else "value"
    names = {_default(d) if not isinstance(d, ast.Call) else ast.unparse(d.func) for d in node.decorator_list}
    if "staticmethod" in names:
        return "staticmethod"
    if "classmethod" in names:
        return "classmethod"
    if "property" in names or "functools.cached_property" in names or "cached_property" in names:
        return "property"
    return "method" if in_class else "function"


def _dotted(node: ast.AST) -> Optional[str]:
    """A base class's dotted name; `Generic[T]` is `Generic`."""
    return dotted(node.value if isinstance(node, ast.Subscript) else node)


def _find(module: str, name: str, depth: int = 0) -> ImplDef:
    """`module.name` followed to its definition (through imports and aliases, within reach of the path)."""
    if depth > 20:
        raise ImplUnreadable(f"implementation {module}:{name} cannot be read: import chain too long")
    file, tree = _parse(module)
    binding = _bindings(tree.body).get(name)
    is_package = file.name == "__init__.py"
    if binding is None:
        try:  # a submodule of a package
            return ImplDef(f"{module}.{name}", str(locate(f"{module}.{name}")), "module", ast.Module([], []))
        except ImplUnreadable:
            pass
        stars = [st for st in ast.walk(tree) if isinstance(st, ast.ImportFrom) and any(a.name == "*" for a in st.names)]
        for st in stars:
            try:
                return _find(_relative(module, is_package, st), name, depth + 1)
            except ImplUnreadable:
                continue
        dynamic = stars or any(isinstance(st, FUNC) and st.name == "__getattr__" for st in tree.body) or any(
            isinstance(n, ast.Name) and n.id in ("globals", "setattr") for n in ast.walk(tree))
        if dynamic:  # bound by code that runs at import: found, not readable
            return ImplDef(f"{module}:{name}", str(file), "value", ast.Pass())
        raise ImplUnreadable(f"implementation {module}:{name} cannot be read: {file} defines no {name!r}")
    if isinstance(binding, ast.ImportFrom):
        src = _relative(module, is_package, binding)
        alias = next(a for a in binding.names if (a.asname or a.name) == name)
        try:
            return _find(src, alias.name, depth + 1)
        except ImplUnreadable:
            return ImplDef(f"{src}.{alias.name}", str(locate(f"{src}.{alias.name}")), "module", ast.Module([], []))
    if isinstance(binding, ast.Import):
        return ImplDef(name, str(file), "module", binding)
    if isinstance(binding, ast.Name) and binding.id != name:
        return _find(module, binding.id, depth + 1)
    kind = _decorator_kind(binding, False)
    bases = tuple(b for b in (_dotted(x) for x in binding.bases) if b) if isinstance(binding, ast.ClassDef) else ()
    return ImplDef(f"{module}:{name}", str(file), kind, binding, bases)


def module_tree(module: str) -> tuple[Path, ast.Module]:
    """The implementation module's file and its parse (read once per file version, never imported)."""
    return _parse(module)


def read(place: str) -> ImplDef:
    """The definition `module:Qualname` names (a function, a class, a method of a class)."""
    try:
        module, qual = Target.parse(place)
    except ValueError:
        raise ImplUnreadable(f"implementation {place!r} is not module:Qualname") from None
    head, *rest = qual.split(".")
    d = _find(module, head)
    for part in rest:
        if d.kind != "class":
            raise ImplUnreadable(f"implementation {place} cannot be read: {d.spec} is a {d.kind}, not a class")
        own = own_member(d, part)
        if own is None:
            raise ImplUnreadable(f"implementation {place} cannot be read: {d.spec} defines no {part!r} in its "
                                 "own body")
        d = own
    return d


def own_member(cls: ImplDef, name: str) -> Optional[ImplDef]:
    """`name` as the class body itself binds it (a def, or a class-level alias `name = other`)."""
    body = _bindings(cls.node.body)
    node = body.get(name)
    if isinstance(node, ast.Name) and isinstance(body.get(node.id), FUNC):
        node = body[node.id]
    if node is None or isinstance(node, (ast.Import, ast.ImportFrom)):
        return None
    kind = _decorator_kind(node, True)
    bases = tuple(b for b in (_dotted(x) for x in node.bases) if b) if isinstance(node, ast.ClassDef) else ()
    return ImplDef(f"{cls.spec}.{name}", cls.file, kind, node, bases)


def base_defs(cls: ImplDef) -> list[ImplDef]:
    """The class's bases that are the plugin's own (read statically); a vLLM base, or one that cannot be
    read, ends the walk there."""
    out = []
    module = Target.parse(cls.spec).module
    for b in cls.bases:
        head, _, rest = b.partition(".")
        try:
            d = _find(module, head)
            for part in rest.split(".") if rest else []:
                d = _find(d.spec.replace(":", "."), part) if d.kind == "module" else own_member(d, part)
                if d is None:
                    break
        except ImplUnreadable:
            continue
        if d is None or d.kind != "class" or Target.parse(d.spec).module.split(".")[0] == "vllm":
            continue
        out.append(d)
    return out


def override(cls_spec: str, name: str) -> Optional[ImplDef]:
    """The implementation's own definition of method `name`: the class's body, else a mixin of its own side
    (depth first over the bases as written, vLLM's classes excluded). None: it does not define it."""
    cls = read(cls_spec)
    if cls.kind != "class":
        raise ImplUnreadable(f"implementation {cls_spec} cannot be read as a class: it is a {cls.kind}")
    seen: set[str] = set()
    todo = [cls]
    while todo:
        c = todo.pop(0)
        if c.spec in seen:
            continue
        seen.add(c.spec)
        own = own_member(c, name)
        if own is not None:
            return own
        todo[:0] = base_defs(c)
    return None


def call_signature(d: ImplDef) -> Optional[inspect.Signature]:
    """The signature a call of the object has, as `inspect.signature` of the live object gives it: a classmethod
    without `cls`, a class as its own `__init__` without `self` (None when it defines none)."""
    if d.kind == "class":
        init = override(d.spec, "__init__")
        sig = init.signature if init is not None else None
    elif d.kind == "classmethod":
        sig = d.signature
    else:
        return d.signature
    if sig is None:
        return None
    params = list(sig.parameters.values())
    first = params[0] if params else None
    if first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return sig.replace(parameters=params)


def clear_cache() -> None:
    _PARSED.clear()


__all__ = ["ImplUnreadable", "locate", "module_tree", "override", "read"]

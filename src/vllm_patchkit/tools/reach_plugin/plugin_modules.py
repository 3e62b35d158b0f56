"""A plugin's modules, parsed once, and what a name in one of them refers to: a vLLM name, one of the plugin's own
definitions, or neither. Read from the plugin's files in place (`scan/sources.py`: a folder, a wheel, an installed
distribution), never imported; nothing here knows a vLLM release.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from typing import Optional, Union

from vllm_patchkit.tools.scan.sources import PluginSource
from vllm_patchkit.upstream.impl_def import ImplDef
from vllm_patchkit.upstream.impl_static import _bindings, _dotted, _relative
from vllm_patchkit.upstream.reach import is_vllm


@dataclass(frozen=True)
class VllmName:
    """`module` (a module of vLLM, `qual` "") or `module:qual` (a name it defines), as the plugin wrote it."""

    module: str
    qual: str = ""

    @property
    def spec(self) -> str:
        return f"{self.module}:{self.qual}" if self.qual else self.module

    def attr(self, name: str) -> "VllmName":
        return VllmName(self.module, f"{self.qual}.{name}") if self.qual else VllmName(f"{self.module}.{name}")


@dataclass(frozen=True)
class PluginName:
    """A definition of the plugin's own: `module:qual` (a class, a function)."""

    module: str
    qual: str

    @property
    def spec(self) -> str:
        return f"{self.module}:{self.qual}"


Name = Union[VllmName, PluginName, None]


@dataclass
class Module:
    name: str
    path: str  # as the distribution lists it (shown as file:line)
    tree: ast.Module
    is_package: bool

    def bindings(self) -> dict:
        if not hasattr(self, "_bindings"):
            self._bindings = _bindings(self.tree.body)
        return self._bindings


class PluginModules:
    """Every parsable module of the plugin; the files that do not parse are `errors` (path, why)."""

    def __init__(self, src: PluginSource):
        self.label = src.label
        self.modules: dict[str, Module] = {}
        self.errors: list[tuple[str, str]] = list(src.errors)
        for pf in src.files:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(pf.data, filename=pf.path)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                self.errors.append((pf.path, f"{type(exc).__name__}: {exc}"))
                continue
            if pf.module and not is_vllm(pf.module):
                self.modules[pf.module] = Module(pf.module, pf.path, tree, pf.path.endswith("__init__.py"))

    # -- names
    def resolve(self, module: str, path: str, depth: int = 0) -> Name:
        """What the dotted `path`, written in `module`, refers to."""
        mod = self.modules.get(module)
        if mod is None or depth > 20:
            return None
        head, *rest = path.split(".")
        b = mod.bindings().get(head)
        got: Name = None
        if isinstance(b, ast.ImportFrom):
            src = _relative(module, mod.is_package, b)
            alias = next(a for a in b.names if (a.asname or a.name) == head)
            if is_vllm(src):
                got = VllmName(src, alias.name)
            elif src in self.modules:
                got = self.resolve(src, alias.name, depth + 1) or (
                    PluginName(f"{src}.{alias.name}", "") if f"{src}.{alias.name}" in self.modules else None)
            elif f"{src}.{alias.name}" in self.modules:
                got = PluginName(f"{src}.{alias.name}", "")
        elif isinstance(b, ast.Import):
            alias = next(a for a in b.names if (a.asname or a.name.split(".")[0]) == head)
            full = alias.name if alias.asname else alias.name.split(".")[0]
            got = VllmName(full) if is_vllm(full) else PluginName(full, "") if full in self.modules else None
        elif isinstance(b, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            got = PluginName(module, head)
        elif isinstance(b, ast.Name) and b.id != head:
            got = self.resolve(module, b.id, depth + 1)
        elif isinstance(b, ast.Attribute) and _dotted(b):
            got = self.resolve(module, _dotted(b), depth + 1)
        for part in rest:
            if got is None:
                return None
            if isinstance(got, VllmName):
                got = got.attr(part)
            elif not got.qual:  # a plugin module: a name in it
                got = self.resolve(got.module, part, depth + 1) if got.module in self.modules else None
            else:
                got = PluginName(got.module, f"{got.qual}.{part}")
        return got

    def alternatives(self, module: str, local: str) -> list[VllmName]:
        """Every vLLM name the module's top-level imports bind to `local`, in source order (a guarded import and its
        fallback: the release decides which one the name is)."""
        mod = self.modules.get(module)
        out: list[VllmName] = []
        for st in _top_statements(mod.tree.body) if mod is not None else []:
            if isinstance(st, ast.ImportFrom):
                src = _relative(module, mod.is_package, st)
                out += [VllmName(src, a.name) for a in st.names if (a.asname or a.name) == local and is_vllm(src)]
        return out

    def definition(self, spec: PluginName) -> Optional[ast.AST]:
        """The plugin's `def` or `class` `spec` names (a class's method too)."""
        mod = self.modules.get(spec.module)
        if mod is None or not spec.qual:
            return None
        head, *rest = spec.qual.split(".")
        node = mod.bindings().get(head)
        for part in rest:
            if not isinstance(node, ast.ClassDef):
                return None
            node = _bindings(node.body).get(part)
        return node if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None

    def find(self, module: str, name: str) -> Optional[ImplDef]:
        """`module.name` as an `ImplDef` (what the reach's walk calls into), or None."""
        got = self.resolve(module, name)
        if not isinstance(got, PluginName):
            return None
        node = self.definition(got)
        if node is None:
            return None
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        return ImplDef(got.spec, self.modules[got.module].path, kind, node)

    def classes(self):
        """Every class of the plugin, nested in functions too: (module, qualname, node), each once."""
        seen: set[int] = set()
        for mod in self.modules.values():
            for module, qual, node in _classes(mod.name, mod.tree.body, ""):
                if id(node) not in seen:
                    seen.add(id(node))
                    yield module, qual, node

    def functions(self):
        """Every function of the plugin, methods and nested ones included: (module, owner class or None, node)."""
        for mod in self.modules.values():
            yield from _functions(mod.name, mod.tree, None)


def _top_statements(body: list):
    for st in body:
        yield st
        if isinstance(st, (ast.If, ast.Try)):
            for block in (st.body, st.orelse, getattr(st, "finalbody", []), *[h.body for h in getattr(st, "handlers", [])]):
                yield from _top_statements(block)


def _classes(module: str, body: list, prefix: str):
    for st in body:
        if isinstance(st, ast.ClassDef):
            qual = f"{prefix}{st.name}"
            yield module, qual, st
            yield from _classes(module, st.body, f"{qual}.")
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = [n for n in ast.walk(st) if isinstance(n, ast.ClassDef)]
            yield from ((module, f"{prefix}{st.name}.<locals>.{n.name}", n) for n in inner)


def _functions(module: str, node: ast.AST, owner: Optional[str], prefix: str = ""):
    for st in ast.iter_child_nodes(node):
        if isinstance(st, ast.ClassDef):
            yield from _functions(module, st, f"{prefix}{st.name}", f"{prefix}{st.name}.")
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield module, owner, st
            yield from _functions(module, st, None, f"{prefix}{st.name}.<locals>.")
        elif isinstance(st, (ast.stmt, ast.ExceptHandler, ast.match_case)):
            yield from _functions(module, st, owner, prefix)


__all__ = ["Module", "PluginModules", "PluginName", "VllmName"]

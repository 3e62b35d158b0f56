"""Every vLLM name a plugin imports, with its guard: an import inside `try:` whose `except ImportError` (or a
broader handler) binds a fallback is one of several alternatives, and only all of them failing breaks the plugin.

A guard's fallbacks are what its handler imports from vLLM; a handler that imports nothing from vLLM (it sets the
name to None, defines a stand-in, or passes) is a fallback the plugin provides itself. Imports under
`if TYPE_CHECKING:` never run: not read.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from vllm_patchkit.tools.reach_plugin.plugin_modules import Module
from vllm_patchkit.upstream.impl_static import _relative
from vllm_patchkit.upstream.reach import is_vllm
from vllm_patchkit.upstream.static_tables import dotted

CATCHES_IMPORT = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"})


@dataclass(frozen=True)
class ImportUse:
    """`from module import name` (or `import module.name`) at file:line; `guard`: the id of the `try` (or the
    handler) it is in (None: unguarded); `fallback`: the alternative's vLLM imports (for an import in a `try`, its
    handler's; for one in a handler, the `try`'s), `own_fallback`: the handler provides the name itself."""

    module: str
    name: str
    file: str
    line: int
    guard: Optional[int] = None
    fallback: tuple[tuple[str, str, int], ...] = ()  # (module, name, line)
    own_fallback: bool = False

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"


def _catches_import(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    return any((dotted(t) or "").rpartition(".")[2] in CATCHES_IMPORT for t in types)


def _vllm_imports(module: Module, body: list) -> list[tuple[str, str, int]]:
    """(module, name, line) of every vLLM import in these statements (nested blocks included, defs left out)."""
    out = []
    for st in body:
        for n in _walk_no_defs(st):
            if isinstance(n, ast.ImportFrom):
                src = _relative(module.name, module.is_package, n)
                if is_vllm(src):
                    out += [(src, a.name, n.lineno) for a in n.names if a.name != "*"]
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if is_vllm(a.name) and "." in a.name:
                        mod, _, last = a.name.rpartition(".")
                        out.append((mod, last, n.lineno))
    return out


def _walk_no_defs(node: ast.AST):
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _walk_no_defs(child)


def _is_type_checking(st: ast.stmt) -> bool:
    return isinstance(st, ast.If) and (dotted(st.test) or "").rpartition(".")[2] == "TYPE_CHECKING"


def imports_of(module: Module) -> list[ImportUse]:
    """The module's vLLM imports, functions' own included, each with its guard."""
    out: list[ImportUse] = []

    def visit(body: list, guard: Optional[tuple[int, tuple, bool]]) -> None:
        for st in body:
            if _is_type_checking(st):
                visit(st.orelse, guard)
                continue
            if isinstance(st, ast.Try):
                handlers = [h for h in st.handlers if _catches_import(h)]
                if handlers:
                    fallback = tuple(x for h in handlers for x in _vllm_imports(module, h.body))
                    own = not fallback
                    visit(st.body, (id(st), fallback, own))
                    tried = tuple(_vllm_imports(module, st.body))  # a handler's import: the body's are its alternative
                    for h in st.handlers:
                        visit(h.body, (id(h), tried, False) if tried and h in handlers else guard)
                else:
                    visit(st.body, guard)
                    for h in st.handlers:
                        visit(h.body, guard)
                visit(st.orelse, guard)
                visit(st.finalbody, guard)
                continue
            if isinstance(st, (ast.ImportFrom, ast.Import)):
                for mod, name, line in _vllm_imports(module, [st]):
                    g, fb, own = guard if guard else (None, (), False)
                    out.append(ImportUse(mod, name, module.path, line, g, fb, own))
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(st, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    visit(inner, None if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) else guard)
            for h in getattr(st, "handlers", []):
                visit(h.body, guard)
            for case in getattr(st, "cases", []):
                visit(case.body, guard)

    visit(module.tree.body, None)
    return out


__all__ = ["ImportUse", "imports_of"]

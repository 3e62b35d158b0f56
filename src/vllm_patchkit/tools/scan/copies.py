"""Copied bodies, whatever the plugin calls them: each plugin function is compared with the upstream functions
its code reaches (the methods of the classes its sites patch or subclass, and every function of the vLLM
modules the file imports), by a normalised-AST similarity: docstrings, comments, decorators and formatting
dropped, the function's own name and its locals renamed in order of first use, then difflib's ratio over the
statement lines. A copy named `schedule_v031` of `Scheduler.schedule` is found like one named `schedule`.

Bounded so the scan stays fast: each upstream module is parsed and its bodies normalised once per release
(memoised on the `Upstream`); a pair is compared only when the sizes could reach the threshold (2·min/(a+b))
and difflib's quick bound does."""

from __future__ import annotations

import ast
import difflib
from typing import Iterable, Optional

SIMILARITY = 0.8  # ratio at or above which a body is a copy
MIN_LINES = 4  # shorter bodies are too generic to call copies (a site's own target)
MIN_LINES_ANY = 8  # a body compared with every function of a module: longer still, to rule out look-alike helpers

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        if node.id in self.names:
            node.id = self.names[node.id]
        return node

    def visit_arg(self, node):
        if node.arg in self.names:
            node.arg = self.names[node.arg]
        node.annotation = self.visit(node.annotation) if node.annotation is not None else None
        return node


def _locals(fn: ast.AST) -> dict[str, str]:
    """The function's parameters and assigned names (nested functions' too), each -> `_vN` by first use."""
    declared = {n for node in ast.walk(fn) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}
    order: list[str] = []
    for node in ast.walk(fn):
        name = None
        if isinstance(node, ast.arg):
            name = node.arg
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            name = node.id
        if name and name not in declared and name not in order:
            order.append(name)
    return {n: f"_v{i}" for i, n in enumerate(order)}


def normalised(fn: ast.AST) -> tuple[str, ...]:
    """The function as statement lines: no docstrings, comments, decorators; its name and locals renamed."""
    try:
        copy = ast.parse(ast.unparse(fn)).body[0]
        for node in ast.walk(copy):
            body = getattr(node, "body", None)
            if (isinstance(node, (*FUNC, ast.ClassDef)) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
            if isinstance(node, FUNC):
                node.decorator_list = []
        copy.name = "_f"
        copy = _Renamer(_locals(copy)).visit(copy)
        return tuple(line.strip() for line in ast.unparse(copy).splitlines() if line.strip())
    except (Exception, RecursionError):
        return ()


def ratio(a: tuple[str, ...], b: tuple[str, ...], min_lines: int = MIN_LINES) -> float:
    """difflib's ratio of two normalised bodies; 0.0 when either is too short or the sizes cannot reach the
    threshold (the bound 2·min/(a+b) of any ratio)."""
    if len(a) < min_lines or len(b) < min_lines or 2 * min(len(a), len(b)) / (len(a) + len(b)) < SIMILARITY:
        return 0.0
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if m.real_quick_ratio() < SIMILARITY or m.quick_ratio() < SIMILARITY:
        return 0.0
    return m.ratio()


def similarity(a: ast.AST, b: ast.AST) -> float:
    return ratio(normalised(a), normalised(b))


class BodyIndex:
    """The normalised upstream bodies of one release, per module and per class, read once."""

    def __init__(self, up):
        self.up = up
        self.memo = up._memo  # shared with the Upstream: one index per release however many scans use it

    def module_bodies(self, module: str) -> list[tuple[str, tuple[str, ...]]]:
        """(`module:Qualname`, normalised lines) of the module's functions and its classes' methods."""
        key = ("bodies", module)
        if key not in self.memo:
            out: list[tuple[str, tuple[str, ...]]] = []
            tree = self._tree(module)
            for node in tree.body if tree is not None else []:
                if isinstance(node, FUNC):
                    out.append((f"{module}:{node.name}", normalised(node)))
                elif isinstance(node, ast.ClassDef):
                    out += [(f"{module}:{node.name}.{s.name}", normalised(s)) for s in node.body if isinstance(s, FUNC)]
            self.memo[key] = out
        return self.memo[key]

    def class_bodies(self, class_spec: str) -> list[tuple[str, tuple[str, ...]]]:
        """The methods of a vLLM class and of the vLLM classes of its MRO, each where it is defined."""
        key = ("class_bodies", class_spec)
        if key not in self.memo:
            out = []
            for spec, node in self.up._mro_of(class_spec.replace(":", ".")):
                if spec.split(".")[0] == "vllm":
                    out += [(f"{spec}.{s.name}", normalised(s)) for s in node.body if isinstance(s, FUNC)]
            self.memo[key] = out
        return self.memo[key]

    def _tree(self, module: str) -> Optional[ast.Module]:
        try:
            table = self.up.release.module(module) if self.up.release is not None else None
            raw = self.up.release.source.read(table.path) if table is not None else None
            return ast.parse(raw) if raw else None
        except (Exception, RecursionError):
            return None


def best(lines: tuple[str, ...], candidates: Iterable[tuple[str, tuple[str, ...]]],
         min_lines: int = MIN_LINES_ANY) -> Optional[tuple[str, float]]:
    """The candidate the body copies most closely (≥ SIMILARITY), or None."""
    found = None
    for spec, other in candidates:
        r = ratio(lines, other, min_lines)
        if r >= SIMILARITY and (found is None or r > found[1]):
            found = (spec, r)
    return found


def imported_vllm_modules(tree: ast.Module, is_module) -> list[str]:
    """The vLLM modules a plugin file imports (`from vllm.x import Y` -> vllm.x, and vllm.x.Y when a module)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "vllm")
    return sorted(m for m in out if is_module(m))


def plugin_functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualname, node) of a file's top-level functions and its classes' methods."""
    out = []
    for node in tree.body:
        if isinstance(node, FUNC):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{s.name}", s) for s in node.body if isinstance(s, FUNC)]
    return out


__all__ = ["BodyIndex", "MIN_LINES", "SIMILARITY", "best", "imported_vllm_modules", "normalised", "plugin_functions",
           "ratio", "similarity"]

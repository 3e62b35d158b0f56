"""The framework's import graph, read from its source (nothing imported): module -> modules it imports, at the
top of the file or inside a function. A function-local import is an arrow like any other: hiding one in a
function does not take it out of the graph, so a circle or an upward arrow cannot be dodged that way."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "vllm_patchkit"
#: The layers, lowest first: a module may import its own layer and the ones below it, never one above.
LAYERS = ("declaration", "upstream", "runtime", "reporting", "hooks", "tools")
#: This repository's patch set (its own top-level package, beside the framework): the framework reaches it only
#: through the `vllm_patchkit.patch_sets` entry point, never by an import.
PATCH_SET_PACKAGES = ("patchkit_deepseek_v4",)


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    local: bool  # inside a function

    def __str__(self) -> str:
        where = "inside a function" if self.local else "at the top"
        return f"{self.source} -> {self.target} (line {self.line}, {where})"


def modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def arrows() -> list[Arrow]:
    mods = modules()
    out = []
    for name, path in sorted(mods.items()):
        tree = ast.parse(path.read_text())
        local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
                found = [n for n in names if n in mods] or [node.module]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for target in found:
                if target.startswith((PACKAGE, *PATCH_SET_PACKAGES)) and target != name:
                    out.append(Arrow(name, target, node.lineno, id(node) in local))
    return out


def relative_imports() -> list[str]:
    """Relative imports hide which layer they reach: the framework writes every import absolute."""
    out = []
    for name, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                out.append(f"{name} line {node.lineno}")
    return out


def cycles(edges: list[Arrow]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a in edges:
        graph.setdefault(a.source, set()).add(a.target)
        graph.setdefault(a.target, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(edges: list[Arrow]) -> list[Arrow]:
    out = []
    for a in edges:
        src, dst = layer(a.source), layer(a.target)
        if src and dst and LAYERS.index(dst) > LAYERS.index(src):
            out.append(a)
        elif src and dst is None and not a.target.startswith(PATCH_SET_PACKAGES):
            out.append(a)  # a framework module outside every layer
    return out


def into_patch_sets(edges: list[Arrow]) -> list[Arrow]:
    return [a for a in edges if a.target.startswith(PATCH_SET_PACKAGES)]

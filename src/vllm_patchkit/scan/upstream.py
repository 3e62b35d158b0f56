"""The vLLM side, read statically: where a dotted path lands in the release (`module:Qualname`), whether the
release has it, and which plugin functions are copies of an upstream body.

The release is read with `vllm_patchkit.static.StaticRelease` (from the installed tree found without importing
it, or from a wheel / source folder); vLLM is never imported by the scan.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import Optional, Union

from ..static import Definition, Missing, StaticRelease

SIMILARITY = 0.8  # difflib ratio over normalised source lines at or above which a body is a copy
MIN_LINES = 4  # shorter bodies are too generic to call copies


class Upstream:
    """One release, read lazily; every question answered without raising."""

    def __init__(self, release: Optional[StaticRelease]):
        self.release = release
        self._modules: dict[str, bool] = {}

    @classmethod
    def open(cls, source: Optional[Union[str, Path]] = None) -> "Upstream":
        """`source` (a wheel or folder), else the installed vLLM's tree (found without importing it), else none."""
        try:
            if source is not None:
                return cls(StaticRelease.open(source))
            from ..releases import installed_root
            from ..static import DirSource

            root = installed_root()
            return cls(StaticRelease(DirSource(root)) if root is not None else None)
        except Exception:
            return cls(None)

    @property
    def label(self) -> Optional[str]:
        if self.release is None:
            return None
        try:
            return f"vLLM {self.release.version()} ({self.release.label})"
        except Exception:
            return f"vLLM ({self.release.label})"

    def version(self) -> Optional[str]:
        try:
            return self.release.version() if self.release is not None else None
        except Exception:
            return None

    def is_module(self, name: str) -> bool:
        if name not in self._modules:
            ok = False
            if self.release is not None:
                rel = name.replace(".", "/")
                src = self.release.source
                try:
                    ok = src.read(f"{rel}.py") is not None or src.read(f"{rel}/__init__.py") is not None
                except Exception:
                    ok = False
            self._modules[name] = ok
        return self._modules[name]

    def place(self, dotted: str) -> str:
        """`vllm.a.b.C.m` -> `vllm.a.b:C.m`: the longest prefix that is a module of the release (without a
        release: up to the first capitalised name, else all but the last)."""
        parts = dotted.split(".")
        if self.release is not None:
            for i in range(len(parts), 0, -1):
                if self.is_module(".".join(parts[:i])):
                    rest = parts[i:]
                    return ".".join(parts[:i]) + (":" + ".".join(rest) if rest else "")
        for i, p in enumerate(parts):
            if p[:1].isupper() and i > 0:
                return ".".join(parts[:i]) + ":" + ".".join(parts[i:])
        return ".".join(parts[:-1]) + ":" + parts[-1] if len(parts) > 1 else dotted

    def resolve(self, spec: str) -> Optional[Union[Definition, Missing]]:
        if self.release is None or ":" not in spec:
            return None
        try:
            return self.release.resolve(spec)
        except (Exception, RecursionError) as exc:  # a release module that does not parse
            return Missing(spec, f"unreadable: {type(exc).__name__}: {exc}", unreadable=True)

    def definition(self, spec: str) -> Optional[Definition]:
        """The def the release has for `spec`, following an inherited attribute to the base that defines it."""
        d = self.resolve(spec)
        if isinstance(d, Missing) and d.inherited_from:
            d = self.resolve(d.inherited_from)
        return d if isinstance(d, Definition) else None


# -- copies -------------------------------------------------------------------------------------
def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def normalised_lines(fn: ast.AST) -> list[str]:
    """The function's source with docstrings and comments dropped, names kept, one statement line each."""
    try:
        copy = ast.parse(ast.unparse(fn))
        copy = _strip_docstrings(copy)
        for node in ast.walk(copy):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                node.decorator_list = []
        return [line.strip() for line in ast.unparse(copy).splitlines() if line.strip()]
    except (Exception, RecursionError):
        return []


def similarity(a: ast.AST, b: ast.AST) -> float:
    la, lb = normalised_lines(a), normalised_lines(b)
    if len(la) < MIN_LINES or len(lb) < MIN_LINES:
        return 0.0
    return difflib.SequenceMatcher(None, la, lb, autojunk=False).ratio()


def is_function(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))


__all__ = ["SIMILARITY", "Upstream", "normalised_lines", "similarity"]

"""Readings of one piece of plugin source on its own: a string constant, a short text for a finding, whether a
dotted name is vLLM's, whether a method calls its base. They need no scope, so every stage of the scan (name
resolution, the site recognisers, the walk, `scanner.py`) shares them from here.
"""

from __future__ import annotations

import ast
from typing import Optional


def is_vllm(path: Optional[str]) -> bool:
    return bool(path) and (path == "vllm" or path.startswith("vllm."))


def _const_str(e: Optional[ast.AST]) -> Optional[str]:
    return e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None


def _const_scalar(e: ast.AST) -> Optional[str]:
    if isinstance(e, ast.Constant) and isinstance(e.value, (str, int, float, bool)):
        return str(e.value)
    return None


def _short(e: ast.AST, n: int = 80) -> str:
    try:
        text = ast.unparse(e)
    except Exception:
        return "?"
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _calls_super(fn: ast.AST, cls: ast.ClassDef) -> bool:
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            v = sub.func.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                return True
            if isinstance(v, ast.Name) and v.id != "self" and any(
                    isinstance(b, (ast.Name, ast.Attribute)) and _short(b).split(".")[-1] == v.id for b in cls.bases):
                return True  # Base.method(self, ...)
    return False


__all__ = ["_calls_super", "_const_scalar", "_const_str", "_short", "is_vllm"]

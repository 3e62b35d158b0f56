"""The diff of a copied upstream body between the release it was pinned on and another.

A patch that copies upstream code (`reimplements`, or a `replace`) is pinned by the body's
normalised source digest; when the digest changes, the person re-syncing the copy needs to
see *what* changed, not two hashes. The text compared is `ast.unparse` of the definition
with its docstring and decorators dropped: the same normalisation the digest uses
(`fingerprint.source_digest`), so formatting and comments never show up as a change.
"""

from __future__ import annotations

import ast
import difflib
from typing import Any, Optional

#: lines of a diff kept in a finding; the rest is counted, not shown
MAX_LINES = 60


def normalised_lines(node: ast.AST) -> list[str]:
    """The definition's code as `ast.unparse` writes it, without docstring and decorators."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:] or [ast.Pass()]
        node = type(node)(**{**node.__dict__, "body": body, "decorator_list": []})
    return ast.unparse(node).splitlines()


def body_diff(old: Any, new: Any, old_label: str, new_label: str, limit: Optional[int] = MAX_LINES) -> Optional[str]:
    """A unified diff of two definitions (ast nodes), cut at `limit` lines (None: whole); None when they read
    the same."""
    lines = list(difflib.unified_diff(normalised_lines(old), normalised_lines(new), old_label, new_label,
                                      n=2, lineterm=""))
    if not lines:
        return None
    added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
    removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
    head = f"{removed} line(s) removed, {added} added (normalised: no docstrings, comments or formatting)"
    if limit is not None and len(lines) > limit:
        lines = lines[:limit] + [f"... {len(lines) - limit} more diff line(s)"]
    return "\n".join([head, *lines])


def cut(diff: str, limit: int = MAX_LINES) -> str:
    """A whole diff as a person reads it in a terminal or an annotation: its head line and `limit` lines, the
    rest counted (`--format json` carries it whole)."""
    lines = diff.splitlines()
    if len(lines) <= limit + 1:
        return diff
    return "\n".join(lines[:limit + 1] + [f"... {len(lines) - limit - 1} more diff line(s) (whole in --format json)"])

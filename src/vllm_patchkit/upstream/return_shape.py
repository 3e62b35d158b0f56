"""What a call of an upstream function returns, as far as its source says: its return shape.

Why: a wrap whose implementation unpacks `wrapped(...)` (`blocks, hit, boundary = result`) breaks when upstream
returns a tuple with one more element, and neither the signature nor a source digest (pinned for a `replace`
only) says so. `pin` records the shape next to the signature, `check` and the loader compare it, and `compat.py`
judges the change for the patch.

The shape is read, never guessed: `tuple[N]` only when every `return` of the def's own body (not of the defs,
lambdas or classes inside it) returns a tuple literal of N elements, none of them starred, and the body cannot
end without a `return` (an implicit `None`). A generator or an `async def` (the call returns a generator or a
coroutine), a `return x`, tuples of several lengths: not read (None). One reading for the static and the live
path (`source_fingerprint.from_def`).
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SHAPE = re.compile(r"^tuple\[([0-9]+)\]$")


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a def's own body: the defs, lambdas and classes inside it (and their bodies) left out."""
    stack = list(getattr(fn, "body", ()))
    while stack:
        node = stack.pop()
        if isinstance(node, SCOPES):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _ends(body: list[ast.stmt]) -> bool:
    """The statements never complete normally (each path ends in `return` or `raise`), read conservatively."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _ends(last.body) and _ends(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _ends(last.body)
    if isinstance(last, ast.Try):
        return _ends(last.finalbody) or ((_ends(last.body) or _ends(last.orelse))
                                         and all(_ends(h.body) for h in last.handlers))
    return False


def of_def(node: ast.AST) -> Optional[str]:
    """`tuple[N]`, or None when the source does not say (see the module docstring)."""
    if not isinstance(node, ast.FunctionDef):
        return None
    lengths: set[int] = set()
    for n in own_nodes(node):
        if isinstance(n, (ast.Yield, ast.YieldFrom)):
            return None
        if isinstance(n, ast.Return):
            v = n.value
            if not isinstance(v, ast.Tuple) or any(isinstance(e, ast.Starred) for e in v.elts):
                return None
            lengths.add(len(v.elts))
    if len(lengths) != 1 or not _ends(node.body):
        return None
    return f"tuple[{lengths.pop()}]"


def arity(shape: Optional[str]) -> Optional[int]:
    """N of `tuple[N]`; None for no shape."""
    m = _SHAPE.match(shape or "")
    return int(m.group(1)) if m else None


__all__ = ["arity", "of_def", "own_nodes"]

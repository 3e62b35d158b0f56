"""How a patch's implementation uses what an upstream call returns, read from its source with `ast`.

Why: a change of an upstream function's return shape (`return_shape.py`) breaks a patch only where its code
depends on that shape: `blocks, hit, boundary = wrapped(*args, **kwargs)` binds exactly three names, `result[-1]`
reads whatever is last; `return wrapped(*args, **kwargs)` hands the result on as it is, whatever its shape.
`compat.py` judges a `return_shape_changed` with what is read here.

A use is read off the call itself or off a name the call's result is assigned to in the same function
(`result = wrapped(...)`, then `state, count = result`): unpacked (`a, b = ...`, `a, *rest = ...`), indexed
(`...[0]`), spread (`f(*...)`, `(*..., x)`), returned, or used whole (passed on, an attribute read, compared).
Only a function's own body is read (a nested def, lambda or class is another scope); a result handed to a
helper is used whole here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from vllm_patchkit.upstream.return_shape import own_nodes

UNPACKED, INDEXED, SPREAD, RETURNED, WHOLE = "unpacked", "indexed", "spread", "returned", "whole"


@dataclass(frozen=True)
class Use:
    """One use of a call's result at `line`. `names`: unpacked, the names bound (a starred one counted);
    `star`: the position of the starred name, if any; `index`: indexed, the constant index (None: a slice or a
    computed index)."""

    how: str
    line: int
    names: int = 0
    star: Optional[int] = None
    index: Optional[int] = None

    def breaks(self, new: Optional[int]) -> bool:
        """Whether this use still works on a result of `new` elements (None: the new shape is not read)."""
        if self.how in (RETURNED, WHOLE):
            return False
        if new is None or self.how == SPREAD:
            return True
        if self.how == UNPACKED:
            if self.star is None:
                return self.names != new
            return self.star != self.names - 1 or new < self.names - 1  # a name after the star shifts
        return self.index is None or self.index < 0 or self.index >= new

    def words(self) -> str:
        if self.how == UNPACKED:
            return (f"unpacks it into {self.names} names" if self.star is None
                    else f"unpacks it into {self.names - 1} names and a starred one")
        if self.how == INDEXED:
            return f"reads element {self.index} of it" if self.index is not None else "slices it or indexes it by a value"
        return {SPREAD: "spreads it (*...)", RETURNED: "returns it as it is"}.get(self.how, "uses it whole")


def _parents(fn: ast.AST) -> dict[int, ast.AST]:
    out: dict[int, ast.AST] = {}
    for node in own_nodes(fn):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


def _use_of(node: ast.AST, parent: Optional[ast.AST]) -> Optional[Use]:
    """How `node` (the call, or a name holding its result) is used by its parent; None: assigned to a name."""
    line = getattr(node, "lineno", 0)
    if isinstance(parent, ast.Assign) and parent.value is node:
        seq = next((t for t in parent.targets if isinstance(t, (ast.Tuple, ast.List))), None)
        if seq is not None:
            star = next((i for i, e in enumerate(seq.elts) if isinstance(e, ast.Starred)), None)
            return Use(UNPACKED, parent.lineno, names=len(seq.elts), star=star)
        if all(isinstance(t, ast.Name) for t in parent.targets):
            return None
    if isinstance(parent, ast.AnnAssign) and parent.value is node and isinstance(parent.target, ast.Name):
        return None
    if isinstance(parent, ast.Subscript) and parent.value is node:
        s = parent.slice
        if isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub) and isinstance(s.operand, ast.Constant):
            index = -s.operand.value if isinstance(s.operand.value, int) else None
        else:
            index = s.value if isinstance(s, ast.Constant) and isinstance(s.value, int) else None
        return Use(INDEXED, line, index=index)
    if isinstance(parent, ast.Starred):
        return Use(SPREAD, line)
    if isinstance(parent, ast.Return):
        return Use(RETURNED, line)
    return Use(WHOLE, line)


def uses_in(fn: ast.AST, is_call: Callable[[ast.Call], bool]) -> list[Use]:
    """Every use, in `fn`'s own body, of the result of a call `is_call` accepts."""
    parents = _parents(fn)
    out: list[Use] = []
    holders: dict[str, int] = {}  # a name a result is assigned to -> the line it is assigned at
    for node in own_nodes(fn):
        if isinstance(node, ast.Call) and is_call(node):
            parent = parents.get(id(node))
            use = _use_of(node, parent)
            if use is not None:
                out.append(use)
            else:
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                holders.update((t.id, node.lineno) for t in targets)
    for node in own_nodes(fn):
        if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in holders
                and node.lineno >= holders[node.id]):
            use = _use_of(node, parents.get(id(node)))
            if use is not None:
                out.append(use)
    return sorted(out, key=lambda u: u.line)


def functions(tree: ast.AST) -> Iterator[ast.AST]:
    """Every def of a module, at any depth (each read on its own body)."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


# -- which calls ------------------------------------------------------------------------------------------------
def calls_of_name(name: str) -> Callable[[ast.Call], bool]:
    """A call of the function a parameter holds (`wrapped(...)`, a wrap's first parameter)."""
    return lambda c: isinstance(c.func, ast.Name) and c.func.id == name


def calls_of_super(method: str) -> Callable[[ast.Call], bool]:
    """`super().method(...)` / `super(Cls, self).method(...)` (an override reaching the base's method)."""
    return lambda c: (isinstance(c.func, ast.Attribute) and c.func.attr == method
                      and isinstance(c.func.value, ast.Call) and isinstance(c.func.value.func, ast.Name)
                      and c.func.value.func.id == "super")


def _is_use_of(node: ast.AST, name: str) -> bool:
    """`ctx.use("name")` (the object of a `uses:` entry, by its last name)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "use"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == name)


def calls_of_used(fn: ast.AST, name: str) -> Callable[[ast.Call], bool]:
    """A call of a `uses:` entry named `name` in `fn`: `ctx.use("name")(...)`, a call of a name `fn` binds to
    `ctx.use("name")`, or a call of `name` itself (`name(...)`, `x.name(...)`: imported or reached on an object)."""
    bound = {t.id for n in own_nodes(fn) if isinstance(n, ast.Assign) and _is_use_of(n.value, name)
             for t in n.targets if isinstance(t, ast.Name)}

    def is_call(c: ast.Call) -> bool:
        f = c.func
        return (_is_use_of(f, name) or (isinstance(f, ast.Name) and (f.id in bound or f.id == name))
                or (isinstance(f, ast.Attribute) and f.attr == name))
    return is_call


__all__ = ["Use", "calls_of_name", "calls_of_super", "calls_of_used", "functions", "uses_in"]

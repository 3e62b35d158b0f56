"""A fingerprint from parsed source: the one normalisation the live and the static reader both end in.

Why apart from the live reader (`fingerprint`): `check` and `pin` read a release that is not installed
(`tools/static.py`), the loader reads the imported objects (`fingerprint.live`); both must render a def the
same way so that their fingerprints of one release compare equal. So signatures are rendered from the
function's *source* with `ast`: annotations are left out (they are strings in one case and objects in the
other); parameter names, kinds, order and defaults are kept, which is what call conventions depend on. The
source digest is blind to comments, docstrings, decorators and formatting; a literal is digested from its
value, whether the value was evaluated from the source or read from the live object (`value_digest`).
"""

from __future__ import annotations

import ast
import hashlib
from typing import Any, Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream import return_shape


def _default(node: ast.expr) -> str:
    try:
        return repr(ast.literal_eval(node))
    except Exception:
        return ast.unparse(node)


def render_arguments(args: ast.arguments) -> str:
    """`(a, b=None, /, c, *rest, d=1, **kw)` with no annotations."""
    out: list[str] = []
    positional = list(args.posonlyargs) + list(args.args)
    defaults: list[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        out.append(a.arg if d is None else f"{a.arg}={_default(d)}")
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            out.append("/")
    if args.vararg is not None:
        out.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        out.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(a.arg if d is None else f"{a.arg}={_default(d)}")
    if args.kwarg is not None:
        out.append(f"**{args.kwarg.arg}")
    return "(" + ", ".join(out) + ")"


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


def source_digest(node: ast.AST) -> str:
    """Digest of a def's code, blind to comments, docstrings, decorators and formatting."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        node = type(node)(**{**node.__dict__, "body": _strip_docstring(node.body), "decorator_list": []})
    return "sha256:" + hashlib.sha256(ast.dump(node, annotate_fields=False).encode()).hexdigest()[:16]


def from_def(node: ast.AST, kind: str, with_digest: bool = False) -> Fingerprint:
    """Fingerprint of a parsed def (the static path and the live path both end here): its signature, its return
    shape when the source says it (`return_shape.of_def`), and the source digest when asked."""
    sig = render_arguments(node.args) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    return Fingerprint(kind=kind, signature=sig, return_shape=return_shape.of_def(node),
                       source_digest=source_digest(node) if with_digest else None)

_SCALARS = {type(None): "N", bool: "b", int: "i", float: "f", str: "s", bytes: "y"}
_MAX_ITEMS = 10_000


def _canonical(value: Any, budget: list[int]) -> Optional[str]:
    """A type-tagged, order-independent text of a simple literal; None for anything else."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    t = type(value)  # exact types: a subclass (an enum member, a str subclass) is not a simple literal
    tag = _SCALARS.get(t)
    if tag is not None:
        if t is float:
            return f"f:{value.hex()}"
        if t is bytes:
            return f"y:{len(value)}:{value.hex()}"
        if t is str:
            return f"s:{len(value)}:{value}"
        return f"{tag}:{value!r}"
    if t in (tuple, frozenset, dict):
        items = value.items() if t is dict else value
        parts = []
        for item in items:
            if t is dict:
                k, v = _canonical(item[0], budget), _canonical(item[1], budget)
                part = None if k is None or v is None else f"{k}={v}"
            else:
                part = _canonical(item, budget)
            if part is None:
                return None
            parts.append(part)
        if t is not tuple:
            parts.sort()
        return {tuple: "t", frozenset: "F", dict: "d"}[t] + f"{len(parts)}(" + ",".join(parts) + ")"
    return None


def value_digest(value: Any) -> Optional[str]:
    """Digest of a simple literal (int, float, str, bytes, bool, None, and tuples, frozensets and
    dicts of those); None for any other value (it is not pinned)."""
    text = _canonical(value, [_MAX_ITEMS])
    if text is None:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def literal_digest(node: Any) -> Optional[str]:
    """The value digest of an expression written as a literal (as `value_digest` of the value it evaluates to);
    None when the source does not spell a literal (a call, a name, an expression)."""
    if not isinstance(node, ast.expr):
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value_digest(value)


# -- an attribute of each object (`kind: set` + `instances: true`) ------------------------------------
# One rule, two readers: `static.StaticRelease.instance_attribute` (check, pin: the release's source) and
# `live_instance_attribute` (the loader: the imported class's source) both end in `instance_attribute`.
INSTANCE_ATTRIBUTE = "instance_attribute"


def instance_attribute(chain: Any, attr: str, owner: str) -> "Fingerprint | tuple[str, bool]":
    """The pin of `owner.attr` as an attribute of each object: kind `instance_attribute`, and the value digest of
    what `__init__` assigns when that is one simple literal (`self.x = None`, `self.x: int = 0`).

    `chain`: the class and its bases in the release, in MRO order, as (where `module:Qualname`, its `ast.ClassDef`
    or None when its source cannot be read). The first class whose own methods assign `self.attr` decides. Returns
    (why not, unreadable) when no method assigns it."""
    from vllm_patchkit.upstream.static_tables import instance_assignments

    for where, node in chain:
        if node is None:
            return f"{owner}.{attr}: the source of {where} cannot be read, so what it assigns is unknown", True
        found = instance_assignments(node).get(attr)
        if not found:
            continue
        init = {literal_digest(v) for m, v in found if m == "__init__"}
        digest = init.pop() if len(init) == 1 else None
        return Fingerprint(kind=INSTANCE_ATTRIBUTE, value_digest=digest)
    module, qualname = Target.parse(owner)
    top = module.split(".")[0]
    return (f"no method of {owner} or of its bases in the {top} package assigns self.{attr} (read from their "
            f"source): {qualname} objects do not get that attribute from {top}'s code"), False

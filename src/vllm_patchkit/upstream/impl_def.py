"""One definition of a patch's implementation as its source has it, and what can be read off its `ast` node.

Why apart from the reader (`impl_static`): the reader finds and follows names to a def; what `check` and `pin`
judge is read off the def itself: its signature (an `inspect.Signature` whose defaults render as their source
text, so `convention.py` compares it exactly like a live one), whether it is callable at all, and which names
it calls through `super()`.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.source_fingerprint import _default, render_arguments

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Src:
    """A default value known only by its source text: `repr` gives the text (as a pinned signature shows it)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class ImplDef:
    """One definition of the implementation, as its source has it."""

    spec: str  # module:Qualname where it is defined
    file: str
    kind: str  # function | method | staticmethod | classmethod | property | class | value
    node: ast.AST = field(repr=False, compare=False)
    bases: tuple[str, ...] = ()  # a class: its bases as written (dotted names)

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)

    @property
    def signature(self) -> Optional[inspect.Signature]:
        """The callable's signature (a class: None); defaults render as source text."""
        if isinstance(self.node, FUNC):
            return signature_of(self.node.args)
        return None

    @property
    def callable(self) -> Optional[bool]:
        """True for a def or class, False for a literal value, None when the source does not tell."""
        if isinstance(self.node, (*FUNC, ast.ClassDef, ast.Lambda)):
            return True
        if isinstance(self.node, ast.expr):
            try:
                ast.literal_eval(self.node)
                return False
            except Exception:
                return None
        return None

    def super_calls(self) -> frozenset[str]:
        """Names this function calls through `super().name(...)` or `super(Cls, self).name(...)`."""
        return super_calls(self.node) if isinstance(self.node, FUNC) else frozenset()

    def calls_super(self, name: Optional[str] = None) -> bool:
        return (name or Target.parse(self.spec).attr) in self.super_calls()


def signature_of(args: ast.arguments) -> inspect.Signature:
    P = inspect.Parameter
    params: list[inspect.Parameter] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(a.arg, kind, default=P.empty if d is None else _Src(_default(d))))
    if args.vararg is not None:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else _Src(_default(d))))
    if args.kwarg is not None:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def super_calls(func: ast.AST) -> frozenset[str]:
    """`super().name(...)` / `super(Cls, self).name(...)` in the function's own body (not nested defs)."""
    out: set[str] = set()
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (*FUNC, ast.ClassDef, ast.Lambda)):
            continue  # another scope: its super() is another method's
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id == "super"):
            out.add(node.func.attr)
        stack.extend(ast.iter_child_nodes(node))
    return frozenset(out)


def signature_text(d: ImplDef) -> Optional[str]:
    return render_arguments(d.node.args) if isinstance(d.node, FUNC) else None

"""The signature a call of a vLLM callable meets on a release, and whether a call's shape binds to it.

A function or method: its pinned-style signature (`StaticRelease.lookup`, through the bases when inherited). A
class: its `__init__` (the class's or a base's in the release), else, for a dataclass, a NamedTuple, a pydantic
model or a msgspec Struct, the constructor its fields make: fields in base-first order, a field with a value
defaulted, `ClassVar`s and `field(init=False)` left out, a field annotated under an `if` read from the branch that runs, keyword-only when the decorator or the base says
`kw_only=True` (a pydantic model: always), a TypedDict's key optional as Python makes it (`NotRequired[...]`, a
`total=False` class's own keys unless `Required[...]`; an inherited key as its base declared it). The call is bound with `inspect.Signature.bind` on that signature
(`sigdiff.parse_signature` reads it), so the verdict is Python's own.
"""

from __future__ import annotations

import ast
import inspect
from typing import Optional

from vllm_patchkit.tools.reach_plugin.walk import CallShape
from vllm_patchkit.tools.reach_types import _fielded
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.sigdiff import parse_signature
from vllm_patchkit.upstream.static_tables import dotted

_KIND = {"positional-only": inspect.Parameter.POSITIONAL_ONLY,
         "positional-or-keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "var-positional": inspect.Parameter.VAR_POSITIONAL, "keyword-only": inspect.Parameter.KEYWORD_ONLY,
         "var-keyword": inspect.Parameter.VAR_KEYWORD}


def _fingerprint(release: StaticRelease, spec: str):
    fp = release.lookup(spec)
    if isinstance(fp, Missing) and fp.inherited_from:
        fp = release.lookup(fp.inherited_from)
    return None if isinstance(fp, Missing) or not fp.signature else fp


def callable_signature(release: StaticRelease, spec: str, how: str) -> Optional[tuple[str, bool]]:
    """(the signature text a call meets, whether its first parameter is bound by the call's form), or None when
    the release gives none (a class whose constructor is outside vLLM, a name bound at run time)."""
    if how == "class":
        d = release.resolve(spec)
        if isinstance(d, Missing) or not isinstance(d.node, ast.ClassDef):
            return None
        chain = release._mro(d.module, d.qualname, d.node)
        for where, node in chain:
            if any(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == "__init__" for b in node.body):
                fp = _fingerprint(release, f"{where}.__init__")
                return (fp.signature, True) if fp else None
        if any(_fielded(n) for _, n in chain) and not _outside(release, chain):
            return fields_signature(chain), False
        return None
    fp = _fingerprint(release, spec)
    if fp is None:
        return None
    bound = (how == "bound" and fp.kind in ("method", "classmethod")) or (how == "via_class" and fp.kind == "classmethod")
    return fp.signature, bound


def _outside(release: StaticRelease, chain) -> bool:
    """Does the chain end in a base the release does not define, other than the field-making ones?"""
    from vllm_patchkit.tools.reach_types import _outside_bases

    return _outside_bases(release, chain)


def fields_signature(chain) -> str:
    """The constructor a fielded class's fields make, as signature text `(a, b=..., *, c=...)`."""
    positional, keyword = [], []
    seen: set[str] = set()
    keyed = any(_typed_dict(n) for _, n in chain)
    for _, node in reversed(chain):
        kw_class = _kw_only(node)
        after_marker = False
        total = _total(node)
        for st in _body_run(node.body):
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            ann = (dotted(st.annotation.value if isinstance(st.annotation, ast.Subscript) else st.annotation) or "")
            if ann.rpartition(".")[2] == "ClassVar":
                continue
            if ann.rpartition(".")[2] == "KW_ONLY":
                after_marker = True
                continue
            name, value = st.target.id, st.value
            if isinstance(value, ast.Call) and (dotted(value.func) or "").rpartition(".")[2] in ("field", "Field"):
                kws = {k.arg: k.value for k in value.keywords}
                if isinstance(kws.get("init"), ast.Constant) and kws["init"].value is False:
                    continue
                defaulted = bool({"default", "default_factory"} & set(kws)) or bool(value.args)
                kw = kw_class or after_marker or (isinstance(kws.get("kw_only"), ast.Constant) and kws["kw_only"].value)
            elif keyed:  # a TypedDict's key: no value, required or not by its class's totality and qualifier
                qualifier = _qualifier(st.annotation)
                defaulted, kw = qualifier == "NotRequired" or (qualifier is None and not total), kw_class
            else:
                defaulted, kw = value is not None, kw_class or after_marker
            text = f"{name}=..." if defaulted else name
            positional[:] = [p for p in positional if p.partition("=")[0] != name]
            keyword[:] = [p for p in keyword if p.partition("=")[0] != name]
            (keyword if kw else positional).append(text)
            seen.add(name)
    # Python refuses a required positional field after a defaulted one; a call binds as if it were keyword-only
    required_after = [i for i, p in enumerate(positional) if "=" not in p and any("=" in q for q in positional[:i])]
    for i in reversed(required_after):
        keyword.insert(0, positional.pop(i))
    return "(" + ", ".join(positional + (["*"] + keyword if keyword else [])) + ")"


def _body_run(body: list) -> list:
    """A class body's statements as the class statement runs them: an `if TYPE_CHECKING:` block's `else` (vLLM
    0.34.0's `EngineCoreRequest` annotates `prompt_token_ids` in both branches of one), another `if`'s first branch
    (`static_tables.py`'s rule: what a normal deployment runs)."""
    out = []
    for st in body:
        if isinstance(st, ast.If):
            test = dotted(st.test) or ""
            out += _body_run(st.orelse if test.rpartition(".")[2] == "TYPE_CHECKING" else st.body)
        else:
            out.append(st)
    return out


def _typed_dict(node: ast.ClassDef) -> bool:
    return "TypedDict" in {(dotted(b) or "").rpartition(".")[2] for b in node.bases}


def _total(node: ast.ClassDef) -> bool:
    """A TypedDict class's `total=` (its own keys only: a base's keep the totality the base declared)."""
    for k in node.keywords:
        if k.arg == "total" and isinstance(k.value, ast.Constant):
            return bool(k.value.value)
    return True


def _qualifier(ann: Optional[ast.expr], depth: int = 0) -> Optional[str]:
    """`Required` / `NotRequired` when a TypedDict key's annotation says so: outermost, or inside `Annotated[...]`
    / `ReadOnly[...]`, or in a quoted annotation."""
    if depth > 4 or ann is None:
        return None
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            return _qualifier(ast.parse(ann.value, mode="eval").body, depth + 1)
        except SyntaxError:
            return None
    if not isinstance(ann, ast.Subscript):
        return None
    head = (dotted(ann.value) or "").rpartition(".")[2]
    if head in ("Required", "NotRequired"):
        return head
    if head in ("Annotated", "ReadOnly"):
        inner = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) and ann.slice.elts else ann.slice
        return _qualifier(inner, depth + 1)
    return None


def _kw_only(node: ast.ClassDef) -> bool:
    bases = {(dotted(b.value if isinstance(b, ast.Subscript) else b) or "").rpartition(".")[2] for b in node.bases}
    if "BaseModel" in bases:
        return True
    for d in [*node.decorator_list, *node.keywords]:
        kws = d.keywords if isinstance(d, ast.Call) else [d] if isinstance(d, ast.keyword) else []
        if any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value for k in kws):
            return True
    return False


def to_signature(text: str) -> Optional[inspect.Signature]:
    params = parse_signature(text)
    if params is None:
        return None
    return inspect.Signature([inspect.Parameter(p.name, _KIND[p.kind], default=None if p.default is not None
                              else inspect.Parameter.empty) for p in params])


def misfit(text: str, bound: bool, shape: CallShape) -> Optional[str]:
    """Why a call of this shape raises TypeError against the signature (None: it binds, or cannot be judged)."""
    sig = to_signature(text)
    if sig is None:
        return None
    params = list(sig.parameters.values())
    if bound and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    sig = sig.replace(parameters=params)
    if not (shape.star or shape.starstar):
        try:
            sig.bind(*range(shape.positional), **{k: None for k in shape.keywords})
        except TypeError as exc:
            return str(exc)
        return None
    takes_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [k for k in shape.keywords if k not in names and not takes_kw]
    if unknown:
        return f"got an unexpected keyword argument {unknown[0]!r}"
    if not shape.star and not any(p.kind == p.VAR_POSITIONAL for p in params):
        room = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        if shape.positional > room:
            return f"takes {room} positional arguments but {shape.positional} were given"
    return None


__all__ = ["callable_signature", "fields_signature", "misfit"]

"""What `pin` and `check` refuse before judging a patch against any release: a draft nobody reviewed (the
marker), a `TODO…` placeholder in a field the patch works with (declaration/review.py), and an implementation
that only raises (a drafted stub, `raise NotImplementedError`), read from its source, never imported
(upstream/impl_static.py). Each would otherwise pin and check `ok` while the plugin's fix is not in the patch."""

from __future__ import annotations

import ast
from typing import Optional

from vllm_patchkit.declaration.errors import DeclarationError
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.review import drafts, placeholders
from vllm_patchkit.upstream import impl_static
from vllm_patchkit.upstream.findings import Breakage, BreakageKind

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


def only_raises(node: ast.AST) -> bool:
    """A function whose body (its docstring aside) is one `raise`: a stub, not an implementation."""
    if not isinstance(node, FUNC):
        return False
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _stub(spec: str, members: tuple = ()) -> Optional[str]:
    """`spec` (or, a class, each of `members` it defines) when its body only raises; None otherwise or unreadable
    (an unreadable implementation is check's `implementation_unimportable`, not this)."""
    try:
        d = impl_static.read(spec)
        if d.kind == "class":
            for m in members:
                own = impl_static.own_member(d, m)
                if own is not None and only_raises(own.node):
                    return own.spec
            return None
        return spec if only_raises(d.node) else None
    except (impl_static.ImplUnreadable, Exception):
        return None


def stubs(patch_set: PatchSet) -> list[DeclarationError]:
    out = []
    for key, p in sorted(patch_set.patches.items()):
        if not p.implementation or p.implementation.upper().startswith("TODO"):
            continue
        where = _stub(p.implementation, tuple(p.overrides))
        if where:
            out.append(DeclarationError(patch_set.files.get(key, key), "implementation",
                                        f"{where} only raises (a stub): write the implementation of {p.key}"))
    return out


def problems(patch_set: PatchSet) -> list[DeclarationError]:
    """Every refusal, by file then field."""
    return drafts(patch_set) + placeholders(patch_set) + stubs(patch_set)


def breakages(patch_set: PatchSet, problems_found: list[DeclarationError], key: str) -> list[Breakage]:
    """check's findings for one patch (id@version) from `problems_found`: breaking, naming the file and field."""
    p = patch_set.patches[key]
    file = patch_set.files.get(key, key)
    return [Breakage(BreakageKind.unreviewed, key, p.target or p.id, parameter=e.field,
                     detail=f"{e.file}: {e.field}: {e.problem}") for e in problems_found if e.file == file]


def render(errors: list[DeclarationError]) -> str:
    return "\n".join(f"  - {e}" for e in errors)


__all__ = ["breakages", "only_raises", "problems", "render", "stubs"]

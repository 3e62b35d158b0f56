"""Signature diff: what changed between a pinned and a found fingerprint, parameter by parameter."""

from __future__ import annotations

import ast
from typing import NamedTuple, Optional, Union

from vllm_patchkit.upstream import source_fingerprint as fp

from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.missing import Missing


# -- parameter-level comparison -----------------------------------------------------------------
class Param(NamedTuple):  # a NamedTuple: built when a convention is first judged at start-up, ~4x cheaper to define
    name: str
    kind: str  # positional-only | positional-or-keyword | var-positional | keyword-only | var-keyword
    default: Optional[str]
    position: Optional[int]  # index among positional parameters

    @property
    def positional(self) -> bool:
        return self.position is not None

    def describe(self) -> str:
        where = f", position {self.position}" if self.positional else ""
        default = f", default {self.default}" if self.default is not None else ""
        return f"{self.kind}{where}{default}"


def parse_signature(sig: str) -> Optional[list[Param]]:
    """Parameters of a rendered signature `(a, b=1, *, c)`; None when it is not Python syntax."""
    try:
        tree = ast.parse(f"def _f{sig}: pass")
    except SyntaxError:
        return None
    a = tree.body[0].args
    out: list[Param] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = "positional-only" if i < len(a.posonlyargs) else "positional-or-keyword"
        out.append(Param(arg.arg, kind, None if d is None else fp._default(d), i))
    if a.vararg is not None:
        out.append(Param(a.vararg.arg, "var-positional", None, None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(arg.arg, "keyword-only", None if d is None else fp._default(d), None))
    if a.kwarg is not None:
        out.append(Param(a.kwarg.arg, "var-keyword", None, None))
    return out


def diff_signatures(patch: str, target: str, old_sig: str, new_sig: str) -> list[Breakage]:
    """Parameter-level differences between two rendered signatures, most important first."""
    if old_sig == new_sig:
        return []
    old, new = parse_signature(old_sig), parse_signature(new_sig)
    generic = [Breakage(BreakageKind.signature_changed, patch, target, old=old_sig, new=new_sig)]
    if old is None or new is None:
        return generic
    B = lambda kind, **kw: Breakage(kind, patch, target, **kw)  # noqa: E731
    old_by, new_by = {p.name: p for p in old}, {p.name: p for p in new}
    out: list[Breakage] = []
    renamed: dict[str, str] = {}
    for p in old:
        if p.name in new_by:
            continue
        same_slot = [q for q in new if q.name not in old_by and q.kind == p.kind and q.position == p.position
                     and (p.positional or q.kind in ("var-positional", "var-keyword"))]
        if same_slot:
            q = same_slot[0]
            renamed[p.name] = q.name
            out.append(B(BreakageKind.parameter_renamed, parameter=p.name, old=p.name, new=q.name,
                         detail=q.kind + (f", position {q.position}" if q.positional else "")))
        else:
            out.append(B(BreakageKind.parameter_removed, parameter=p.name, old=p.describe()))
    # positions of the positional parameters, keyed by their old name (a renamed one keeps its old name here)
    back = {v: k for k, v in renamed.items()}
    old_pos = {p.name: p.position for p in old if p.positional}
    new_pos = {back.get(q.name, q.name): q.position for q in new if q.positional}
    # reordered: out of their old relative order among the positional parameters both sides have, and at
    # another position (a parameter that only shifted because of an insertion or removal is not "moved")
    common_old = [n for n in old_pos if n in new_pos]
    common_new = sorted(common_old, key=new_pos.__getitem__)
    moved = {n for i, n in enumerate(common_old) if common_new[i] != n and old_pos[n] != new_pos[n]}
    # inserted: new positional slots (adjacent ones are one insertion) in front of existing parameters,
    # which a positional caller now binds one slot off: one finding per insertion, not one per shifted parameter
    runs: list[list[Param]] = []
    for q in new:
        if q.positional and back.get(q.name, q.name) not in old_pos:
            if runs and runs[-1][-1].position == q.position - 1:
                runs[-1].append(q)
            else:
                runs.append([q])
    shift_at: dict[str, Breakage] = {}
    in_shift: set[str] = set()
    for run in runs:
        shifted = [q.name for q in new if q.positional and q.position > run[-1].position
                   and (n := back.get(q.name, q.name)) in old_pos and n not in moved and new_pos[n] != old_pos[n]]
        if shifted:
            where = (f"position {run[0].position}" if len(run) == 1
                     else f"positions {run[0].position}-{run[-1].position}")
            shift_at[run[0].name] = B(BreakageKind.positional_shift, parameter=run[0].name,
                                      old=tuple(shifted), new=tuple(q.name for q in run), detail=where)
            in_shift.update(q.name for q in run)
    for q in new:
        if q.name in shift_at:
            out.append(shift_at[q.name])
        if q.name in old_by or q.name in renamed.values():
            continue
        variadic = q.kind in ("var-positional", "var-keyword")
        if q.default is None and not variadic:
            out.append(B(BreakageKind.required_parameter_added, parameter=q.name, new=q.describe()))
        elif q.name not in in_shift:  # an optional parameter inserted in front: the shift is the finding
            out.append(B(BreakageKind.optional_parameter_added, parameter=q.name, new=q.describe()))
    for p in old:
        q = new_by.get(renamed.get(p.name, p.name))
        if q is None:
            continue
        if p.kind != q.kind:
            out.append(B(BreakageKind.parameter_kind_changed, parameter=q.name, old=p.kind, new=q.kind))
        elif p.name in moved:
            out.append(B(BreakageKind.parameter_moved, parameter=q.name, old=p.position, new=q.position))
        if p.default != q.default:
            if q.default is None:
                out.append(B(BreakageKind.parameter_now_required, parameter=q.name, old=p.default))
            elif p.default is None:
                out.append(B(BreakageKind.parameter_now_optional, parameter=q.name, new=q.default))
            else:
                out.append(B(BreakageKind.default_changed, parameter=q.name, old=p.default, new=q.default))
    return out or generic


def compare(patch: str, target: str, pin: Fingerprint, found: Union[Fingerprint, Missing], *,
            copy: bool = False) -> list[Breakage]:
    """Every difference between a pin and what the release has at `target`."""
    if isinstance(found, Missing):
        if pin.kind == "absent":
            return []
        return missing_breakages(patch, target, found, copy=copy)
    if pin.kind != found.kind:
        return [Breakage(BreakageKind.kind_changed, patch, target, old=pin.kind, new=found.kind)]
    out: list[Breakage] = []
    if pin.signature != found.signature:
        if pin.signature is None or found.signature is None:
            out.append(Breakage(BreakageKind.signature_changed, patch, target, old=pin.signature, new=found.signature))
        else:
            out.extend(diff_signatures(patch, target, pin.signature, found.signature))
    if pin.source_digest is not None and pin.source_digest != found.source_digest:
        out.append(Breakage(BreakageKind.source_changed, patch, target, old=pin.source_digest, new=found.source_digest))
    if pin.return_shape is not None and pin.return_shape != found.return_shape:  # pinned only where it was read
        out.append(Breakage(BreakageKind.return_shape_changed, patch, target, old=pin.return_shape,
                            new=found.return_shape))
    if pin.value_digest is not None and pin.value_digest != found.value_digest:
        out.append(Breakage(BreakageKind.value_changed, patch, target, old=pin.value_digest, new=found.value_digest))
    if list(pin.wrappers) != list(found.wrappers):
        out.append(Breakage(BreakageKind.wrappers_changed, patch, target, old=list(pin.wrappers), new=list(found.wrappers)))
    return out


def new_home(missing: Missing) -> Optional[str]:
    """Where a missing target now is, when that is one place: the base it is inherited from, or its one new home."""
    if missing.unreadable:
        return None
    if missing.inherited_from:
        return missing.inherited_from
    return missing.moved_to[0] if len(missing.moved_to) == 1 else None


def missing_breakages(patch: str, target: str, missing: Missing, *, copy: bool = False,
                      pinned: bool = True) -> list[Breakage]:
    """`pinned`: the place was pinned on an older release (so "now inherited" is a change); False when this
    release is the first one read (`pin`), where the place was never defined on the class."""
    if copy:
        return [Breakage(BreakageKind.copy_gone, patch, target, detail=missing.reason)]
    if missing.unreadable:
        return [Breakage(BreakageKind.target_unreadable, patch, target, detail=missing.reason)]
    if missing.inherited_from:
        return [Breakage(BreakageKind.target_inherited, patch, target, new=missing.inherited_from,
                         old="defined" if pinned else None, detail=missing.reason)]
    if missing.moved_to:
        return [Breakage(BreakageKind.target_moved, patch, target, new=", ".join(missing.moved_to), detail=missing.reason)]
    return [Breakage(BreakageKind.target_removed, patch, target, detail=missing.reason)]

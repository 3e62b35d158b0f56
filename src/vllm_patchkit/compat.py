"""Compatibility judged per patch: does this upstream change break *this* patch?

A change is not breaking or compatible by itself; it depends on what the patch
does with the place that changed. A `wrap` forwards `args, kwargs` to the
original exactly as vLLM passed them, and its implementation reads only the
parameters it declares (`params:`), by name, through positions taken from the
live signature. So for a wrap:

- a verbatim passthrough (no implementation) survives any signature change:
  whatever vLLM passes reaches upstream untouched;
- an implementation survives a change that touches no declared parameter (an
  optional or required parameter added, a default changed, a parameter it never
  names removed or moved), and breaks on one that touches a declared parameter
  (removed, renamed, moved out of its kind, its default changed).

Breaking for every patch: a target that is gone, moved or now inherited, a
changed kind, changed decorator layers, a copy that no longer holds the
target, an implementation that no longer fits the call convention; any change
to an upstream callable the implementation calls itself (`uses:`), to the
source a `replace` copies, to a `set`'s value; any signature change under a
`replace` (it stands in the target's place) and under `refuse`/`env_default`
(they steer the target's behaviour: a person re-reads it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from .breakage import Breakage, BreakageKind as K
from .schema import Kind, Patch

#: differences inside a signature, which a forwarding wrap may survive
SIGNATURE = frozenset({
    K.optional_parameter_added, K.required_parameter_added, K.parameter_removed, K.parameter_renamed,
    K.parameter_moved, K.positional_shift, K.parameter_kind_changed, K.parameter_now_required,
    K.parameter_now_optional, K.default_changed,
})

_ALWAYS = {
    K.target_removed: "the place the patch is installed at is gone",
    K.target_moved: "the patch names the old place: a new patch version names the new one",
    K.target_inherited: "a patch at the old place would shadow the base class for one subclass",
    K.target_unreadable: "the place cannot be read, so nothing can be judged",
    K.kind_changed: "a different kind of object is at the place",
    K.signature_changed: "the signature cannot be compared parameter by parameter",
    K.source_changed: "the patch depends on the upstream source, which changed",
    K.wrappers_changed: "the decorator layers the patch stands on changed",
    K.copy_gone: "a declared copy is gone: the declaration is out of date",
    K.copy_differs: "a declared copy no longer holds the target",
    K.unpinned: "no pin to judge against",
    K.probe_error: "the retirement probe failed",
    K.required_not_applicable: "a required patch is marked not applicable",
    K.value_changed: "the value the patch relies on changed",
    K.convention_mismatch: "the implementation rejects a call vLLM can make",
}


def _touched(b: Breakage) -> set[str]:
    """Parameter names a signature difference concerns (a rename concerns both names)."""
    names = {b.parameter} if b.parameter else set()
    if b.kind is K.parameter_renamed:
        names |= {str(b.old), str(b.new)}
    return names


def judge(patch: Patch, b: Breakage) -> Breakage:
    """`b` with `breaking` and `compat` (the reason) set for this patch."""
    breaking, why = _rule(patch, b)
    return replace(b, breaking=breaking, compat=why)


def judge_all(patch: Patch, found: Iterable[Breakage]) -> list[Breakage]:
    return [judge(patch, b) for b in found]


def _rule(patch: Patch, b: Breakage) -> tuple[bool, str]:
    if b.kind not in SIGNATURE:
        return True, _ALWAYS.get(b.kind, "not a signature difference")
    if b.target in patch.uses:
        return True, "the implementation calls this upstream callable with arguments of its own"
    if patch.kind is Kind.replace:
        return True, "a replace stands in the target's place: it must take the new signature"
    if patch.kind is not Kind.wrap:
        return True, f"a {patch.kind.value} patch steers the target's behaviour: a person re-reads the change"
    if patch.implementation is None:
        return False, "verbatim passthrough: args and kwargs reach upstream untouched"
    declared = set(getattr(patch, "params", None) or ())
    hit = sorted(_touched(b) & declared)
    if hit:
        return True, f"the implementation reads {', '.join(map(repr, hit))} (declared in params)"
    if b.kind in (K.parameter_moved, K.positional_shift) and declared:
        return False, ("forwarded verbatim; the implementation finds its parameters "
                       f"({', '.join(sorted(declared))}) by name in the live signature")
    reads = f"reads only {', '.join(sorted(declared))}" if declared else "reads no parameter"
    return False, f"forwarded verbatim; the implementation {reads}"


def breaking(found: Iterable[Breakage]) -> list[Breakage]:
    return [b for b in found if b.breaking]


def compatible(found: Iterable[Breakage]) -> list[Breakage]:
    return [b for b in found if not b.breaking]

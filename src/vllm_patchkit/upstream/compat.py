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
source a `replace` copies, to a `set`'s value; a signature change under a
`replace` whose implementation cannot be read (it stands in the target's place:
see below for one that can), and under `refuse`/`env_default`
(they steer the target's behaviour: a person re-reads it).

A changed return shape (`return_shape_changed`: the pinned `tuple[N]` of a function whose every `return` is a
tuple literal) breaks a patch that depends on it — a `replace`, a wrap whose implementation unpacks or indexes
what the wrapped call returns, an implementation that unpacks the result of a `uses:` entry — and no verbatim
passthrough, nor a wrap that returns the result as it is: `compat_shape.py`.

An override (kind `subclass`) and a proxy (a `replace` whose implementation
forwards what it does not name through `*args`/`**kwargs`) are called by vLLM
in the target's place, so **their own signature decides**, read from their
source (`impl_static.py`, never imported):

- a parameter added upstream is compatible when the override accepts it — by
  name, or through `**kwargs`. A required one too: `**kwargs` is taken as
  forwarding it to `super()` (whether it really forwards cannot be known
  statically; the reason says so);
- any other difference is compatible when the override does not name the
  parameter it touches (it reaches upstream through `*args`/`**kwargs`
  untouched; a positional change needs `*args`), and breaking when it does;
- a base method that is now inherited from a base class: `super().name(...)`
  in the override still binds (to the base's definition, by the MRO), so the
  move is compatible; an override that does not call super() re-implements
  the method, so the move is breaking unless that body is pinned by its source
  (`reimplements`). Where the definition the MRO finds is exactly what was
  pinned (a method that was already inherited when it was pinned: `pin` pins
  such a method at the class that defines it), there is no change, and no
  finding (`judge_all` drops it).
"""

from __future__ import annotations

import inspect
from typing import Iterable, Optional, Union

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.findings import Breakage, BreakageKind as K
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch

#: differences inside a signature, which a forwarding wrap may survive
SIGNATURE = frozenset({
    K.optional_parameter_added, K.required_parameter_added, K.parameter_removed, K.parameter_renamed,
    K.parameter_moved, K.positional_shift, K.parameter_kind_changed, K.parameter_now_required,
    K.parameter_now_optional, K.default_changed,
})

#: differences the loader judges rather than compares exactly (`pinned.compare`): one the patch survives is applied
#: at start-up, so against the release's own manifest it is compatible, never a stale pin
JUDGED_AT_START_UP = frozenset({K.return_shape_changed})

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
    K.copy_undeclared: "vLLM calls through a copy the patch does not reach: declare it in `copies`",
    K.name_collision: "the name the patch adds is now vLLM's own: rename it (a new patch version)",
    K.entry_collision: "the key the patch registers is now vLLM's own: a new patch version decides which wins",
    K.entry_gone: "the entry the patch replaces is gone: a person re-reads how vLLM uses the registry",
    K.entry_unreadable: "whether vLLM registers the key cannot be read, so nothing can be judged",
    K.misdeclared: "the loader refuses this declaration at start-up",
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
    return b._replace(breaking=breaking, compat=why)


def judge_all(patch: Patch, found: Iterable[Breakage]) -> list[Breakage]:
    found = list(found)
    homes = {b.target for b in found}
    # an override's base method inherited where the MRO finds it exactly as pinned: no change to report
    kept = [b for b in found if not (b.kind is K.target_inherited and _override_name(patch, b) is not None
                                     and b.new not in homes)]
    return [judge(patch, b) for b in kept]


# -- what vLLM calls in the target's place: an override, a proxy ----------------------------------
def _override_name(patch: Patch, b: Breakage) -> Optional[str]:
    """The overridden method a breakage concerns (kind subclass): at `target.name`, or at the base's
    definition it is now inherited from / moved to (compared there by `check.examine`)."""
    if not traits(patch).judges_overrides or not patch.target or b.target in patch.uses:
        return None
    prefix = patch.target + "."
    if b.target.startswith(prefix):
        name = b.target[len(prefix):]
        return name if name in patch.overrides else None
    if b.target == patch.target or b.target in patch.pinned_specs:
        return None
    name = Target.parse(b.target).attr
    return name if name in patch.overrides else None


def _stand_in(implementation: str, name: Optional[str]):
    """(label, ImplDef) of what vLLM calls: the override `name` of the class, or the replace function;
    a str: why it cannot be read."""
    from vllm_patchkit.upstream import impl_static

    try:
        d = impl_static.override(implementation, name) if name else impl_static.read(implementation)
    except impl_static.ImplUnreadable as exc:
        return str(exc)
    if d is None:
        return f"{implementation} does not define {name!r}"
    return d


def _stand_in_for(patch: Patch, b: Breakage) -> Union[None, str, tuple[str, object]]:
    """None: not an override or proxy; a str: it cannot be read (why); else (how to name it, ImplDef)."""
    if patch.implementation is None:
        return None
    if traits(patch).judges_overrides:
        name = _override_name(patch, b)
        if name is None:
            return None
    elif traits(patch).stands_in and b.target == patch.target:
        name = None
    else:
        return None
    d = _stand_in(patch.implementation, name)
    if isinstance(d, str):
        return d
    sig = d.signature
    if sig is None:
        return f"{d.spec} has no signature to read ({d.kind})"
    return f"{'the override' if name else 'the implementation'} {d.spec}{_text(sig)}", d


def _text(sig: inspect.Signature) -> str:
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=inspect.Signature.empty))


def _override_rule(patch: Patch, b: Breakage, who: str, d) -> tuple[bool, str]:
    P = inspect.Parameter
    params = list(d.signature.parameters.values())
    named = {p.name: p for p in params if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)}
    varkw = next((p.name for p in params if p.kind == P.VAR_KEYWORD), None)
    varpos = next((p.name for p in params if p.kind == P.VAR_POSITIONAL), None)
    method = _override_name(patch, b) or b.target.rpartition(".")[2]
    if b.kind is K.target_inherited:
        if d.calls_super(method):
            return False, (f"{who} calls super().{method}(...), which still binds: Python's MRO finds {b.new}; "
                           f"vLLM calls the override on the subclass as before")
        if b.target in (patch.reimplements or ()) or b.new in (patch.reimplements or ()):
            return False, (f"{who} re-implements {method} without super(); its body is pinned by its source "
                           "(reimplements), so a change to it is judged as source_changed")
        return True, (f"{who} does not call super().{method}(...): it re-implements the method, whose definition "
                      f"moved to {b.new} and changed there; declare it in `reimplements` to pin the body")
    if b.kind in (K.optional_parameter_added, K.required_parameter_added):
        p = b.parameter
        if p in named and named[p].kind != P.POSITIONAL_ONLY:
            return False, f"{who} takes {p!r} by name: vLLM's call passing it reaches the override"
        if varkw is not None:
            required = b.kind is K.required_parameter_added
            return False, (f"{who} takes **{varkw}: vLLM's keyword argument {p}=... reaches it and is forwarded "
                           f"to super() through **{varkw} (a **kwargs is taken as forwarding: that it does is not "
                           "verified statically)" + ("" if required else "; not forwarded, upstream's default applies"))
        what = "required" if b.kind is K.required_parameter_added else "optional"
        return True, (f"{who} does not accept {p!r} (no such parameter, no **kwargs): vLLM's call passing the "
                      f"new {what} parameter raises TypeError")
    touched = _touched(b)
    if b.kind is K.positional_shift:
        touched |= set(b.old or ()) | set(b.new or ())
    hit = sorted(touched & set(named) - {"self", "cls"})
    if hit:
        return True, (f"{who} names {', '.join(map(repr, hit))}, which this change touches: its signature was "
                      "written against the old one")
    if b.kind in (K.positional_shift, K.parameter_moved) and varpos is None:
        return True, f"{who} has no *args: vLLM's positional call binds differently after this change"
    return False, (f"{who} does not name {', '.join(map(repr, sorted(touched))) or 'it'}: vLLM's arguments reach "
                   f"upstream through its *args/**kwargs untouched")


def _rule(patch: Patch, b: Breakage) -> tuple[bool, str]:
    if b.kind is K.return_shape_changed:  # what the patch does with the result decides (compat_shape.py)
        from vllm_patchkit.upstream import compat_shape

        return compat_shape.judge(patch, b, _override_name(patch, b))
    if b.kind is K.target_inherited or (b.kind in SIGNATURE and b.target not in patch.uses):
        stand_in = _stand_in_for(patch, b)
        if isinstance(stand_in, tuple):
            return _override_rule(patch, b, *stand_in)
        if isinstance(stand_in, str) and traits(patch).judges_overrides:
            return True, f"the override cannot be read to judge the change ({stand_in})"
    if b.kind not in SIGNATURE:
        return True, _ALWAYS.get(b.kind, "not a signature difference")
    if b.target in patch.uses:
        if b.kind is K.optional_parameter_added:  # an insertion in front is reported as positional_shift instead
            return False, (f"the implementation calls this upstream callable; the new parameter {b.parameter!r} is "
                           "optional and shifts no positional argument, so its calls, which cannot pass it, bind "
                           "as before and get upstream's default")
        return True, "the implementation calls this upstream callable with arguments of its own"
    if traits(patch).stands_in:
        return True, "a replace stands in the target's place: it must take the new signature"
    if not traits(patch).wraps_original:
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

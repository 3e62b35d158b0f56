"""Where a `set` that is not a plain assignment is installed, and whether it may be: an attribute of each object
(`instances`), a class attribute one subclass inherits (`inherited_from`), a name the plugin adds (`adds`).

Each is read the way `check` reads it statically (`tools/examine.py`), so both refuse in the same words: the
class's own source for what each object gets, the MRO for what a subclass inherits or a class already has.
"""

from __future__ import annotations

from typing import Optional

from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import SET_BY
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.targets import Place, TargetError, resolve


def _judged(patch: Patch, spec: str, pin: Fingerprint, live: Fingerprint) -> Optional[Finding]:
    """A pin against what is live, in the words `check` uses (the same `sigdiff.compare`, judged for the patch)."""
    from vllm_patchkit.upstream.compat import judge_all
    from vllm_patchkit.upstream.sigdiff import compare

    found = judge_all(patch, compare(patch.key, spec, pin, live))
    if not found:
        return None
    first = found[0]  # the record's expected/found: what differs first (a value digest, a kind, a signature)
    return Finding("fingerprint", "; ".join(f"{b.explain()} ({b.verdict()})" for b in found),
                   first.old if first.old is not None else pin.kind, first.new if first.new is not None else live.kind,
                   found)


def set_place(patch: Patch, entry: Optional[ManifestEntry]) -> "tuple[Place, bool] | Finding":
    """Where a `set` with `instances` or `inherited_from` is installed (a Place on the class) and whether this
    patch is there already; or why not, in the words `check` uses (one reading: `fingerprint.instance_attribute`
    from the class's source, the MRO for what the subclass inherits; `misdeclared.py` for the declaration)."""
    cls_spec, _, attr = patch.target.rpartition(".")
    try:
        cls = resolve(cls_spec).get_raw()
    except TargetError as exc:
        return Finding("target", str(exc), patch.target, "missing")
    if not isinstance(cls, type):
        what = "`instances: true`" if patch.instances else "`inherited_from`"
        return Finding("kind", f"{cls_spec} is not a class ({type(cls).__name__}): {what} sets an attribute of a class",
                       "a class", type(cls).__name__)
    pins = entry.targets if entry is not None else {}
    for spec in (patch.target, patch.inherited_from):
        if spec is not None and spec not in pins:
            return Finding("unpinned", f"{spec} has no pin in the manifest", "a pinned fingerprint", None)
    place = Place(patch.target, cls, attr)
    if patch.adds:
        return _added_place(patch, place, pins[patch.target])
    if patch.instances:
        live = fp.live_instance_attribute(cls, attr)
        if isinstance(live, tuple):
            return Finding("target", live[0], patch.target, "unreadable" if live[1] else "missing")
        bad = _judged(patch, patch.target, pins[patch.target], live)
        if bad is not None:
            return bad
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and getattr(params, "frozen", False):
            return Finding("kind", f"{cls_spec} is a frozen dataclass: setting {attr} on each object raises "
                                   "FrozenInstanceError inside vLLM's construction", "a class whose objects take "
                                   "attributes", "frozen dataclass")
        slots = {n for k in cls.__mro__ for n in ((k.__dict__.get("__slots__") or ()) if not isinstance(
            k.__dict__.get("__slots__"), str) else (k.__dict__["__slots__"],))}
        if not cls.__dictoffset__ and attr not in slots:
            return Finding("kind", f"{cls_spec}'s objects have no __dict__ and no slot {attr!r}: the attribute "
                                   "cannot be set on them", "objects with a __dict__ or the slot", "__slots__")
        from vllm_patchkit.runtime.instances import init_place, marked_in

        return place, marked_in(init_place(place).get_raw(), patch.key)
    # inherited_from: the subclass must not define it; the MRO must find it where declared, as pinned
    pin = pins[patch.target]
    if attr in cls.__dict__:
        if SET_BY.get((id(cls), attr)) == patch.key:
            return place, True  # set by this patch already (an earlier loader of this process)
        return Finding("target", misdeclared.now_defined(patch.target, patch.inherited_from),
                       f"{patch.target}: not defined (inherited from {patch.inherited_from})", "defined")
    definer = next((k for k in cls.__mro__[1:] if attr in k.__dict__), None)
    if definer is None:
        return Finding("target", f"{patch.target}: no attribute {attr!r} on {cls.__qualname__} or its bases "
                                 "(target moved or removed)", patch.inherited_from, "missing")
    actual = f"{definer.__module__}:{definer.__qualname__}.{attr}"
    if actual != patch.inherited_from:
        return Finding("target", misdeclared.inherited_elsewhere(patch.target, patch.inherited_from, actual),
                       patch.inherited_from, actual)
    if pin.kind != "absent":
        return Finding("fingerprint", f"{patch.target}: pinned as {pin.kind}, but {cls.__qualname__} does not define "
                                      "it (it inherits it): re-pin the release (`vllm-patchkit pin`)", pin.kind,
                       "absent")
    raw = definer.__dict__[attr]
    base_pin = pins[patch.inherited_from]
    bad = _judged(patch, patch.inherited_from, base_pin,
                  fp.live(raw, True, with_value=base_pin.value_digest is not None))
    return bad if bad is not None else (place, False)


def _added_place(patch: Patch, place: Place, pin) -> "tuple[Place, bool] | Finding":
    """`adds`: neither the class nor a base defines the name (as pinned: `absent`); one that does is a collision,
    in `check`'s words (`findings.name_collision`)."""
    from vllm_patchkit.upstream.findings import Breakage, BreakageKind

    cls, attr = place.owner, place.attr
    if attr in cls.__dict__ and SET_BY.get((id(cls), attr)) == patch.key:
        return place, True  # added by this patch already (an earlier loader of this process)
    definer = next((k for k in cls.__mro__ if attr in k.__dict__), None)
    if definer is not None:
        where = patch.target if definer is cls else f"{definer.__module__}:{definer.__qualname__}.{attr}"
        from vllm_patchkit.upstream.installed import installed_version

        said = Breakage(BreakageKind.name_collision, patch.key, patch.target, new=where,
                        detail=installed_version() or "?").explain()
        return Finding("collision", said, f"{patch.target}: absent", where)
    if pin.kind != "absent":
        return Finding("fingerprint", f"{patch.target}: pinned as {pin.kind}, but `adds` names a member vLLM does not "
                                      "define: re-pin the release (`vllm-patchkit pin`)", pin.kind, "absent")
    return place, False

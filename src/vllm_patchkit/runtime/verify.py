"""Verify: before anything is installed, check the live target against its pin.

Every finding is a value (code, reason, expected, found) that goes into the
patch's record; rendering is somebody else's job.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Optional

import msgspec
from msgspec import Struct, field

from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import source_fingerprint, wrapper_layers as layers
from vllm_patchkit.runtime.set_places import set_place
from vllm_patchkit.runtime.provenance import outside_upstream, replaced_by, code_site, describe_site, foreign_replacement
from vllm_patchkit.runtime.wrappers import ours
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.upstream import misdeclared, reach_live
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.pinned import compare as _compare
from vllm_patchkit.upstream.targets import MISSING, Place, TargetError, load_object, resolve, resolve_through_mro


class Verified(Struct):
    place: Optional[Place] = None
    copies: list[Place] = field(default_factory=list)
    impl: Any = None
    already: bool = False
    notes: list[Finding] = field(default_factory=list)
    selection: Any = None  # kind subclass: the config field it sets (subclass.Selection), judged at the config stage
    later_uses: list[str] = field(default_factory=list)  # `uses` verified when their module is imported


def _kind_misfit(patch: Patch, place: Place, raw: Any) -> Optional[Finding]:
    """A `wrap`/`replace` installs a function: only a function or method (staticmethod and
    classmethod kept as they are) can take one without changing what vLLM sees."""
    if not traits(patch).installs_function or isinstance(raw, (staticmethod, classmethod)):
        return None
    if isinstance(raw, property) and traits(patch).wraps_original and raw.fget is not None:
        return None  # the getter is wrapped; the class keeps a property (apply.rewrap_descriptor)
    t = type(raw)
    tname = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    if isinstance(raw, property):
        what, found, remedy = ("a property", "property", "`wrap` wraps a property's getter and keeps it a property; "
                               "`replace` would put a function in its place; declare kind: set for a value")
    elif isinstance(raw, type):  # the words `check` uses (misdeclared.py)
        return Finding("kind", misdeclared.class_target(patch.kind.value, patch.target, "class"),
                       "a function or method", "class")
    elif not callable(raw):
        if hasattr(t, "__get__"):
            what, found, remedy = (f"a {tname} descriptor, not a function", tname,
                                   "declare kind: set, or wrap the function it holds")
        else:
            what, found, remedy = (f"a non-callable {tname} value", tname, "declare kind: set to change its value")
    elif (place.owner_is_class and not isinstance(raw, types.FunctionType) and not hasattr(raw, "__wrapped__")
          and not hasattr(t, "__get__")):
        what, found, remedy = (f"a callable {tname} object on a class", tname,
                               "a function in its place would be bound as a method and receive self; "
                               "patch the function it calls")
    else:
        return None
    return Finding("kind", f"{patch.target} is {what}; `{patch.kind.value}` supports functions and methods only "
                           f"({remedy})", "a function or method", found)


def _held_by_value(patch: Patch, func: Any) -> Optional[Finding]:
    """The target names a function imported (or aliased) by value from where it is defined: the same rule and
    words as `check` (misdeclared.py). Told apart from a replacement: the place the function's own
    `__module__:__qualname__` names holds this very object."""
    if not traits(patch).installs_function or type(func) is not types.FunctionType:
        return None
    defined_at = f"{func.__module__}:{func.__qualname__}"
    if defined_at == patch.target or "<" in func.__qualname__:
        return None
    try:
        home = resolve(defined_at, import_module=False)
    except TargetError:
        return None
    if fp.innermost(home.get_raw()) is not func:
        return None
    return Finding("target", misdeclared.held_by_value(patch.target, defined_at), patch.target, defined_at)


def _layer_sites(raw: Any, upstream_module: str) -> str:
    """Each foreign `__wrapped__` layer's code site, with its distribution."""
    out, seen, obj = [], set(), raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    while hasattr(obj, "__wrapped__") and id(obj) not in seen:
        seen.add(id(obj))
        if not getattr(obj, "__vllm_patchkit__", None):
            _, file, _ = code_site(obj)
            if not file or outside_upstream(file, upstream_module):
                out.append(describe_site(obj))
        obj = obj.__wrapped__
    return "; ".join(out) or "a layer of unknown origin"


def _initializing(spec: str) -> bool:
    """The copy's module is being imported right now: it imported the target (a lazy patch is applied from
    that nested import) and has not reached its `from ... import` line yet."""
    mod = sys.modules.get(spec.partition(":")[0])
    return bool(getattr(getattr(mod, "__spec__", None), "_initializing", False))


# -- kind set on the objects of a class (`instances`), or on one subclass over its base (`inherited_from`) ------
def verify_use(patch: Patch, entry: Optional[ManifestEntry], spec: str, copied: bool = False) -> Optional[Finding]:
    """An upstream callable the implementation uses (or a body it copies) against its pin: None when it matches."""
    what = "upstream body the implementation copies" if copied else "upstream callable the implementation uses"
    try:
        used = resolve(spec)
    except TargetError as exc:
        # a call through the class reaches a method the class only inherits: what the MRO finds is what runs
        used = resolve_through_mro(spec) if not copied else None
        if used is None:
            return Finding("uses", f"{what} is gone: {exc}", spec, "missing")
    pin = entry.targets.get(spec) if entry is not None else None
    if pin is None and entry is None and patch.observer:
        return None  # an observing hook with no manifest entry: it exists, which is all it needs here
    if pin is None:
        return Finding("unpinned", f"{spec} ({'copied' if copied else 'used'} by the implementation) "
                       "has no pin in the manifest", "a pinned fingerprint", None)
    used_raw = used.get_raw()
    bad = _compare(spec, pin, fp.live(used_raw, used.owner_is_class, with_digest=pin.source_digest is not None,
                                      with_value=pin.value_digest is not None), used_raw, patch)
    if bad is not None:
        return Finding("uses", f"{what} changed: {bad.reason}", bad.expected, bad.found)
    return None


def verify(patch: Patch, entry: Optional[ManifestEntry],
           pinned_elsewhere: Optional[dict[str, list[str]]] = None, later: frozenset = frozenset()) -> Verified | Finding:
    """Resolve target, copies and implementation; compare with the manifest's pins.

    `pinned_elsewhere` (kind subclass): every place the plan pins -> the patch keys pinning it.
    `later`: `uses` places whose module is not imported yet, left for the loader to verify when it is (listed in
    the result's `later_uses`), so verifying never imports a module vLLM has not imported itself.
    """
    out = Verified()
    if traits(patch).sets_value and (patch.instances or patch.inherited_from is not None or patch.adds):
        got = set_place(patch, entry)  # of each object, an inherited one overridden on a subclass, or an added one
        if isinstance(got, Finding):
            return got
        out.place, out.already = got
    elif patch.target is not None:
        try:
            place = resolve(patch.target)
        except TargetError as exc:
            # `instances: true` patches objects: a method the class has only through a base is what they call
            place = resolve_through_mro(patch.target) if patch.instances and "inherited" in str(exc) else None
            if place is None:
                return Finding("target", str(exc), patch.target, "missing")
        raw = place.get_raw()
        misfit = _kind_misfit(patch, place, raw)
        if misfit is not None:
            return misfit
        pin = entry.targets.get(patch.target) if entry is not None else None
        if pin is None and entry is None and patch.observer:
            # Knowing what the model needs must not depend on a pin: an observing forwarder
            # is taken as it stands, compared with itself (its record says "unpinned").
            pin = msgspec.structs.replace(fp.live(raw, place.owner_is_class), wrappers=layers.wrapper_layers(raw))
        if pin is None:
            return Finding("unpinned", f"{patch.target} has no pin in the manifest", "a pinned fingerprint", None)
        mark = ours(raw)
        if patch.instances:
            if not place.owner_is_class or not place.owner.__dictoffset__:
                return Finding("kind", f"{patch.target}: `instances: true` needs a method of a class whose objects "
                                       "have a __dict__ (the wrapped method is set on each object)",
                               "a method of a class with instance __dict__", type(place.owner).__name__)
            from vllm_patchkit.runtime.instances import init_place

            mark = ours(init_place(place).get_raw())
        if mark == patch.key:
            out.already = True
        # Upstream's own decorator layers may come and go with optional dependencies
        # (vLLM's @instrument needs OpenTelemetry): a layer whose code lives inside the
        # upstream package is never a conflict. A layer whose code lives anywhere else is
        # someone else's wrapper; one whose code is in a dependency (torch.no_grad(), the
        # stdlib's functools.cache) is upstream's only when the pin has it.
        upstream_spec = getattr(place, "definer", "") or patch.target  # inherited (instances): the base's place
        upstream_module = upstream_spec.partition(":")[0]
        foreign = layers.foreign_layers(raw, upstream_module)
        if foreign:
            return Finding("conflict", f"{patch.target} is wrapped by someone else ({_layer_sites(raw, upstream_module)}); "
                           "refusing to stack on it", list(pin.wrappers), foreign)
        replaced = foreign_replacement(patch, upstream_spec, raw)
        if replaced is not None:
            return replaced
        added = layers.unpinned_layers(raw, upstream_module, list(pin.wrappers))
        if added:
            return Finding("conflict", f"{patch.target} carries a wrapper layer that was not there when it was "
                           "pinned (its code is in a dependency of the upstream package, but the pin does not have "
                           "it): someone else wrapped it; refusing to stack on it", list(pin.wrappers), added)
        live = fp.live(raw, place.owner_is_class, with_digest=pin.source_digest is not None,
                       with_value=pin.value_digest is not None)
        want = pin
        if (traits(patch).sets_value and pin.value_digest is not None and live.value_digest != pin.value_digest
                and live.value_digest is not None and live.value_digest == source_fingerprint.value_digest(patch.value)):
            out.already = True  # the value this patch sets is there already (an earlier loader of this process)
            want = msgspec.structs.replace(pin, value_digest=None)
        bad = _compare(patch.target, want, live, raw, patch)
        if bad is not None:
            return bad
        by_value = None if getattr(place, "definer", "") else _held_by_value(patch, fp.innermost(raw))
        if by_value is not None:
            return by_value
        replaced = replaced_by(getattr(place, "definer", "") or patch.target, fp.innermost(raw),
                                None if getattr(place, "definer", "") else place.owner)
        if replaced is not None:
            return Finding("conflict", f"{patch.target} was replaced by another object with the same signature; "
                           "refusing to patch it", patch.target, replaced)
        out.place = place
        target_pin = pin
        original = fp.innermost(raw)
        for spec in patch.copies:
            try:
                copy = resolve(spec, import_module=False)
            except TargetError as exc:
                if "is not imported" in str(exc) or _initializing(spec):
                    continue  # it will take the patched object by value when it imports (or gets to that line)
                return Finding("copy", f"declared copy {spec} is gone: {exc}", "the target's function", "missing")
            held = copy.get_raw()
            if held is not MISSING and fp.innermost(held) is not original:
                return Finding("copy", f"declared copy {spec} holds a different object",
                               f"{patch.target}", repr(held)[:120])
            out.copies.append(copy)
    elsewhere = {patch.target, *patch.copies, *(f"{patch.target}.{m}" for m in patch.overrides)}
    copied = [s for s in patch.reimplements or () if s not in elsewhere and s not in patch.uses]
    for spec in [*patch.uses, *copied]:
        if spec in later:
            out.later_uses.append(spec)  # its module is not imported yet: verified when it is (waiting.py)
            continue
        found = verify_use(patch, entry, spec, copied=spec in copied)
        if found is not None:
            return found
    if patch.value_from is not None:  # kind set with an object: it must import, and be what gets installed
        try:
            out.impl = load_object(patch.value_from)
        except TargetError as exc:
            return Finding("value_from", f"value_from {patch.value_from}: {exc}", "importable", "error")
        if out.place is not None and not patch.instances and out.place.get_raw() is out.impl:
            out.already = True
    if traits(patch).selects_class and out.place is not None:
        from vllm_patchkit.runtime import subclass

        out.impl, bad = subclass.check(patch, entry, out.place, pinned_elsewhere)
        return out if bad is None else bad
    if patch.implementation is not None:
        try:
            out.impl = load_object(patch.implementation)
        except TargetError as exc:
            return Finding("implementation", f"implementation {patch.implementation}: {exc}", "importable", "error")
        if not callable(out.impl) and traits(patch).installs_function:
            return Finding("implementation", f"implementation {patch.implementation} is not callable", "callable", type(out.impl).__name__)
        if traits(patch).installs_function and out.place is not None and target_pin.signature:
            # a wrap: its (wrapped, instance, args, kwargs[, ctx]) shape and declared params; a replace:
            # every call vLLM can make to the target
            found = convention.problems(out.impl, target_pin.signature, shape=traits(patch).call_shape,
                                        name=patch.implementation, target_kind=target_pin.kind,
                                        params=patch.params, patch=patch.key)
            if found:
                return Finding("convention", convention.reason(found), target_pin.signature,
                               convention.signature_text(out.impl))
    gone = verify_reach(patch, entry)
    return out if gone is None else gone


def verify_reach(patch: Patch, entry: Optional[ManifestEntry]) -> Optional[Finding]:
    """Every name the pin says the implementation reaches in vLLM is still there (names only: reach_live.py)."""
    for key, pin in sorted((entry.reach if entry is not None else {}).items()):
        why = reach_live.missing(key, pin)
        if why is not None:
            verb = {"import": "imports", "method": "calls"}.get(pin.kind, "reads")
            return Finding("reach", f"{patch.key} {verb} {key.partition(':')[2] if pin.kind != 'import' else key} "
                           f"({key}, pinned in its manifest entry): {why}; the implementation would raise "
                           "AttributeError or ImportError when it runs", key, "missing")
    return None


def stale_copies(originals: dict[int, tuple[str, set[str]]],
                 names: Optional[dict[str, list[int]]] = None) -> dict[str, list[str]]:
    """Modules holding an original under a name that is neither the target nor a declared copy.

    `originals` maps id(original function) -> (patch key, declared places).
    `names` (the original's own name -> its ids): then every module is searched only under those names
    (`from x import f`, the way by-value copies are made), and only vLLM's own modules under every name
    (`from x import f as g`). The whole search of every name of every module costs ~30 ms in a process
    with vLLM's engine loaded (5,000 modules), the one by name ~3 ms.
    """
    found: dict[str, list[str]] = {}
    if not originals:
        return found
    hits: list[tuple[str, str, Any]] = []
    for mod_name, mod in list(sys.modules.items()):
        try:
            d = mod.__dict__
        except AttributeError:
            continue
        if not isinstance(d, dict):
            continue
        if names is None or mod_name == "vllm" or mod_name.startswith("vllm."):
            hits += [(mod_name, name, value) for name, value in list(d.items()) if id(value) in originals]
        else:
            for name in names:
                value = d.get(name)
                if value is not None and id(value) in originals:
                    hits.append((mod_name, name, value))
    for mod_name, name, value in hits:
        key, declared = originals[id(value)]
        where = f"{mod_name}:{name}"
        if where not in declared and where not in found.get(key, ()):
            found.setdefault(key, []).append(where)
    return found

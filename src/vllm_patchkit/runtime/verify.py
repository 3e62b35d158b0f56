"""Verify: before anything is installed, check the live target against its pin.

Every finding is a value (code, reason, expected, found) that goes into the
patch's record; rendering is somebody else's job.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import msgspec
from msgspec import Struct, field

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import source_fingerprint, wrapper_layers as layers
from vllm_patchkit.runtime.entry_place import entry_place
from vllm_patchkit.runtime.set_places import set_place
from vllm_patchkit.runtime import verify_places as places
from vllm_patchkit.runtime.provenance import replaced_by, foreign_replacement
from vllm_patchkit.runtime.wrappers import ours
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.upstream import reach_live
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
    steps = _Steps(patch, entry, later)
    found = _first_finding(steps.place, steps.uses, steps.value_from)
    if found is not None:
        return found
    if traits(patch).judges_overrides and steps.out.place is not None:
        found = steps.subclass_selection(pinned_elsewhere)  # subclass.py judges the rest: no implementation here
    else:
        found = _first_finding(steps.implementation, steps.reach)
    return steps.out if found is None else found


def _first_finding(*steps: Callable[[], Optional[Finding]]) -> Optional[Finding]:
    """The steps in order until one finds something: the first finding is the verdict, later steps do not run."""
    for step in steps:
        found = step()
        if found is not None:
            return found
    return None


class _Steps:
    """One patch's verification, one method per step; each returns a finding or None. What a step learns (the
    target's place, the object there, its pin) is kept for the steps after it, what the loader gets in `out`."""

    def __init__(self, patch: Patch, entry: Optional[ManifestEntry], later: frozenset) -> None:
        self.patch, self.entry, self.later = patch, entry, later
        self.out = Verified()
        self.target_place: Any = None  # the target's Place (a set with its own place: see out.place)
        self.raw: Any = None  # what the target's place holds
        self.pin: Any = None  # the target's pin (an observer with no manifest entry: itself)

    # -- where the patch acts --------------------------------------------------------------------------------
    def place(self) -> Optional[Finding]:
        """kind set on the objects of a class, an inherited one overridden on a subclass or an added one: its
        own place (set_places.py); any other target: judged against its pin, then its copies."""
        patch = self.patch
        if traits(patch).sets_entry:
            return self.entry_place()
        if traits(patch).sets_value and (patch.instances or patch.inherited_from is not None or patch.adds):
            return self.set_place()
        return self.target() if patch.target is not None else None

    def target(self) -> Optional[Finding]:
        """Resolved, of a kind the patch fits, pinned, wrapped or replaced by nobody else, as pinned; its copies."""
        found = _first_finding(self.target_resolved, self.kind_fits, self.pin_found, self.instances_fit,
                               self.no_foreign_layer, self.no_foreign_replacement, self.no_unpinned_layer,
                               self.as_pinned, self.not_held_by_value, self.not_replaced)
        if found is not None:
            return found
        self.out.place = self.target_place
        return self.copies_hold_it()

    def entry_place(self) -> Optional[Finding]:
        return self.own_place(entry_place(self.patch, self.entry))

    def set_place(self) -> Optional[Finding]:
        return self.own_place(set_place(self.patch, self.entry))

    def own_place(self, got: "tuple[Place, bool] | Finding") -> Optional[Finding]:
        """A place the kind's own reading found (a set's, a register's): kept with whether it is applied already."""
        if isinstance(got, Finding):
            return got
        self.out.place, self.out.already = got
        return None

    # -- the target against its pin ----------------------------------------------------------------------------
    def target_resolved(self) -> Optional[Finding]:
        patch = self.patch
        try:
            place = resolve(patch.target)
        except TargetError as exc:
            # `instances: true` patches objects: a method the class has only through a base is what they call
            place = resolve_through_mro(patch.target) if patch.instances and "inherited" in str(exc) else None
            if place is None:
                return Finding("target", str(exc), patch.target, "missing")
        self.target_place, self.raw = place, place.get_raw()
        return None

    def kind_fits(self) -> Optional[Finding]:
        return places.kind_misfit(self.patch, self.target_place, self.raw)

    def pin_found(self) -> Optional[Finding]:
        patch, entry = self.patch, self.entry
        pin = entry.targets.get(patch.target) if entry is not None else None
        if pin is None and entry is None and patch.observer:
            # Knowing what the model needs must not depend on a pin: an observing forwarder
            # is taken as it stands, compared with itself (its record says "unpinned").
            pin = msgspec.structs.replace(fp.live(self.raw, self.target_place.owner_is_class),
                                          wrappers=layers.wrapper_layers(self.raw))
        if pin is None:
            return Finding("unpinned", f"{patch.target} has no pin in the manifest", "a pinned fingerprint", None)
        self.pin = pin
        return None

    def instances_fit(self) -> Optional[Finding]:
        """`instances: true` needs objects with a __dict__; our mark there (or on the target) says: applied already."""
        patch, place = self.patch, self.target_place
        mark = ours(self.raw)
        if patch.instances:
            if not place.owner_is_class or not place.owner.__dictoffset__:
                return Finding("kind", f"{patch.target}: `instances: true` needs a method of a class whose objects "
                                       "have a __dict__ (the wrapped method is set on each object)",
                               "a method of a class with instance __dict__", type(place.owner).__name__)
            from vllm_patchkit.runtime.instances import init_place

            mark = ours(init_place(place).get_raw())
        if mark == patch.key:
            self.out.already = True
        return None

    @property
    def definer(self) -> str:
        """The base's place when the target is inherited (instances), else ''."""
        return getattr(self.target_place, "definer", "")

    @property
    def upstream_spec(self) -> str:
        return self.definer or self.patch.target

    def no_foreign_layer(self) -> Optional[Finding]:
        # Upstream's own decorator layers may come and go with optional dependencies
        # (vLLM's @instrument needs OpenTelemetry): a layer whose code lives inside the
        # upstream package is never a conflict. A layer whose code lives anywhere else is
        # someone else's wrapper; one whose code is in a dependency (torch.no_grad(), the
        # stdlib's functools.cache) is upstream's only when the pin has it.
        upstream_module = Target.parse(self.upstream_spec).module
        foreign = layers.foreign_layers(self.raw, upstream_module)
        if foreign:
            return Finding("conflict", f"{self.patch.target} is wrapped by someone else "
                           f"({places.layer_sites(self.raw, upstream_module)}); refusing to stack on it",
                           list(self.pin.wrappers), foreign)
        return None

    def no_foreign_replacement(self) -> Optional[Finding]:
        return foreign_replacement(self.patch, self.upstream_spec, self.raw)

    def no_unpinned_layer(self) -> Optional[Finding]:
        added = layers.unpinned_layers(self.raw, Target.parse(self.upstream_spec).module, list(self.pin.wrappers))
        if added:
            return Finding("conflict", f"{self.patch.target} carries a wrapper layer that was not there when it was "
                           "pinned (its code is in a dependency of the upstream package, but the pin does not have "
                           "it): someone else wrapped it; refusing to stack on it", list(self.pin.wrappers), added)
        return None

    def as_pinned(self) -> Optional[Finding]:
        """The live fingerprint is the pin's (a value this patch sets already there: applied already)."""
        patch, pin = self.patch, self.pin
        live = fp.live(self.raw, self.target_place.owner_is_class, with_digest=pin.source_digest is not None,
                       with_value=pin.value_digest is not None)
        want = pin
        if (traits(patch).sets_value and pin.value_digest is not None and live.value_digest != pin.value_digest
                and live.value_digest is not None and live.value_digest == source_fingerprint.value_digest(patch.value)):
            self.out.already = True  # the value this patch sets is there already (an earlier loader of this process)
            want = msgspec.structs.replace(pin, value_digest=None)
        return _compare(patch.target, want, live, self.raw, patch)

    def not_held_by_value(self) -> Optional[Finding]:
        return None if self.definer else places.held_by_value(self.patch, fp.innermost(self.raw))

    def not_replaced(self) -> Optional[Finding]:
        replaced = replaced_by(self.upstream_spec, fp.innermost(self.raw),
                               None if self.definer else self.target_place.owner)
        if replaced is not None:
            return Finding("conflict", f"{self.patch.target} was replaced by another object with the same signature; "
                           "refusing to patch it", self.patch.target, replaced)
        return None

    def copies_hold_it(self) -> Optional[Finding]:
        """Every declared copy that is imported holds the target's very function."""
        patch, original = self.patch, fp.innermost(self.raw)
        for spec in patch.copies:
            try:
                copy = resolve(spec, import_module=False)
            except TargetError as exc:
                if "is not imported" in str(exc) or places.initializing(spec):
                    continue  # it will take the patched object by value when it imports (or gets to that line)
                return Finding("copy", f"declared copy {spec} is gone: {exc}", "the target's function", "missing")
            held = copy.get_raw()
            if held is not MISSING and fp.innermost(held) is not original:
                return Finding("copy", f"declared copy {spec} holds a different object",
                               f"{patch.target}", repr(held)[:120])
            self.out.copies.append(copy)
        return None

    # -- what the implementation uses, and the implementation ---------------------------------------------------
    def uses(self) -> Optional[Finding]:
        """Every upstream callable it uses, and every body it copies that no other pin covers, against its pin."""
        patch = self.patch
        elsewhere = {patch.target, *patch.copies, *(f"{patch.target}.{m}" for m in patch.overrides)}
        copied = [s for s in patch.reimplements or () if s not in elsewhere and s not in patch.uses]
        for spec in [*patch.uses, *copied]:
            if spec in self.later:
                self.out.later_uses.append(spec)  # its module is not imported yet: verified when it is (waiting.py)
                continue
            found = verify_use(patch, self.entry, spec, copied=spec in copied)
            if found is not None:
                return found
        return None

    def value_from(self) -> Optional[Finding]:
        """kind set with an object: it must import, and be what gets installed."""
        patch, out = self.patch, self.out
        if patch.value_from is None:
            return None
        try:
            out.impl = load_object(patch.value_from)
        except TargetError as exc:
            return Finding("value_from", f"value_from {patch.value_from}: {exc}", "importable", "error")
        if out.place is not None and not patch.instances and out.place.get_raw() is out.impl:
            out.already = True
        return None

    def subclass_selection(self, pinned_elsewhere: Optional[dict[str, list[str]]]) -> Optional[Finding]:
        from vllm_patchkit.runtime import subclass

        self.out.impl, bad = subclass.check(self.patch, self.entry, self.out.place, pinned_elsewhere)
        return bad

    def implementation(self) -> Optional[Finding]:
        """The implementation imports, is callable when the kind installs a function, and keeps its convention."""
        patch = self.patch
        if patch.implementation is None:
            return None
        try:
            self.out.impl = load_object(patch.implementation)
        except TargetError as exc:
            return Finding("implementation", f"implementation {patch.implementation}: {exc}", "importable", "error")
        if not callable(self.out.impl) and traits(patch).installs_function:
            return Finding("implementation", f"implementation {patch.implementation} is not callable", "callable",
                           type(self.out.impl).__name__)
        return self.convention()

    def convention(self) -> Optional[Finding]:
        """A wrap: its (wrapped, instance, args, kwargs[, ctx]) shape and declared params; a replace: every call
        vLLM can make to the target."""
        patch, impl = self.patch, self.out.impl
        if not (traits(patch).installs_function and self.out.place is not None and self.pin.signature):
            return None
        found = convention.problems(impl, self.pin.signature, shape=traits(patch).call_shape,
                                    name=patch.implementation, target_kind=self.pin.kind,
                                    params=patch.params, patch=patch.key, calls=convention.pinned_calls(self.pin))
        if found:
            return Finding("convention", convention.reason(found), self.pin.signature, convention.signature_text(impl))
        return None

    def reach(self) -> Optional[Finding]:
        return verify_reach(self.patch, self.entry)


def verify_reach(patch: Patch, entry: Optional[ManifestEntry]) -> Optional[Finding]:
    """Every name the pin says the implementation reaches in vLLM is still there (names only: reach_live.py)."""
    for key, pin in sorted((entry.reach if entry is not None else {}).items()):
        why = reach_live.missing(key, pin)
        if why is not None:
            verb = {"import": "imports", "method": "calls"}.get(pin.kind, "reads")
            return Finding("reach", f"{patch.key} {verb} {Target.parse(key).qualname if pin.kind != 'import' else key} "
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

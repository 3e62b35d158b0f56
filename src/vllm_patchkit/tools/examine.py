"""Examine one patch on a release: the fingerprint of each place it pins, and what differs from its pins.

The per-place half of `check` (and of `pin`, which writes what is found here): each pinned place is looked up
on the release, compared with its pin (`sigdiff.compare`), and, when it moved or is now inherited, compared
again at its new home; the target must also be declared as the loader will take it (`misdeclared.py`), have
no undeclared by-value copies, and be fitted by an importable implementation (`convention.py`). With
`--live`, another plugin's object standing at a target is reported as such. The breakages are judged per
patch (`compat.judge_all`) before they are returned.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import msgspec

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.upstream.compat import judge_all
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.tools.releases import LiveRelease, Release, StaticView
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.copied_part import outside, part_digest
from vllm_patchkit.upstream.sigdiff import compare, missing_breakages, new_home
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.examine_entry import registered_entry
from vllm_patchkit.tools.moved_identity import confirm_moves


_HAS_SOURCE = frozenset({"function", "method", "staticmethod", "classmethod", "class"})


def target_specs(patch: Patch) -> list[str]:
    """Every upstream place pinned for the patch: its target, the copies of it, the callables it uses."""
    return patch.pinned_specs


def examine(release: Release, patch: Patch, pins: Optional[dict[str, Fingerprint]],
            pinned_on: Optional[Release] = None, *,
            impl_here: bool = True) -> tuple[dict[str, Union[Fingerprint, Missing]], list[Breakage]]:
    """Fingerprints of the patch's pinned places on the release, and the breakages against `pins`.

    `pinned_on`: the release the pins were read from, when at hand: a by-value copy of the target that was
    already there is not a change of this release (pin reported it when the patch was first pinned).
    `impl_here`: the patch's set is installed where this runs (`set_on_path`), so an implementation module
    not found on this Python's path is a finding; False for a loose folder of patches that is not (left to
    start-up, as the loader runs where the set is installed)."""
    pins = pins or {}
    live = _live_foreign_check(release, patch)
    by_source = patch.source_pinned_specs
    found: dict[str, Union[Fingerprint, Missing]] = {}
    out: list[Breakage] = []
    target_id = None
    calls_read: dict[str, Fingerprint] = {}  # overridden methods whose calls were read: pinned with them
    for spec in target_specs(patch):
        if traits(patch).sets_entry and spec == patch.target:
            found[spec], more = registered_entry(release, patch, spec, pins.get(spec))  # as the loader reads it
            out.extend(more)
            continue
        if traits(patch).sets_value and (patch.instances or patch.inherited_from or patch.adds) and spec in (
                patch.target, patch.inherited_from):
            found[spec], more = _set_place(release, patch, spec, pins.get(spec))  # the loader's reading, statically
            out.extend(more)
            continue
        is_copy = spec in patch.copies and spec != patch.target  # `uses` are checked like targets
        pin = pins.get(spec)
        with_digest = spec in by_source or (pin is not None and pin.source_digest is not None)
        got = release.lookup(spec, with_digest)
        through_mro = (patch.instances and spec == patch.target) or (spec in patch.uses and not is_copy
                                                                      and spec != patch.target)
        if isinstance(got, Missing) and got.inherited_from and through_mro:
            # `instances: true` patches objects, and a `uses` entry is called through the class: both reach the
            # base's method through the MRO, which is what is compared (the loader reads it the same way:
            # targets.resolve_through_mro)
            got = release.lookup(got.inherited_from, with_digest)
        if isinstance(got, Missing) and got.moved_to and pin is not None and not is_copy:  # same name, same function?
            got = confirm_moves(release, pinned_on, spec, pin, got)
        if spec in patch.copied_part and isinstance(got, Fingerprint):
            got, gone = _with_part(release, patch, spec, got, pin)
            out.extend(gone)
        found[spec] = got
        foreign = live(spec) if live is not None and (spec == patch.target or is_copy) else None
        if foreign is not None:  # another plugin's object: its signature says nothing about vLLM's
            out.append(foreign)
            continue
        if pin is not None:
            out.extend(compare(patch.key, spec, pin, got, copy=is_copy))
            if spec in by_source and pin.source_digest is None and pin.kind in _HAS_SOURCE:
                out.append(Breakage(BreakageKind.unpinned, patch.key, spec, detail=(
                    f"{patch.key} copies the body of {spec} (`reimplements`), but its pin has no source digest: "
                    "re-pin on the release the copy was made from (`vllm-patchkit pin`)")))
            home = new_home(got) if isinstance(got, Missing) and not is_copy and pin.kind != "absent" else None
            if home is not None:  # moved or now inherited: what changed on the way, diffed where it is now
                there = release.lookup(home, with_digest)
                if not isinstance(there, Missing):
                    out.extend(compare(patch.key, home, pin, there))
        elif isinstance(got, Missing):  # nothing pinned: this release is the one read first
            out.extend(missing_breakages(patch.key, spec, got, copy=is_copy, pinned=False))
        if isinstance(got, Missing):
            continue
        if spec == patch.target:
            target_id = release.identity(spec)
            why = misdeclared.class_target(patch.kind.value, spec, got.kind)
            if why is None and traits(patch).installs_function and target_id is not None:
                held = [h for h in release.holders(target_id[1]) if _may_hold_original(release, patch, h)]
                why = misdeclared.held_by_value(spec, target_id[1], held)
            if why is not None:
                out.append(Breakage(BreakageKind.misdeclared, patch.key, spec, detail=why))
                continue
            conv = _convention(patch, got, impl_here)
            if conv and _called_by_vllm(patch, spec):  # judged against the calls vLLM makes (read only when needed)
                got = found[spec] = with_calls(release, spec, got)
                conv = _convention(patch, got, impl_here)
            out.extend(conv)
            if traits(patch).judges_overrides:
                out.extend(_override_conventions(patch, found_so_far={**found, CALLS_READ: calls_read},
                                                 release=release))
            if traits(patch).installs_function:
                before = set(pinned_on.holders(spec)) if pinned_on is not None and pins else set()
                out.extend(Breakage(BreakageKind.copy_undeclared, patch.key, spec, new=held)
                           for held in release.holders(spec) if held not in patch.copies and held not in before
                           and _may_hold_original(release, patch, held))
        elif is_copy and target_id is not None:
            held = release.identity(spec)
            if held is not None and held[0] != target_id[0]:
                out.append(Breakage(BreakageKind.copy_differs, patch.key, spec, old=target_id[1], new=held[1]))
    for spec, read in calls_read.items():
        if isinstance(found.get(spec), Fingerprint):
            found[spec] = msgspec.structs.replace(found[spec], call_positional=read.call_positional,
                                                  call_keywords=read.call_keywords)
    return found, [_judged_part(patch, b, pins, found) for b in judge_all(patch, out)]


CALLS_READ = " calls read"  # a key no place has: where _override_conventions leaves what it read


def _called_by_vllm(patch: Patch, spec: str) -> bool:
    """A place vLLM calls the implementation at: a replace's target, a subclass's or hook's overridden method."""
    return ((traits(patch).stands_in and spec == patch.target) or
            (traits(patch).judges_overrides and spec in {f"{patch.target}.{m}" for m in patch.overrides}))


def with_calls(release: Release, spec: str, got: Fingerprint) -> Fingerprint:
    """`got` with what vLLM's calls to `spec` pass (`static_calls.py`), when that can be read."""
    facts = release.calls(spec)
    if facts is None:
        return got
    return msgspec.structs.replace(got, call_positional=facts.positional, call_keywords=list(facts.keywords))


def _with_part(release: Release, patch: Patch, spec: str, got: Fingerprint,
               pin: Optional[Fingerprint]) -> tuple[Fingerprint, list[Breakage]]:
    """`got` with the digest of the part `copied_part` names (`upstream/copied_part.py`); a part that cannot be
    found is refused at pin (misdeclared) and, against a pin that had it, is a copied part gone (source_changed)."""
    node = release.definition(spec)
    digest = part_digest(node, patch.copied_part[spec]) if node is not None else ("the body cannot be read",)
    if isinstance(digest, str):
        return msgspec.structs.replace(got, part_digest=digest), []
    why = f"{spec}: {digest[0]}"
    if pin is None:
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec, detail=why)]
    return got, [Breakage(BreakageKind.source_changed, patch.key, spec, old=pin.source_digest,
                          new=got.source_digest, detail=why)]


def _judged_part(patch: Patch, b: Breakage, pins: dict, found: dict) -> Breakage:
    """A body that changed only outside the part the implementation copies is compatible (one rule with the
    loader: `verify.verify_use`)."""
    pin, got = pins.get(b.target), found.get(b.target)
    if (b.kind is BreakageKind.source_changed and b.target in patch.copied_part and b.detail is None
            and pin is not None and pin.part_digest is not None and isinstance(got, Fingerprint)
            and got.part_digest == pin.part_digest):
        return b._replace(breaking=False, compat=outside(patch.copied_part[b.target]))
    return b


def _may_hold_original(release: Release, patch: Patch, held: str) -> bool:
    """A module holding the target by value calls the original only if it bound it before the patch was
    installed: an import-stage patch is installed when the target's module executes, so only a holder that may run
    before the plugins load keeps the original (`upstream/import_order.py`); a config-stage patch is installed
    later, and any holder may have bound the original by then."""
    if patch.stage != "import":
        return True
    return release.runs_before_plugins(Target.parse(held).module)


def _set_place(release: Release, patch: Patch, spec: str,
               pin: Optional[Fingerprint]) -> tuple[Union[Fingerprint, Missing], list[Breakage]]:
    """A `set` on the objects of a class (`instances`) or on one subclass over its base (`inherited_from`): what is
    pinned at `spec` and what changed, by the loader's rules (`set_places.set_place`, `misdeclared.py`).

    - `instances`: the target is an attribute the class's methods assign on each object (`instance_attribute`,
      with the value digest of the literal `__init__` assigns); gone when no method assigns it any more;
    - `inherited_from`: the target is pinned `absent` (the subclass does not define it) and the base's attribute
      as any class attribute (its value digest). The subclass defining it itself, or the MRO finding it at another
      base, is a misdeclaration the loader refuses with the same words, never "moved"."""
    if patch.adds:
        return _added_name(release, patch, spec, pin)
    if patch.instances:
        got = _instance_attribute(release, spec)
        if pin is not None:
            return got, compare(patch.key, spec, pin, got)
        return got, missing_breakages(patch.key, spec, got) if isinstance(got, Missing) else []
    got = release.lookup(spec)
    if spec == patch.inherited_from:
        if isinstance(got, Missing) and got.inherited_from:
            return got, []  # the base inherits it too: the target's reading names the class the MRO finds
        if pin is not None:
            return got, compare(patch.key, spec, pin, got)
        return got, missing_breakages(patch.key, spec, got) if isinstance(got, Missing) else []
    if isinstance(got, Fingerprint):
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec,
                              detail=misdeclared.now_defined(spec, patch.inherited_from))]
    if got.inherited_from == patch.inherited_from:
        absent = Fingerprint(kind="absent")
        return absent, [] if pin is None else compare(patch.key, spec, pin, absent)
    if got.inherited_from:
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec,
                              detail=misdeclared.inherited_elsewhere(spec, patch.inherited_from, got.inherited_from))]
    return got, missing_breakages(patch.key, spec, got)


def _added_name(release: Release, patch: Patch, spec: str,
                pin: Optional[Fingerprint]) -> tuple[Union[Fingerprint, Missing], list[Breakage]]:
    """`adds`: the class must exist and define the name neither itself nor through a base (pinned `absent`); a
    release where it does is a collision, on the first release read as on a later one."""
    owner = release.lookup(spec.rpartition(".")[0])
    if isinstance(owner, Missing):
        return owner, missing_breakages(patch.key, spec.rpartition(".")[0], owner, pinned=pin is not None)
    got = release.lookup(spec)
    if isinstance(got, Fingerprint) or (isinstance(got, Missing) and got.inherited_from):
        where = spec if isinstance(got, Fingerprint) else got.inherited_from
        return got, [Breakage(BreakageKind.name_collision, patch.key, spec, new=where,
                              detail=release.version() or "?")]
    absent = Fingerprint(kind="absent")
    return absent, [] if pin is None else compare(patch.key, spec, pin, absent)


def _instance_attribute(release: Release, spec: str) -> Union[Fingerprint, Missing]:
    """`spec` as an attribute of each object: read from the release's source (`StaticRelease.instance_attribute`),
    or, for `--live`, from the imported class's source as the loader reads it (`fingerprint.live_instance_attribute`)."""
    if isinstance(release, StaticView):
        return release.release.instance_attribute(spec)
    reader = getattr(release, "instance_attribute", None)
    if reader is not None:
        return reader(spec)
    if isinstance(release, LiveRelease):
        from vllm_patchkit.upstream import fingerprint as fp
        from vllm_patchkit.upstream.targets import TargetError, resolve

        cls_spec, _, attr = spec.rpartition(".")
        try:
            cls = resolve(cls_spec).get_raw()
        except TargetError as exc:
            return Missing(spec, str(exc))
        if not isinstance(cls, type):
            return Missing(spec, f"{cls_spec} is not a class")
        got = fp.live_instance_attribute(cls, attr)
        return got if isinstance(got, Fingerprint) else Missing(spec, got[0], unreadable=got[1])
    return Missing(spec, f"{getattr(release, 'label', release)} cannot read attributes of objects", unreadable=True)


_PLUGINS_LOADED: list[str] = []


def load_other_plugins() -> list[str]:
    """`--live`: run every other general plugin's entry point (`vllm.general_plugins`, as vLLM does in each
    process, `VLLM_PLUGINS` honoured), never vllm-patchkit's own, so a target another plugin replaces with
    `setattr` is seen as the loader will see it. Once per process; returns what failed, as notes."""
    if _PLUGINS_LOADED:
        return _PLUGINS_LOADED[1:]
    import logging
    import os
    from importlib.metadata import entry_points

    _PLUGINS_LOADED.append("loaded")
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else allowed.split(",")
    for ep in entry_points(group="vllm.general_plugins"):
        if ep.name == "vllm_patchkit" or (names is not None and ep.name not in names):
            continue
        try:
            ep.load()()
        except Exception as exc:  # another plugin's failure is its own; say so and read on
            _PLUGINS_LOADED.append(f"plugin {ep.name} failed to load: {type(exc).__name__}: {exc}")
            logging.getLogger("vllm.patchkit").warning("vllm-patchkit: %s", _PLUGINS_LOADED[-1])
    return _PLUGINS_LOADED[1:]


def _live_foreign_check(release: Release, patch: Patch):
    """For the installed vLLM read by import (`--live`): a function telling, per target, whether another
    plugin's code stands there (the loader's `conflict`, `provenance.foreign_replacement`), as a breakage; None
    otherwise. A static reading sees only vLLM's source, never a run-time replacement."""
    if not isinstance(release, LiveRelease) or not traits(patch).installs_function:
        return None
    load_other_plugins()

    def foreign(spec: str) -> Optional[Breakage]:
        from vllm_patchkit.upstream.targets import TargetError, resolve
        from vllm_patchkit.runtime.provenance import foreign_replacement

        try:
            raw = resolve(spec).get_raw()
        except TargetError:
            return None
        f = foreign_replacement(patch, spec, raw)
        return None if f is None else Breakage(BreakageKind.foreign_replacement, patch.key, spec, new=f.found)

    return foreign


def _override_conventions(patch: Patch, found_so_far: dict, release: Release) -> list[Breakage]:
    """Each override (kind subclass) must accept every call vLLM makes to the base method, as the loader
    judges it (`runtime/subclass._override_problem`, the same `convention.problems` and words): read statically.
    `__init__` is judged against vLLM's constructions elsewhere; an override the implementation cannot be read for
    is left to the loader's `override` refusal."""
    from vllm_patchkit.upstream import convention, impl_static

    out = []
    for name in patch.overrides:
        spec = f"{patch.target}.{name}"
        pin = found_so_far.get(spec) or release.lookup(spec)
        if name == "__init__" or not isinstance(pin, Fingerprint) or not pin.signature:
            continue
        try:
            sig = impl_static.call_signature(impl_static.read(f"{patch.implementation}.{name}"))
        except impl_static.ImplUnreadable:
            continue
        if sig is None:
            continue
        found = convention.problems(sig, pin.signature, shape="replace", name=f"{patch.implementation}.{name}",
                                    target_kind=pin.kind)
        if found:  # judged against the calls vLLM makes (read only when there is something to judge)
            pin = found_so_far[CALLS_READ][spec] = with_calls(release, spec, pin)
            found = convention.problems(sig, pin.signature, shape="replace", name=f"{patch.implementation}.{name}",
                                        target_kind=pin.kind, calls=convention.pinned_calls(pin))
        if found:
            out.append(Breakage(BreakageKind.convention_mismatch, patch.key, spec, new="convention",
                                detail=f"override of {spec}: {convention.reason(found)}"))
    return out


def _convention(patch: Patch, target: Fingerprint, impl_here: bool = True) -> list[Breakage]:
    """The implementation must accept every call the release can make to the target (as at start-up), and
    it must be importable at all: a module not found on this Python's path (not installed where `check`
    runs), one that does not parse, or a name it does not define is what the loader refuses at start-up."""
    from vllm_patchkit.upstream import convention

    out = []
    for p in convention.problems_for(patch, target.signature, target_kind=target.kind,
                                     calls=convention.pinned_calls(target)):  # read statically
        if p.code == "implementation_missing" and not impl_here:
            continue  # a loose folder of patches, not installed here: the module may well be where it serves
        kind = (BreakageKind.implementation_unimportable if p.code in ("implementation_missing", "implementation")
                else BreakageKind.convention_mismatch)
        out.append(Breakage(kind, patch.key, patch.target, parameter=p.where, new=p.code, detail=p.reason))
    return out


@functools.lru_cache(maxsize=1)
def _installed_set_names() -> frozenset[str]:
    try:
        from vllm_patchkit.declaration.patchsets import CORE, installed_sets

        return frozenset({CORE, *(s.name for s in installed_sets())})
    except Exception:
        return frozenset()


def set_on_path(patch_set: PatchSet, key: str) -> bool:
    """Whether the patch's own set is installed where this runs: found through an installed distribution's
    entry point (or the framework's own), or its folder is on this Python's path (inside a `sys.path` entry).
    Then its implementation modules must import here as they will where it serves."""
    import os
    import sys

    file = patch_set.files.get(key)
    if file is None:
        return True
    name = patch_set.set_of.get(key)
    if name is not None and name in _installed_set_names():
        return True
    folder = os.path.realpath(os.path.dirname(file))
    for entry in sys.path:
        root = os.path.realpath(entry or os.getcwd())
        if folder == root or folder.startswith(root + os.sep):
            return True
    return False


"""Verify: before anything is installed, check the live target against its pin.

Every finding is a value (code, reason, expected, found) that goes into the
patch's record; rendering is somebody else's job.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from . import fingerprint as fp
from .apply import ours
from .schema import Fingerprint, Kind, ManifestEntry, Patch
from .targets import MISSING, Place, TargetError, load_object, resolve


@dataclass
class Finding:
    code: str
    reason: str
    expected: Any = None
    found: Any = None


@dataclass
class Verified:
    place: Optional[Place] = None
    copies: list[Place] = field(default_factory=list)
    impl: Any = None
    already: bool = False
    notes: list[Finding] = field(default_factory=list)


def _compare(spec: str, pin: Fingerprint, live: Fingerprint) -> Optional[Finding]:
    for name in ("kind", "signature", "source_digest"):
        want, got = getattr(pin, name), getattr(live, name)
        if name == "source_digest" and want is None:
            continue
        if want != got:
            return Finding("fingerprint", f"{spec}: {name} differs from the pin", want, got)
    return None


def _replaced_by(spec: str, func: Any) -> Optional[str]:
    """Where the function at the target was really defined, when that is not the target itself.

    A plain `setattr` replacement with the same signature has no `__wrapped__` layer to see;
    its defining module or qualname gives it away.
    """
    import types

    if type(func) is not types.FunctionType:
        return None
    module, _, qualname = spec.partition(":")
    if func.__module__ == module and func.__qualname__ == qualname:
        return None
    return f"{func.__module__}:{func.__qualname__} (code in {func.__code__.co_filename})"


def verify(patch: Patch, entry: Optional[ManifestEntry]) -> Verified | Finding:
    """Resolve target, copies and implementation; compare with the manifest's pins."""
    out = Verified()
    if patch.target is not None:
        try:
            place = resolve(patch.target)
        except TargetError as exc:
            return Finding("target", str(exc), patch.target, "missing")
        raw = place.get_raw()
        pin = entry.targets.get(patch.target) if entry is not None else None
        if pin is None and entry is None and patch.observer:
            # Knowing what the model needs must not depend on a pin: an observing forwarder
            # is taken as it stands, compared with itself (its record says "unpinned").
            pin = fp.live(raw, place.owner_is_class)
        if pin is None:
            return Finding("unpinned", f"{patch.target} has no pin in the manifest", "a pinned fingerprint", None)
        mark = ours(raw)
        if mark == patch.key:
            out.already = True
        # Upstream's own decorator layers may come and go with optional dependencies
        # (vLLM's @instrument needs OpenTelemetry): only a layer whose code lives outside
        # the upstream package is someone else's wrapper.
        foreign = fp.foreign_layers(raw, patch.target.partition(":")[0])
        if foreign:
            return Finding("conflict", f"{patch.target} is wrapped by someone else; refusing to stack on it",
                           list(pin.wrappers), foreign)
        live = fp.live(raw, place.owner_is_class, with_digest=pin.source_digest is not None)
        bad = _compare(patch.target, pin, live)
        if bad is not None:
            return bad
        replaced = _replaced_by(patch.target, fp.innermost(raw))
        if replaced is not None:
            return Finding("conflict", f"{patch.target} was replaced by another object with the same signature; "
                           "refusing to patch it", patch.target, replaced)
        out.place = place
        original = fp.innermost(raw)
        for spec in patch.copies:
            try:
                copy = resolve(spec, import_module=False)
            except TargetError as exc:
                if "is not imported" in str(exc):
                    continue  # it will take the patched object by value when it imports
                return Finding("copy", f"declared copy {spec} is gone: {exc}", "the target's function", "missing")
            held = copy.get_raw()
            if held is not MISSING and fp.innermost(held) is not original:
                return Finding("copy", f"declared copy {spec} holds a different object",
                               f"{patch.target}", repr(held)[:120])
            out.copies.append(copy)
    for spec in patch.uses:
        try:
            used = resolve(spec)
        except TargetError as exc:
            return Finding("uses", f"upstream callable the implementation uses is gone: {exc}", spec, "missing")
        pin = entry.targets.get(spec) if entry is not None else None
        if pin is None:
            return Finding("unpinned", f"{spec} (used by the implementation) has no pin in the manifest",
                           "a pinned fingerprint", None)
        bad = _compare(spec, pin, fp.live(used.get_raw(), used.owner_is_class, with_digest=pin.source_digest is not None))
        if bad is not None:
            return Finding("uses", f"upstream callable the implementation uses changed: {bad.reason}", bad.expected, bad.found)
    if patch.implementation is not None:
        try:
            out.impl = load_object(patch.implementation)
        except TargetError as exc:
            return Finding("implementation", f"implementation {patch.implementation}: {exc}", "importable", "error")
        if not callable(out.impl) and patch.kind in (Kind.wrap, Kind.replace):
            return Finding("implementation", f"implementation {patch.implementation} is not callable", "callable", type(out.impl).__name__)
    return out


def stale_copies(originals: dict[int, tuple[str, set[str]]]) -> dict[str, list[str]]:
    """Modules holding an original under a name that is neither the target nor a declared copy.

    `originals` maps id(original function) -> (patch key, declared places).
    """
    found: dict[str, list[str]] = {}
    if not originals:
        return found
    for mod_name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, value in list(d.items()):
            hit = originals.get(id(value))
            if hit is None:
                continue
            key, declared = hit
            where = f"{mod_name}:{name}"
            if where not in declared:
                found.setdefault(key, []).append(where)
    return found

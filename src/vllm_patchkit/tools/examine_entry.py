"""`check` and `pin` on a register patch: the mapping at its target, and whether vLLM registers its `entry`
itself (`upstream/entries.py`, the reading the loader shares). What is pinned is that presence and the mapping's
kind; never the mapping's value, which every other registration changes."""

from __future__ import annotations

from typing import Optional, Union

from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools.releases import Release
from vllm_patchkit.upstream import entries
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.sigdiff import compare, missing_breakages


def registered_entry(release: Release, patch: Patch, spec: str,
                     pin: Optional[Fingerprint]) -> tuple[Union[Fingerprint, Missing], list[Breakage]]:
    """The mapping's fingerprint on the release (kind and `entry_present`) and what changed against `pin`."""
    got = release.lookup(spec)
    if isinstance(got, Missing):
        return got, missing_breakages(patch.key, spec, got, pinned=pin is not None)
    if got.kind != "attribute":
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec, detail=(
            f"{spec} is a {got.kind}, not a mapping: kind register sets one entry of a dict vLLM reads"))]
    presence = release.entry(spec, patch.entry)
    found = Fingerprint(kind=got.kind, entry_present=presence if isinstance(presence, bool) else None)
    out = compare(patch.key, spec, Fingerprint(kind=pin.kind), Fingerprint(kind=got.kind)) if pin is not None else []
    out += entries.breakages(patch.key, spec, patch.entry, pin.entry_present if pin is not None else None, presence,
                             patch.adds, release.version() or "?")
    return found, out

"""Where a `register` patch sets its entry (the mapping at its target) and whether it may: the mapping is there
and mutable, pinned, and vLLM registers the entry's key itself exactly as pinned (`upstream/entries.py`, in the
words `check` uses: a key vLLM started registering is a collision, one it dropped is gone)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Optional

from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import ENTRY_BY
from vllm_patchkit.upstream import entries
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.targets import Place, TargetError, resolve


def entry_place(patch: Patch, entry: Optional[ManifestEntry]) -> "tuple[Place, bool] | Finding":
    """The mapping's Place and whether this patch's entry is there already; or why the patch may not set it."""
    try:
        place = resolve(patch.target)
    except TargetError as exc:
        return Finding("target", str(exc), patch.target, "missing")
    mapping = place.get_raw()
    if not isinstance(mapping, MutableMapping):
        return Finding("kind", f"{patch.target} is not a mutable mapping ({type(mapping).__name__}): kind register "
                               "sets one entry of a dict vLLM reads", "a mutable mapping", type(mapping).__name__)
    pin = entry.targets.get(patch.target) if entry is not None else None
    if pin is None:
        return Finding("unpinned", f"{patch.target} has no pin in the manifest", "a pinned fingerprint", None)
    live_kind = fp.live(mapping, place.owner_is_class).kind
    if pin.kind != live_kind:
        return Finding("fingerprint", f"{patch.target}: pinned as {pin.kind}, found {live_kind}", pin.kind, live_kind)
    if ENTRY_BY.get((id(mapping), patch.entry)) == patch.key:
        return place, True  # set by this patch already (an earlier loader of this process)
    if pin.entry_present is None:
        return Finding("fingerprint", f"{patch.target}: its pin does not say whether vLLM registers {patch.entry!r} "
                                      "itself (pinned before kind register read it): re-pin the release "
                                      "(`vllm-patchkit pin`)", "entry_present pinned", None)
    from vllm_patchkit.upstream.compat import judge_all
    from vllm_patchkit.upstream.installed import installed_version

    present = patch.entry in mapping
    found = judge_all(patch, entries.breakages(patch.key, patch.target, patch.entry, pin.entry_present, present,
                                               patch.adds, installed_version() or "?"))
    if found:
        b = found[0]
        want, got = ("present" if pin.entry_present else "absent"), ("present" if present else "absent")
        return Finding(b.kind.failure_code, f"{b.explain()} ({b.verdict()})", f"{patch.entry!r} {want}",
                       f"{patch.entry!r} {got}", found)
    return place, False

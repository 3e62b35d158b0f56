"""A release no manifest pins, judged per patch against the pins of the nearest pinned one
(`declaration/manifest.py: nearest_release`): what its records say.

The comparison is verify.py's, unchanged: the same places compared with the same fields of their pins (signature,
decorator layers, copied-body and value digests, declared copies, `uses`, the call convention), so a patch applies
here exactly when it would under a manifest `pin` wrote for this release from the same source. Only the words
differ: an applied patch says which release's pins it was verified against (`status` lists it as a warning, never
as a silent OK), and a refusal says which pins the difference is from."""

from __future__ import annotations

import msgspec

from vllm_patchkit.upstream.findings import Finding

#: the record's `detail` key for a patch verified against another release's pins (reporting/verdict.py reads it)
VERIFIED_AGAINST = "verified_against"


def verified_words(pins_of: str, running: str) -> str:
    return f"the pins of {pins_of} on {running}"


def mark_verified(detail: dict, pins_of: str, running: str) -> None:
    detail[VERIFIED_AGAINST] = verified_words(pins_of, running)


def judged(finding: Finding, pins_of: str, running: str) -> Finding:
    """A difference found against the nearest release's pins, saying whose pins they are."""
    return msgspec.structs.replace(finding, reason=f"{finding.reason} (judged against the pins of {pins_of}, the "
                                                   f"nearest pinned release: no manifest pins vLLM {running})")


def without_calls(entry):
    """The entry with no pinned facts of vLLM's calls (`call_positional`, `call_keywords`): read from the nearest
    release's source, they say nothing of the calls this one makes, which no live fingerprint shows; so every call
    the pinned signature admits is judged here, as a manifest without them would have it."""
    if entry is None or not any(p.call_positional is not None for p in entry.targets.values()):
        return entry
    targets = {k: msgspec.structs.replace(p, call_positional=None, call_keywords=None) for k, p in entry.targets.items()}
    return msgspec.structs.replace(entry, targets=targets)

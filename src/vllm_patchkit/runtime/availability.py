"""Availability: whether a patch can be applied on this release, and what to say when a needed one cannot.

The loader asks "is it needed here?" first (process, preconditions) and only
then "can it be applied?". A patch the manifest does not offer for this
release is *unavailable*; that is harmless for a model that does not need it
and a refusal for one that needs it (see docs/troubleshooting.md).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple, Optional

from vllm_patchkit.declaration.preconditions import version_matches


log = logging.getLogger("vllm.patchkit")

ALLOW_ENV = "VLLM_PATCHKIT_ALLOW_UNPATCHED"


class Unavailable(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """Why the manifest offers no entry for a patch on this release."""

    code: str  # not_applicable | no_manifest | not_listed
    reason: str


def unavailable(patch_id: str, manifest, manifest_path: Optional[str], manifest_note: str,
                vllm_version: str, pins_of: Optional[str] = None) -> Unavailable:
    """The manifest's answer for a patch it does not list (`pins_of`: the nearest pinned release standing in for
    this one, whose manifest it is)."""
    if manifest is None:  # the note's first clause; the process record carries the whole note once
        return Unavailable("no_manifest", manifest_note.split(";")[0])
    nearest = f" (the nearest pinned release: no manifest pins vLLM {vllm_version})" if pins_of else ""
    for na in manifest.not_applicable:
        if na.patch == patch_id:
            return Unavailable("not_applicable", f"not applicable on vLLM {pins_of or vllm_version}{nearest}: {na.reason}")
    return Unavailable("not_listed", f"not listed in {Path(manifest_path or '?').name}{nearest}")


def planned_version(versions: list, entry, running: str, manifest_path: Optional[str]) -> tuple:
    """(the patch version to plan, its manifest entry or None, an Unavailable or None), `versions` oldest first.

    The listed version, unless its own `when.vllm` excludes the running release while another version admits it:
    that one is the version needed here, and it has no pin (a release judged against the nearest release's pins,
    or an optional patch a manifest lists against its own range). Taking the listed one would skip the patch as
    "not needed" without a word."""
    fitting = [p for p in versions if version_matches(p.when, running)]
    if entry is None:
        return (fitting or versions)[-1], None, None
    listed = next(p for p in versions if p.key == entry.patch)
    if not fitting or version_matches(listed.when, running):
        return listed, entry, None
    best = fitting[-1]
    return best, None, Unavailable("not_listed", f"{Path(manifest_path or '?').name} lists {listed.key}, whose "
                                                 f"when.vllm {listed.when.vllm!r} excludes vLLM {running}; {best.key} "
                                                 "is the version for it and is not listed there")


def allowed_unpatched(patch_id: str) -> bool:
    """Whether the operator accepted serving without this patch ($VLLM_PATCHKIT_ALLOW_UNPATCHED)."""
    raw = os.environ.get(ALLOW_ENV, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    return "all" in names or patch_id in names


def refusal_message(key: str, vllm_version: str, why_needed: str, why_not: str, remedy: str) -> str:
    return (f"vllm-patchkit: required patch {key} is needed here but cannot be applied on vLLM {vllm_version}: "
            f"{why_not}. It is needed because {why_needed}. {remedy} vLLM start-up stopped; "
            "`vllm-patchkit status` shows this run.")

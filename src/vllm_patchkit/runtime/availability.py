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


log = logging.getLogger("vllm.patchkit")

ALLOW_ENV = "VLLM_PATCHKIT_ALLOW_UNPATCHED"


class Unavailable(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """Why the manifest offers no entry for a patch on this release."""

    code: str  # not_applicable | no_manifest | not_listed
    reason: str


def unavailable(pid: str, manifest, manifest_path: Optional[str], manifest_note: str,
                vllm_version: str) -> Unavailable:
    """The manifest's answer for a patch it does not list."""
    if manifest is None:  # the note's first clause; the process record carries the whole note once
        return Unavailable("no_manifest", manifest_note.split(";")[0])
    for na in manifest.not_applicable:
        if na.patch == pid:
            return Unavailable("not_applicable", f"not applicable on vLLM {vllm_version}: {na.reason}")
    return Unavailable("not_listed", f"not listed in {Path(manifest_path or '?').name}")


def allowed_unpatched(pid: str) -> bool:
    """Whether the operator accepted serving without this patch ($VLLM_PATCHKIT_ALLOW_UNPATCHED)."""
    raw = os.environ.get(ALLOW_ENV, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    return "all" in names or pid in names


def refusal_message(key: str, vllm_version: str, why_needed: str, why_not: str, remedy: str) -> str:
    return (f"vllm-patchkit: required patch {key} is needed here but cannot be applied on vLLM {vllm_version}: "
            f"{why_not}. It is needed because {why_needed}. {remedy} vLLM start-up stopped; "
            "`vllm-patchkit status` shows this run.")

# DO NOT EDIT: generated from declaration/validation.py by `vllm-patchkit schema` (tools/schema_objects.py).
"""A manifest as every process reads it: which patch versions apply to one vLLM release and the pins (fingerprints)
each was checked against (validation.py says what each field may hold and why).
"""

from __future__ import annotations

from typing import Literal, Optional

from msgspec import field

from vllm_patchkit.declaration.vocabulary import Declared


class Fingerprint(Declared, frozen=True, kw_only=True):
    """What a target looked like when pinned: enough to notice an upstream change."""

    kind: Literal["function", "method", "staticmethod", "classmethod", "class", "attribute", "absent", "instance_attribute"]
    signature: Optional[str] = None
    return_shape: Optional[str] = None
    source_digest: Optional[str] = None
    wrappers: list[str] = field(default_factory=list)
    value_digest: Optional[str] = None
    part_digest: Optional[str] = None
    call_positional: Optional[int] = None
    call_keywords: Optional[list[str]] = None
    entry_present: Optional[bool] = None


class ReachPin(Declared, frozen=True, kw_only=True):
    """A name of vLLM the implementation reaches once it runs (read statically at pin: upstream/reach.py)."""

    kind: Literal["import", "attribute", "method", "provide"]
    defined: Optional[str] = None


class ManifestEntry(Declared, frozen=True, kw_only=True):
    patch: str
    targets: dict[str, Fingerprint] = field(default_factory=dict)
    reach: dict[str, ReachPin] = field(default_factory=dict)


class NotApplicable(Declared, frozen=True, kw_only=True):
    patch: str
    reason: str


class Manifest(Declared, frozen=True, kw_only=True):
    """Which patch versions apply to one vLLM release, and the pins they were checked against."""

    vllm: str
    generated_by: str
    patches: list[ManifestEntry]
    not_applicable: list[NotApplicable] = field(default_factory=list)


__all__ = ["Fingerprint", "Manifest", "ManifestEntry", "NotApplicable", "ReachPin"]

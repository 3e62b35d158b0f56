"""A manifest as every process reads it: which patch versions apply to one vLLM release, and the pins
(fingerprints) each was checked against. Its validating schema (constraints, texts) is `validation.py`; these are
msgspec Structs with the same fields, like the patch (schema.py says why)."""

from __future__ import annotations

from typing import Literal, Optional

from msgspec import field

from vllm_patchkit.declaration.schema import Declared


class Fingerprint(Declared, frozen=True, kw_only=True):
    """What a target looked like when pinned: enough to notice an upstream change."""

    kind: Literal["function", "method", "staticmethod", "classmethod", "class", "attribute", "absent",
                  "instance_attribute"]
    signature: Optional[str] = None
    source_digest: Optional[str] = None
    wrappers: list[str] = field(default_factory=list)
    value_digest: Optional[str] = None
    part_digest: Optional[str] = None  # the statements `copied_part` names (upstream/copied_part.py)


class ReachPin(Declared, frozen=True, kw_only=True):
    """A name of vLLM the implementation reaches once it runs (`upstream/reach.py`), as the release pinned defines
    it: names only, so the loader checks it without reading any source."""

    kind: Literal["import", "attribute", "method", "provide"]  # provide: a `set`'s class sets it (reach_provide)
    defined: Optional[str] = None  # how vLLM defined it when pinned: method, property, instance_attribute, ...


class ManifestEntry(Declared, frozen=True, kw_only=True):
    patch: str
    targets: dict[str, Fingerprint] = field(default_factory=dict)
    reach: dict[str, ReachPin] = field(default_factory=dict)  # `module:Class.name` / `module:name` -> how


class NotApplicable(Declared, frozen=True, kw_only=True):
    patch: str
    reason: str


class Manifest(Declared, frozen=True, kw_only=True):
    """Which patch versions apply to one vLLM release, and the pins they were checked against."""

    vllm: str
    generated_by: str
    patches: list[ManifestEntry]
    not_applicable: list[NotApplicable] = field(default_factory=list)

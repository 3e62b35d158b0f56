"""A manifest: which patch versions apply to one vLLM release, and the pins (fingerprints) each was checked
against. Strict like the patch schema: an unknown key is a typo, not an ignored field."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, field_validator

from vllm_patchkit.declaration.schema import PATCH_ID, TARGET, Strict


class Fingerprint(Strict):
    """What a target looked like when pinned: enough to notice an upstream change."""

    kind: Literal["function", "method", "staticmethod", "classmethod", "class", "attribute", "absent",
                  "instance_attribute"] = Field(
        description="what is at the place; `absent`: the class does not define the attribute itself (a set with "
                    "`inherited_from`); `instance_attribute`: no class attribute, but the class's methods (or its "
                    "bases' in the release) assign `self.attr` (a set with `instances: true`)")
    signature: Optional[str] = None
    source_digest: Optional[str] = None
    wrappers: list[str] = Field(
        default_factory=list, description="upstream decorator layers (`__wrapped__`) above the function"
    )
    value_digest: Optional[str] = Field(
        default=None,
        description="digest of a non-callable attribute's value when it is a simple literal (int, float, str, "
                    "bytes, bool, None, and tuples, frozensets and dicts of those); absent: the value is not pinned",
    )


class ManifestEntry(Strict):
    patch: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*@[0-9]+$", description="id@version")]
    targets: dict[Annotated[str, Field(pattern=TARGET)], Fingerprint] = Field(default_factory=dict)


class NotApplicable(Strict):
    patch: Annotated[str, Field(pattern=PATCH_ID)]
    reason: Annotated[str, Field(min_length=1)]


class Manifest(Strict):
    """Which patch versions apply to one vLLM release, and the pins they were checked against."""

    vllm: Annotated[str, Field(min_length=1)]
    generated_by: Annotated[str, Field(min_length=1)]
    patches: list[ManifestEntry]
    not_applicable: list[NotApplicable] = Field(default_factory=list)

    @field_validator("vllm")
    @classmethod
    def _version(cls, v: str) -> str:
        from packaging.version import InvalidVersion, Version

        try:
            Version(v)
        except InvalidVersion:
            raise ValueError(f"not a release version: {v!r}") from None
        return v

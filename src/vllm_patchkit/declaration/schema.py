# DO NOT EDIT: generated from declaration/validation.py by `vllm-patchkit schema` (tools/schema_objects.py).
"""The patch as every process reads it: its fields, their types and defaults (the validating models in validation.py
say what each may hold and why; readings.py what is derived from them).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from msgspec import field

from vllm_patchkit.declaration.readings import PatchReading, WhenReading
from vllm_patchkit.declaration.vocabulary import Declared, Frequency, Kind, Role


class When(WhenReading, Declared, frozen=True, kw_only=True):
    """Preconditions. All given ones must hold; an absent one is not checked."""

    vllm: Optional[str] = None
    platform: Optional[list[Literal["cuda", "rocm", "cpu", "xpu", "tpu"]]] = None
    env: Optional[dict[str, Optional[str]]] = None
    architectures: Optional[list[str]] = None
    served_by: Optional[str] = None
    runner: Optional[Literal["v1", "v2"]] = None
    prefix_caching: Optional[bool] = None
    speculative: Optional[bool] = None
    cudagraph_mode: Optional[list[str]] = None


class EnvVar(Declared, frozen=True, kw_only=True):
    """An environment variable a patch reads; registered with vLLM and documented."""

    name: str
    default: Optional[str] = None
    doc: str


class EnvDefault(Declared, frozen=True, kw_only=True):
    name: str
    value: str


class RetireWhen(Declared, frozen=True, kw_only=True):
    """When the patch can go: a vLLM release range, a probe, or a stated reason."""

    vllm: Optional[str] = None
    probe: Optional[str] = None
    manual: Optional[str] = None


class Patch(PatchReading, Declared, frozen=True, kw_only=True):
    """One intervention on vLLM, at one version."""

    id: str
    version: int
    summary: str
    feature: Optional[str] = None
    why: Optional[str] = None
    upstream: Optional[str] = None
    retire_when: Optional[RetireWhen] = None
    kind: Kind
    target: Optional[str] = None
    copies: list[str] = field(default_factory=list)
    uses: list[str] = field(default_factory=list)
    reimplements: Optional[list[str]] = None
    copied_part: dict[str, list[str]] = field(default_factory=dict)
    implementation: Optional[str] = None
    params: list[str] = field(default_factory=list)
    value: Any = None
    instances: bool = False
    inherited_from: Optional[str] = None
    adds: bool = False
    entry: Optional[str] = None
    value_from: Optional[str] = None
    config_field: Optional[str] = None
    overrides: list[str] = field(default_factory=list)
    env_default: Optional[EnvDefault] = None
    message: Optional[str] = None
    processes: list[Role]
    when: When = field(default_factory=When)
    requires: list[str] = field(default_factory=list)
    required: bool
    env_vars: list[EnvVar] = field(default_factory=list)
    reads_env: list[str] = field(default_factory=list)
    expected_calls: Frequency = Frequency.never_counted
    count_calls: bool = True
    counts_steps: bool = False
    config_ready: bool = False
    observer: bool = False
    draft: bool = False


__all__ = ["EnvDefault", "EnvVar", "Patch", "RetireWhen", "When"]

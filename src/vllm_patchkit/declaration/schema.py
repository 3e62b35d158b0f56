"""The patch as every process reads it: its fields, their types and defaults, and what is derived from them.

What a patch YAML file may say (each field's constraints, its text, the rules across fields) is the validating
schema, `validation.py`, read only when a file is read. A file is validated there and handed on as these
objects; every vLLM process after the first reads them back from the start-up cache (`cache_models`). They are
msgspec Structs, not pydantic models: a process served from the cache makes these classes in ~0.1 ms, where
pydantic's models cost ~6 ms to define (issue 23's start-up budget). Both sides declare the same fields in the
same order (`tests/framework/test_schema_agreement.py` fails on any difference); the manifests' pins: pins.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, Literal, Optional

from msgspec import Struct, field

from vllm_patchkit.declaration.kinds import DECLARATIONS, declaration_of

PATCH_ID = r"^[a-z0-9][a-z0-9._-]*$"
TARGET = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
CONFIG_FIELD = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


#: How a patch changes vLLM: one member per row of declaration/kinds.py (its declarative part).
Kind = Enum("Kind", [(d.name, d.name) for d in DECLARATIONS], type=str, module=__name__)
Kind.__doc__ = "How a patch changes vLLM (declaration/kinds.py: what each kind needs and takes)."


class Process(str, Enum):
    """vLLM's process roles; the plugin entry point runs once in each."""

    frontend = "frontend"  # API server / LLM() process, before VllmConfig exists
    engine_core = "engine_core"
    worker = "worker"
    inspect = "inspect"  # vLLM's short-lived model-inspection subprocess


class Frequency(str, Enum):
    """How often a patched callable is expected to run (for inert detection)."""

    per_step = "per_step"
    per_request = "per_request"
    at_startup = "at_startup"
    rare = "rare"
    never_counted = "never_counted"


class Declared(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: immutable, every field by name, an unknown key refused when read back."""


# -- what is derived: shared by these objects and the validating models (validation.py) --------------
class WhenReading:
    __slots__ = ()
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = (
        "architectures",
        "served_by",
        "runner",
        "prefix_caching",
        "speculative",
        "cudagraph_mode",
    )

    def needs_config(self) -> bool:
        return any(getattr(self, name) is not None for name in self.CONFIG_FIELDS)


class PatchReading:
    __slots__ = ()

    @property
    def pinned_specs(self) -> list[str]:
        """Every upstream place the manifest pins for this patch: target, copies, uses, (kind subclass) each
        overridden base method as `target.method`, and (kind set) the base attribute named in `inherited_from`."""
        specs = (([self.target] if self.target else []) + list(self.copies) + list(self.uses)
                 + [f"{self.target}.{m}" for m in self.overrides] + list(self.reimplements or ())
                 + ([self.inherited_from] if self.inherited_from else []))
        return list(dict.fromkeys(specs))

    @property
    def source_pinned_specs(self) -> frozenset[str]:
        """The places pinned with their source digest: what the implementation copies (`reimplements`; unset, a
        replace copies its target)."""
        if self.reimplements is None:
            return frozenset([self.target] if declaration_of(self.kind).pins_source and self.target else [])
        return frozenset(self.reimplements)

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    @property
    def stage(self) -> str:
        """'import' if every precondition can be judged at plugin load, else 'config'.

        A subclass is always config-stage: the field that selects it lives on the VllmConfig."""
        return "config" if self.when.needs_config() or declaration_of(self.kind).selects_class else "import"


# -- the objects (field texts and constraints: validation.py) -------------------------------------
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
    value_from: Optional[str] = None
    config_field: Optional[str] = None
    overrides: list[str] = field(default_factory=list)
    env_default: Optional[EnvDefault] = None
    message: Optional[str] = None
    processes: list[Process]
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
    draft: bool = False  # scan --write's marker: unreviewed; refused by the loader, pin and check


__all__ = [
    "EnvVar",
    "Frequency",
    "Kind",
    "Patch",
    "Process",
    "When",
]

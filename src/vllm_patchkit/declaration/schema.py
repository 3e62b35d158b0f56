"""The patch schema: what a patch YAML file may say, and nothing else (manifests: pins.py; features: features.py).

Strict on purpose: an unknown key or a wrong type is a typo that would otherwise
turn into a patch that silently does nothing.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vllm_patchkit.declaration.kinds import DECLARATIONS, declaration_of, problems

PATCH_ID = r"^[a-z0-9][a-z0-9._-]*$"
TARGET = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
CONFIG_FIELD = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class Strict(BaseModel):
    """Base: unknown keys rejected, no silent coercion of types."""

    # defer_build: validators are built on first use, not at import (start-up reads the set from its cache)
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


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


def _check_specifier(value: str) -> str:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # validation only: the cold path

    if not value.strip(" ,\t"):
        raise ValueError(f"empty version specifier {value!r} would match every release; write one, e.g. '>=0.31'")
    try:
        SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ValueError(f"not a PEP 440 version specifier: {value!r} ({exc})") from None
    return value


VersionSpec = Annotated[str, Field(min_length=1)]


class When(Strict):
    """Preconditions. All given ones must hold; an absent one is not checked.

    `vllm`, `platform`, `env` can be judged at import; the rest need the
    VllmConfig of the process and are judged at its config-ready point.
    """

    vllm: Optional[VersionSpec] = None
    platform: Optional[list[Literal["cuda", "rocm", "cpu", "xpu", "tpu"]]] = None
    env: Optional[dict[Annotated[str, Field(pattern=ENV_NAME)], Optional[str]]] = Field(
        default=None,
        description="name -> required value; null means the variable must be unset",
    )
    architectures: Optional[list[Annotated[str, Field(min_length=1)]]] = Field(
        default=None, description="exact architecture names (any of); never substrings"
    )
    served_by: Optional[str] = Field(
        default=None,
        description="'out_of_tree', 'vllm', or a module prefix the registry must resolve to",
    )
    runner: Optional[Literal["v1", "v2"]] = None
    prefix_caching: Optional[bool] = None
    speculative: Optional[bool] = None
    cudagraph_mode: Optional[list[str]] = None

    _vllm_check = field_validator("vllm")(lambda cls, v: v if v is None else _check_specifier(v))

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


class EnvVar(Strict):
    """An environment variable a patch reads; registered with vLLM and documented."""

    name: Annotated[str, Field(pattern=ENV_NAME)]
    default: Optional[str] = None
    doc: Annotated[str, Field(min_length=1)]


class EnvDefault(Strict):
    name: Annotated[str, Field(pattern=ENV_NAME)]
    value: str


class RetireWhen(Strict):
    """When the patch can go: a vLLM release range, a probe, or a stated reason."""

    vllm: Optional[VersionSpec] = None
    probe: Optional[Annotated[str, Field(pattern=TARGET)]] = None
    manual: Optional[Annotated[str, Field(min_length=1)]] = None

    _vllm_check = field_validator("vllm")(lambda cls, v: v if v is None else _check_specifier(v))

    @model_validator(mode="after")
    def _exactly_one(self) -> "RetireWhen":
        given = [k for k in ("vllm", "probe", "manual") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of vllm, probe, manual (got {given or 'none'})")
        return self


class Patch(Strict):
    """One intervention on vLLM, at one version."""

    id: Annotated[str, Field(pattern=PATCH_ID)]
    version: Annotated[int, Field(ge=1)]
    summary: Annotated[str, Field(min_length=1)]
    feature: Optional[Annotated[str, Field(pattern=PATCH_ID)]] = Field(
        default=None,
        description="the feature this patch belongs to (its set's features/<id>.yaml): the feature declares "
                    "`upstream`, `retire_when`, shared env vars and (unless the patch says its own) `why` once")
    why: Optional[Annotated[str, Field(min_length=1)]] = None
    upstream: Optional[Annotated[str, Field(min_length=1, description="issue/PR reference, or 'none: reason'")]] = None
    retire_when: Optional[RetireWhen] = None
    kind: Annotated[Kind, Field(strict=False)]
    target: Optional[Annotated[str, Field(pattern=TARGET)]] = Field(
        default=None,
        description="module:Qualname of the object patched (or, for env_default/refuse, the upstream code it steers)",
    )
    copies: list[Annotated[str, Field(pattern=TARGET)]] = Field(
        default_factory=list, description="other module:name places holding the target by value"
    )
    uses: list[Annotated[str, Field(pattern=TARGET)]] = Field(
        default_factory=list,
        description="upstream callables the implementation calls but does not patch; pinned and verified like targets",
    )
    reimplements: Optional[list[Annotated[str, Field(pattern=TARGET)]]] = Field(
        default=None,
        description="upstream bodies the implementation copies or re-implements instead of calling them (a replace's "
                    "original, a wrap that never calls `wrapped`, a subclass override that never calls super()): each "
                    "is pinned with its normalised source digest, and any change to it is `source_changed` (breaking). "
                    "Unset: a replace copies its target, other kinds copy nothing; `[]`: a replace that calls the "
                    "original instead of copying it",
    )
    implementation: Optional[Annotated[str, Field(pattern=TARGET)]] = None
    params: list[Annotated[str, Field(pattern=IDENTIFIER)]] = Field(
        default_factory=list,
        description="kind wrap with an implementation: the target parameters it reads or rewrites (by name; "
                    "ctx.arg/ctx.with_arg reach only these); verified against the target's pinned signature",
    )
    value: Any = None
    instances: bool = Field(
        default=False,
        description="kind wrap of a method: patch it on each instance as the instance is constructed (objects vLLM "
                    "creates at run time: a connector, a KV-cache manager), not on the class; a subclass's override "
                    "is wrapped too. Kind set of `module:Class.attr`: an attribute vLLM's methods assign on each "
                    "object (`self.attr = ...`), set to `value`/`value_from` on each new object after its __init__",
    )
    inherited_from: Optional[Annotated[str, Field(pattern=TARGET)]] = Field(
        default=None,
        description="kind set of `module:Sub.attr` that Sub only inherits: `module:Base.attr`, the base's definition "
                    "the MRO finds. The patch sets the attribute on Sub alone (an override; unpatch deletes it, and Sub "
                    "inherits again); the base's attribute is pinned, and Sub is pinned as not defining it",
    )
    value_from: Optional[Annotated[str, Field(pattern=TARGET)]] = Field(
        default=None,
        description="kind set: `module:attr` of an importable object to set (a class, a function, an instance), "
                    "resolved when the patch is verified; instead of a literal `value`",
    )
    config_field: Optional[Annotated[str, Field(pattern=CONFIG_FIELD)]] = Field(
        default=None,
        description="kind subclass: the VllmConfig field (dotted path, e.g. scheduler_config.scheduler_cls) through "
                    "which vLLM selects the class; set to the implementation at the config stage",
    )
    overrides: list[Annotated[str, Field(pattern=IDENTIFIER)]] = Field(
        default_factory=list,
        description="kind subclass: the target class's methods the implementation overrides; each is pinned as "
                    "`target.method` and the override must take the pinned signature",
    )
    env_default: Optional[EnvDefault] = None
    message: Optional[str] = None
    processes: Annotated[list[Annotated[Process, Field(strict=False)]], Field(min_length=1)]
    when: When = Field(default_factory=When)
    requires: list[Annotated[str, Field(pattern=PATCH_ID)]] = Field(default_factory=list)
    required: bool
    env_vars: list[EnvVar] = Field(
        default_factory=list,
        description="environment variables the patch declares (name, default, doc): each is declared once in the "
                    "whole set, with one text; a variable its feature declares comes with the feature")
    reads_env: list[Annotated[str, Field(pattern=ENV_NAME)]] = Field(
        default_factory=list,
        description="environment variables declared elsewhere in the set (another patch, another feature) that "
                    "this patch reads too, by name")
    expected_calls: Annotated[Frequency, Field(strict=False)] = Frequency.never_counted
    count_calls: bool = True
    counts_steps: bool = Field(
        default=False, description="this patch's calls are the process's engine/worker step count (core patches)"
    )
    config_ready: bool = Field(
        default=False,
        description="this hook is its process's config-ready point: every config-stage patch of that process "
                    "depends on it implicitly (nobody writes `requires` for it)",
    )
    observer: bool = Field(
        default=False,
        description="a pure counted forwarder the framework needs to learn what a model needs (config-ready points, "
                    "step counters): applied unpinned, and marked so, where no manifest entry exists but its target does",
    )

    @model_validator(mode="after")
    def _feature_fields(self) -> "Patch":
        """`upstream` and `retire_when` are the feature's when there is one (said once), else the patch's own."""
        if self.feature is None:
            missing = [f for f in ("why", "upstream", "retire_when") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"missing {', '.join(missing)} (required unless the patch names its `feature`, "
                                 "which declares them once)")
        else:
            repeated = [f for f in ("upstream", "retire_when") if getattr(self, f) is not None]
            if repeated:
                raise ValueError(f"{', '.join(repeated)}: declared by feature {self.feature!r}; a patch of a feature "
                                 "does not repeat it (remove it here)")
        return self

    @model_validator(mode="after")
    def _kind_fields(self) -> "Patch":
        k, row = self.kind, declaration_of(self.kind)
        # fields with their own words first (what they are for, beyond which kind takes them)
        if self.instances and (not (row.call_shape == "wrap" or row.sets_value) or self.target is None
                               or "." not in self.target.partition(":")[2]):
            raise ValueError("'instances: true' is for kind wrap of a method (target module:Class.method) or kind set "
                             "of an attribute of each object (target module:Class.attr)")
        if self.inherited_from is not None:
            self._check_inherited_from()
        if self.params and (row.call_shape != "wrap" or self.implementation is None):
            raise ValueError("'params' is only for kind wrap with an implementation (the parameters it reads)")
        if self.observer and (row.call_shape != "wrap" or self.when.needs_config() or self.when.vllm is not None):
            raise ValueError("'observer: true' is only for a wrap with no config-time or vllm preconditions "
                             "(it runs before anything about the model is known)")
        found = problems(k.value, {f: getattr(self, f) for f in self.model_fields})
        if found:
            raise ValueError("; ".join(found))
        if row.selects_class:
            if "." in self.target.partition(":")[2]:
                raise ValueError(f"kind 'subclass' needs 'target' to name a class (module:Class), not a member: "
                                 f"{self.target!r}")
            if len(set(self.overrides)) != len(self.overrides):
                raise ValueError(f"'overrides' names a method twice: {self.overrides}")
        if self.value is not None and self.value_from is not None:
            raise ValueError("give 'value' or 'value_from', not both")
        if len(set(self.params)) != len(self.params):
            raise ValueError(f"'params' names a parameter twice: {self.params}")
        if self.reimplements and len(set(self.reimplements)) != len(self.reimplements):
            raise ValueError(f"'reimplements' names a place twice: {self.reimplements}")
        if self.id in self.requires:
            raise ValueError("a patch cannot require itself")
        return self

    def _check_inherited_from(self) -> None:
        """`inherited_from`: kind set, no `instances`, the same attribute name on another class."""
        if not declaration_of(self.kind).sets_value:
            raise ValueError(f"'inherited_from' is only for kind set (an inherited class attribute overridden on one "
                             f"subclass), not {self.kind.value!r}")
        if self.instances:
            raise ValueError("give 'instances: true' (an attribute of each object) or 'inherited_from' (a class "
                             "attribute overridden on one subclass), not both")
        sub, base = self.target.partition(":")[2], self.inherited_from.partition(":")[2]
        if "." not in sub:
            raise ValueError(f"'inherited_from' needs 'target' to name a class attribute (module:Sub.attr), not "
                             f"{self.target!r}")
        if "." not in base or base.rpartition(".")[2] != sub.rpartition(".")[2]:
            raise ValueError(f"'inherited_from' must name the same attribute on a base class "
                             f"(module:Base.{sub.rpartition('.')[2]}), not {self.inherited_from!r}")
        if self.inherited_from == self.target:
            raise ValueError("'inherited_from' names the target itself: give the base class that defines the attribute")

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


__all__ = [
    "EnvVar",
    "Frequency",
    "Kind",
    "Patch",
    "Process",
    "When",
]

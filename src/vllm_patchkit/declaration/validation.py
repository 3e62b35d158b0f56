"""The validating schema: what a patch or manifest YAML file may say, and nothing else (features: features.py).

The one source of a declaration's fields: the objects every process reads (schema.py, pins.py) are generated
from these models by `vllm-patchkit schema` (tools/schema_objects.py).

Strict on purpose: an unknown key or a wrong type is a typo that would otherwise turn into a patch that silently
does nothing. Read only when a file is read (the cold path): a valid file is handed on as the objects every
process reads (`to_object`); a process served from the start-up cache never imports pydantic's models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import msgspec
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from vllm_patchkit.declaration import pins, schema
from vllm_patchkit.declaration.set_members import check_adds, check_inherited_from
from vllm_patchkit.declaration.kinds import declaration_of, problems
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.precondition_table import PRECONDITIONS
from vllm_patchkit.declaration.readings import PatchReading, WhenReading
from vllm_patchkit.declaration.vocabulary import (CONFIG_FIELD, ENV_NAME, IDENTIFIER, PATCH_ID, TARGET, Frequency, Kind,
                                                  Role)


class Strict(BaseModel):
    """Base: unknown keys rejected, no silent coercion of types."""

    # defer_build: validators are built on first use, not at import
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


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


def _when_model() -> type[BaseModel]:
    """`When` built from the preconditions' table (declaration/precondition_table.py): one field per row, in its
    order, with the row's type and text."""
    fields = {row.name: (row.annotation, Field(default=None, description=row.description))
              for row in PRECONDITIONS}
    return create_model(
        "When", __base__=(WhenReading, Strict), __module__=__name__,
        __doc__="""Preconditions. All given ones must hold; an absent one is not checked.

    `vllm`, `platform`, `env` can be judged at import; the rest need the
    VllmConfig of the process and are judged at its config-ready point.
    """,
        __validators__={"_vllm_check": field_validator("vllm")(
            lambda cls, v: v if v is None else _check_specifier(v))},
        **fields)


When = _when_model()


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


class Patch(PatchReading, Strict):
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
    copied_part: dict[Annotated[str, Field(pattern=TARGET)], list[str]] = Field(
        default_factory=dict,
        description="for an entry of `reimplements` of which the implementation copies only a part (a branch, a "
                    "prefix): the copied statements, each by its first line as `ast.unparse` writes it (one statement "
                    "of the body each, at any depth). Their digest is pinned too; a body that changed only outside "
                    "them is compatible",
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
    adds: bool = Field(
        default=False,
        description="kind set of `module:Class.name` that vLLM does not define (nor inherit): the plugin adds it (an "
                    "RPC method on a worker class, a helper, a marker attribute). Pinned as absent; a release that "
                    "starts defining the name is a collision (`check`: name_collision; the loader refuses it)",
    )
    entry: Optional[Annotated[str, Field(min_length=1)]] = Field(
        default=None,
        description="kind register: the key of the entry the patch sets in the mapping at `target` (a registry vLLM "
                    "looks keys up in: hf model_type -> convertor class). Pinned is whether vLLM registers the key "
                    "itself: with `adds: true` it must not (a release that starts to is a collision); without, the "
                    "patch replaces vLLM's own entry (a string key)",
    )
    value_from: Optional[Annotated[str, Field(pattern=TARGET)]] = Field(
        default=None,
        description="kind set or register: `module:attr` of an importable object to set (a class, a function, an instance), "
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
    processes: Annotated[list[Annotated[Role, Field(strict=False)]], Field(min_length=1)]
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
    draft: bool = Field(
        default=False,
        description="written by `vllm-patchkit scan --write`: a draft nobody has reviewed yet. The loader refuses "
                    "to load it, `pin` and `check` exit 1 naming the file, until a person reviews the patch and "
                    "deletes this line (docs/adopting.md)",
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
        if self.instances and (not (row.wraps_original or row.sets_value) or self.target is None
                               or not Target.parse(self.target).is_member):
            raise ValueError("'instances: true' is for kind wrap of a method (target module:Class.method) or kind set "
                             "of an attribute of each object (target module:Class.attr)")
        if self.inherited_from is not None:
            check_inherited_from(self)
        if self.adds:
            check_adds(self)
        if self.params and (not row.wraps_original or self.implementation is None):
            raise ValueError("'params' is only for kind wrap with an implementation (the parameters it reads)")
        if self.observer and (not row.wraps_original or self.when.needs_config() or self.when.vllm is not None):
            raise ValueError("'observer: true' is only for a wrap with no config-time or vllm preconditions "
                             "(it runs before anything about the model is known)")
        found = problems(k.value, {f: getattr(self, f) for f in type(self).model_fields})
        if found:
            raise ValueError("; ".join(found))
        if row.judges_overrides:
            if Target.parse(self.target).is_member:
                raise ValueError(f"kind {k.value!r} needs 'target' to name a class (module:Class), not a member: "
                                 f"{self.target!r}")
            if len(set(self.overrides)) != len(self.overrides):
                raise ValueError(f"'overrides' names a method twice: {self.overrides}")
        if self.value is not None and self.value_from is not None:
            raise ValueError("give 'value' or 'value_from', not both")
        if row.sets_entry and self.value is None and self.value_from is None:
            raise ValueError(f"kind {k.value!r} needs 'value' or 'value_from' (what the entry {self.entry!r} is set to)")
        if len(set(self.params)) != len(self.params):
            raise ValueError(f"'params' names a parameter twice: {self.params}")
        stray = sorted(set(self.copied_part) - set(self.reimplements or ()))
        if stray:
            raise ValueError(f"'copied_part' names {', '.join(stray)}, not in 'reimplements': a part is of a body the "
                             "implementation copies")
        empty = sorted(k for k, v in self.copied_part.items() if not v or not all(a.strip() for a in v))
        if empty:
            raise ValueError(f"'copied_part' of {', '.join(empty)}: give one or more statements (their first lines)")
        if self.reimplements and len(set(self.reimplements)) != len(self.reimplements):
            raise ValueError(f"'reimplements' names a place twice: {self.reimplements}")
        if self.id in self.requires:
            raise ValueError("a patch cannot require itself")
        return self

# -- manifests (pins.py) ---------------------------------------------------------------------------
class Fingerprint(Strict):
    """What a target looked like when pinned: enough to notice an upstream change."""

    kind: Literal["function", "method", "staticmethod", "classmethod", "class", "attribute", "absent",
                  "instance_attribute"] = Field(
        description="what is at the place; `absent`: the class does not define the attribute itself (a set with "
                    "`inherited_from`; with `adds`, nor any base); `instance_attribute`: no class attribute, but the class's methods (or its "
                    "bases' in the release) assign `self.attr` (a set with `instances: true`)")
    signature: Optional[str] = None
    return_shape: Optional[Annotated[str, Field(pattern=r"^tuple\[[0-9]+\]$")]] = Field(
        default=None,
        description="what a call returns, read from the def's own `return` statements: `tuple[N]` when every one "
                    "returns a tuple literal of N elements (and the body cannot end without one); absent: not read "
                    "(another value, tuples of several lengths, a generator), never guessed",
    )
    source_digest: Optional[str] = None
    wrappers: list[str] = Field(
        default_factory=list, description="upstream decorator layers (`__wrapped__`) above the function"
    )
    value_digest: Optional[str] = Field(
        default=None,
        description="digest of a non-callable attribute's value when it is a simple literal (int, float, str, "
                    "bytes, bool, None, and tuples, frozensets and dicts of those); absent: the value is not pinned",
    )
    part_digest: Optional[str] = Field(
        default=None,
        description="digest of the statements the patch's `copied_part` names in this body (normalised AST)",
    )
    call_positional: Optional[int] = Field(
        default=None,
        description="a replaced target or an overridden base method: the most positional arguments any call vLLM's "
                    "source makes to it passes (a bound self/cls not counted), read by name (`tools/static_calls.py`); "
                    "absent: not read (a call spreads *args/**kwargs, the name escapes as a value), and every call "
                    "its signature admits is judged")
    call_keywords: Optional[list[str]] = Field(
        default=None, description="with `call_positional`: every keyword those calls pass")
    entry_present: Optional[bool] = Field(
        default=None,
        description="kind register: whether vLLM itself registers the patch's `entry` in the mapping at this place "
                    "(false with `adds`: a release that starts registering it is a collision; true: the patch "
                    "replaces vLLM's entry, and a release without it is `entry_gone`)",
    )


class ReachPin(Strict):
    """A name of vLLM the implementation reaches once it runs (read statically at pin: upstream/reach.py)."""

    kind: Literal["import", "attribute", "method", "provide"] = Field(
        description="`import`: a name the implementation's module imports from vLLM; `attribute` / `method`: read or "
                    "called on a vLLM object whose class was inferred; `provide`: an attribute vLLM's methods read on "
                    "objects of the class a `set` replaces, which the class set in its place provides")
    defined: Optional[str] = Field(
        default=None, description="how the release pinned defines it (method, property, class_attribute, "
                                  "instance_attribute, field, module, name): informative; the loader accepts any")


class ManifestEntry(Strict):
    patch: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*@[0-9]+$", description="id@version")]
    targets: dict[Annotated[str, Field(pattern=TARGET)], Fingerprint] = Field(default_factory=dict)
    reach: dict[Annotated[str, Field(pattern=TARGET)], ReachPin] = Field(
        default_factory=dict, description="what the implementation reaches in vLLM (`module:Class.name`, "
                                          "`module:name`): written by `vllm-patchkit pin`, verified by check and "
                                          "the loader")


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


# -- a valid file, handed on ---------------------------------------------------------------------
#: each validating model -> the object it is handed on as (the same fields; schema.py, pins.py)
OBJECTS: dict[type, type] = {When: schema.When, EnvVar: schema.EnvVar, EnvDefault: schema.EnvDefault,
                             RetireWhen: schema.RetireWhen, Patch: schema.Patch, Fingerprint: pins.Fingerprint, ReachPin: pins.ReachPin,
                             ManifestEntry: pins.ManifestEntry, NotApplicable: pins.NotApplicable,
                             Manifest: pins.Manifest}


def to_object(model: BaseModel) -> Any:
    """A validated model as the object every process reads (its nested models too): fields copied as they are."""
    return msgspec.convert(model, OBJECTS[type(model)], from_attributes=True)


def validate(cls: type, data: Any, **options: Any) -> Any:
    """`data` validated against the schema of `cls` (schema.Patch, pins.Manifest, ...), as a `cls`; raises
    pydantic's ValidationError (yaml_files turns it into errors naming the file and the field). `options` go to
    pydantic's `model_validate` (e.g. strict=False)."""
    model = next(m for m, obj in OBJECTS.items() if obj is cls)
    return to_object(model.model_validate(data, **options))


__all__ = ["EnvDefault", "EnvVar", "Fingerprint", "Manifest", "ManifestEntry", "NotApplicable", "OBJECTS", "Patch",
           "ReachPin", "RetireWhen", "Strict", "When", "to_object", "validate"]

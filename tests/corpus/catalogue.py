"""Read and validate the corpus catalogues (`tests/corpus/<plugin>/catalogue.yaml`, format: README.md here),
and build a full `vllm_patchkit.declaration.schema.Patch` for every declared place.

    load("flash_head") -> Catalogue          all_catalogues() -> list[Catalogue]
    catalogue.patches() -> list[Patch]       (the declared places, boilerplate filled)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.vocabulary import TARGET
from vllm_patchkit.declaration.validation import EnvDefault, validate

HERE = Path(__file__).resolve().parent
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
PLACE_ID = r"^[a-z0-9][a-z0-9-]*$"

Mechanism = Literal["wrap", "replace", "setattr", "subclass_override", "copy_body", "config_field", "env",
                    "sys_modules", "registry", "instance_attr", "class_attr", "other"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Declaration(_Strict):
    """The Patch fields that state one place in our schema (the rest is boilerplate, filled below)."""

    kind: Literal["wrap", "replace", "set", "register", "env_default", "refuse", "subclass", "hook"]
    target: Optional[str] = Field(default=None, pattern=TARGET)
    copies: list[str] = Field(default_factory=list)
    uses: list[str] = Field(default_factory=list)
    implementation: Optional[str] = Field(default=None, pattern=TARGET)
    params: list[str] = Field(default_factory=list)
    overrides: list[str] = Field(default_factory=list)
    config_field: Optional[str] = None
    reimplements: Optional[list[str]] = None  # [] : a replace that calls the original (copies nothing)
    copied_part: dict[str, list[str]] = Field(default_factory=dict)  # the statements of a body it copies (a part)
    instances: bool = False
    adds: bool = False  # kind set of a name the plugin adds to a vLLM class (pinned absent); register: a new key
    entry: Optional[str] = None  # kind register: the key the plugin sets in the mapping
    value: Any = None
    value_from: Optional[str] = Field(default=None, pattern=TARGET)
    env_default: Optional[EnvDefault] = None
    message: Optional[str] = None


class Truth(_Strict):
    breaks: bool
    reason: str = Field(min_length=1)


class Place(_Strict):
    id: str = Field(pattern=PLACE_ID)
    target: str = Field(pattern=TARGET)
    mechanism: Mechanism
    where: str = Field(pattern=r"^[^:\s]+:\d+$")
    what: str = Field(min_length=1)
    copies_body: bool
    declaration: Optional[Declaration]
    not_declarable: Optional[str] = None
    truth: dict[str, Truth]

    @model_validator(mode="after")
    def _consistent(self) -> "Place":
        if (self.declaration is None) == (not self.not_declarable):
            raise ValueError("give exactly one of 'declaration' and 'not_declarable' (the reason)")
        missing = [r for r in RELEASES if r not in self.truth]
        extra = [r for r in self.truth if r not in RELEASES]
        if missing or extra:
            raise ValueError(f"truth needs exactly the releases {list(RELEASES)} (missing {missing}, unknown {extra})")
        if self.declaration is not None and self.copies_body and not self.declaration.reimplements:
            raise ValueError("copies_body is true: the declaration must name the copied body in 'reimplements'")
        return self


class ReachVerdict(_Strict):
    """The judgement of one BREAKING line of `vllm-patchkit reach` (pinned on 0.31.0, against `release`), read
    against both releases' sources: is it a real break of the plugin? (scripts/corpus_reach.py counts them.)"""

    where: str = Field(pattern=r"^[^:\s]+:\d+$")  # the line's file:line in the plugin
    name: str = Field(pattern=r"^vllm(\.\w+)*:[\w.]+$")  # the vLLM name reached (the line's key)
    release: Literal["0.32.0", "0.33.0", "0.34.0"]
    breaks: bool
    reason: str = Field(min_length=1)


class Catalogue(_Strict):
    plugin: str = Field(min_length=1)
    version: str = Field(min_length=1)
    source: str = Field(min_length=1)
    vllm_pinned: Literal["0.31.0"]
    vllm_declared: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    places: list[Place] = Field(min_length=1)
    reach: list[ReachVerdict] = Field(default_factory=list)  # optional: judged lines of the whole-plugin reach
    folder: str = Field(default="", exclude=True)

    @model_validator(mode="after")
    def _unique(self) -> "Catalogue":
        ids = [p.id for p in self.places]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"place ids used twice: {dup}")
        keys = [(r.where, r.name, r.release) for r in self.reach]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError("reach: judged twice (where, name, release): "
                             + ", ".join(f"{w} {n} on {r}" for w, n, r in twice))
        return self

    def patch(self, place: Place) -> Patch:
        """The full Patch for one declared place."""
        if place.declaration is None:
            raise ValueError(f"{self.folder}: place {place.id!r} is not declarable: {place.not_declarable}")
        d = place.declaration.model_dump(exclude_defaults=True)
        try:
            return validate(Patch, {
                "id": f"{self.folder.replace('_', '-')}-{place.id}",
                "version": 1,
                "summary": place.what.strip().split(". ")[0][:200],
                "why": place.what.strip(),
                "upstream": "none: third-party plugin",
                "retire_when": {"manual": f"when {self.plugin} no longer patches this place"},
                "processes": processes_for(place, d),
                "required": True,
                **d,
            }, strict=False)
        except ValidationError as exc:
            raise ValueError(f"{self.folder}/catalogue.yaml: place {place.id!r}: declaration does not build a "
                             f"Patch: {exc}") from None

    def patches(self) -> list[Patch]:
        return [self.patch(p) for p in self.places if p.declaration is not None]


# where vLLM runs the code a place patches (the roles that import and call it)
_ROLES = (
    ("vllm.v1.core.", ["engine_core"]),
    ("vllm.v1.engine.core", ["engine_core"]),
    ("vllm.v1.engine.", ["frontend"]),
    ("vllm.entrypoints.", ["frontend"]),
    ("vllm.v1.worker.", ["worker"]),
    ("vllm.v1.sample.", ["worker"]),
    ("vllm.v1.spec_decode.", ["worker"]),
    ("vllm.model_executor.", ["worker"]),
    ("vllm.config", ["frontend", "engine_core", "worker"]),
    ("vllm.envs", ["frontend", "engine_core", "worker"]),
)


def processes_for(place: Place, declaration: dict) -> list[str]:
    """Scheduler places run in EngineCore, runner/worker/model places in the workers, engine-client and API places
    in the front end, config and env places in every role."""
    if declaration.get("kind") in ("env_default", "refuse"):
        return ["frontend", "engine_core", "worker"]
    module = place.target.partition(":")[0]
    for prefix, roles in _ROLES:
        if module == prefix.rstrip(".") or module.startswith(prefix):
            return roles
    return ["frontend", "engine_core", "worker"]  # shared code (utils, platforms, layers): every role may run it


def plugins() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / "catalogue.yaml").is_file())


def load(plugin: str, root: Path = HERE) -> Catalogue:
    path = Path(root) / plugin / "catalogue.yaml"
    name = f"{plugin}/catalogue.yaml"
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: not a mapping")
    try:
        cat = Catalogue.model_validate({**raw, "folder": plugin})
    except ValidationError as exc:
        raise ValueError(f"{name}: {_describe(raw, exc)}") from None
    for place in cat.places:
        if place.declaration is not None:
            cat.patch(place)  # the declaration must build
    return cat


def _describe(raw: dict, exc: ValidationError) -> str:
    """Each error with the place id it is in, when it is in one."""
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(x) for x in loc)
        if len(loc) >= 2 and loc[0] == "reach" and isinstance(loc[1], int):
            lines = raw.get("reach") or []
            one = lines[loc[1]] if loc[1] < len(lines) and isinstance(lines[loc[1]], dict) else {}
            where = f"reach[{loc[1]}] ({one.get('where', '?')} {one.get('name', '?')}): " + ".".join(
                str(x) for x in loc[2:])
        elif len(loc) >= 2 and loc[0] == "places" and isinstance(loc[1], int):
            places = raw.get("places") or []
            pid = places[loc[1]].get("id", f"#{loc[1]}") if loc[1] < len(places) and isinstance(
                places[loc[1]], dict) else f"#{loc[1]}"
            where = f"place {pid!r}: " + ".".join(str(x) for x in loc[2:])
        out.append(f"{where}: {err['msg']}")
    return "; ".join(out)


def all_catalogues() -> list[Catalogue]:
    return [load(p) for p in plugins()]


class Split(_Strict):
    """tests/corpus/split.yaml: which plugins rules may be tuned on, and the recorded draw of the held-out ones."""

    seed: int
    pool: list[str] = Field(min_length=1)
    drawn: list[str] = Field(min_length=1)
    tuning: list[str] = Field(min_length=1)
    held_out: list[str] = Field(min_length=1)
    moves: list[dict] = Field(default_factory=list)

    @model_validator(mode="after")
    def _disjoint(self) -> "Split":
        both = sorted(set(self.tuning) & set(self.held_out))
        if both:
            raise ValueError(f"in both splits: {both}")
        if not set(self.drawn) <= set(self.pool):
            raise ValueError(f"drawn but not in the pool: {sorted(set(self.drawn) - set(self.pool))}")
        return self

    def of(self, plugin: str) -> str:
        if plugin in self.held_out:
            return "held_out"
        if plugin in self.tuning:
            return "tuning"
        raise ValueError(f"split.yaml: plugin {plugin!r} is in neither split (add it to `tuning`, or draw it)")


def load_split(root: Path = HERE) -> Split:
    raw = yaml.safe_load((Path(root) / "split.yaml").read_text())
    try:
        return Split.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"split.yaml: {_describe(raw, exc)}") from None

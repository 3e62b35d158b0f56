"""The validating schema (validation.py, pydantic) and the objects every process reads (schema.py, pins.py, msgspec
Structs) declare the same fields: a field added to one side only would be refused by the other (a valid YAML
that cannot be handed on, or a cached object that no file can give). Checked field by field: names and order,
required or not, the default, and the type once the schema's constraints are set aside."""

from __future__ import annotations

import typing
from enum import Enum

import msgspec
import pytest
from pydantic import BaseModel, ValidationError

from vllm_patchkit.declaration import pins, schema, validation
from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.patchsets import discover
from vllm_patchkit.upstream import cache_models

PAIRS = sorted(validation.OBJECTS.items(), key=lambda kv: kv[0].__name__)


def _plain(tp) -> object:
    """A type with its constraints set aside and each validating model named by the object it becomes."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _plain(args[0])
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return validation.OBJECTS[tp]
    if origin is typing.Union:
        return ("union", frozenset(_plain(a) for a in args))
    if origin in (list, dict):
        return (origin, tuple(_plain(a) for a in args))
    if origin is typing.Literal:
        return ("literal", frozenset(args))
    return tp


def _pydantic_fields(model: type) -> list[tuple]:
    hints = typing.get_type_hints(model, include_extras=True)
    out = []
    for name, info in model.model_fields.items():
        required = info.is_required()
        default = None if required else (info.default_factory() if info.default_factory else info.default)
        out.append((name, required, _as_object(default), _plain(hints[name])))
    return out


def _struct_fields(cls: type) -> list[tuple]:
    out = []
    for f in msgspec.structs.fields(cls):
        required = f.required
        default = None if required else (f.default_factory() if f.default is msgspec.NODEFAULT else f.default)
        out.append((f.name, required, default, _plain(f.type)))
    return out


def _as_object(value):
    return validation.to_object(value) if isinstance(value, BaseModel) else value


@pytest.mark.parametrize("model,obj", PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_both_sides_declare_the_same_fields(model, obj):
    assert _struct_fields(obj) == _pydantic_fields(model)


def test_every_object_class_has_its_validating_model():
    declared = {v for v in vars(schema).values() if isinstance(v, type) and issubclass(v, schema.Declared)}
    declared |= {v for v in vars(pins).values() if isinstance(v, type) and issubclass(v, schema.Declared)}
    assert declared - {schema.Declared} == set(validation.OBJECTS.values())


def test_the_shipped_sets_go_through_validation_and_back_from_the_cache_unchanged():
    """Every shipped patch and manifest: validated, handed on, dumped and read back as the warm path does."""
    sources = discover(None)
    ps = load_patch_set(sources)
    ms = load_manifests(manifest_dirs(sources), ps)
    assert ps.patches and ms
    for patch in ps.patches.values():
        assert type(patch) is schema.Patch and isinstance(patch.kind, Enum)
        assert cache_models.load_model(schema.Patch, cache_models.dumps(patch)) == patch
    for loaded in ms.values():
        assert type(loaded.manifest) is pins.Manifest
        assert cache_models.load_model(pins.Manifest, cache_models.dumps(loaded.manifest)) == loaded.manifest


def test_validation_still_refuses_what_the_objects_would_take():
    """Constructing an object checks nothing (start-up builds them from checked data); a file goes through the
    schema, which refuses a bad pattern and a cross-field rule the Struct knows nothing of."""
    doc = {"id": "Bad Id", "version": 1, "summary": "s", "why": "w", "upstream": "none: t",
           "retire_when": {"manual": "m"}, "kind": "wrap", "target": "m:f", "processes": ["worker"], "required": True}
    with pytest.raises(ValidationError, match="String should match pattern"):
        validation.validate(schema.Patch, doc)
    with pytest.raises(ValidationError, match="give exactly one of vllm, probe, manual"):
        validation.validate(schema.Patch, {**doc, "id": "ok", "retire_when": {"manual": "m", "vllm": ">=1"}})
    patch = validation.validate(schema.Patch, {**doc, "id": "ok"})
    assert type(patch) is schema.Patch and patch.kind is schema.Kind.wrap and patch.key == "ok@1"
    assert type(patch.when) is schema.When and type(patch.retire_when) is schema.RetireWhen


def test_a_cached_object_of_the_wrong_type_or_with_an_unknown_key_is_refused():
    patch = validation.validate(schema.Patch, {
        "id": "ok", "version": 1, "summary": "s", "why": "w", "upstream": "none: t", "retire_when": {"manual": "m"},
        "kind": "wrap", "target": "m:f", "processes": ["worker"], "required": True})
    data = cache_models.dumps(patch)
    for bad in ({**data, "version": "1"}, {**data, "required": 1}, {**data, "kind": "nope"},
                {**data, "when": {**data["when"], "typo": 1}}, {**data, "processes": "worker"}):
        with pytest.raises(cache_models.NotRebuildable):
            cache_models.load_model(schema.Patch, bad)

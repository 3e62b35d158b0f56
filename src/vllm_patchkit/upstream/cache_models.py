"""Patch-set models back from a cache entry's JSON, without running pydantic's validators.

Why apart from the store (`cache`): this is what one kind of entry holds (the validated patch sets and
manifests), not how entries are kept. Validating the patch sets' dumps again with pydantic costs ~20 ms of
CPU in a fresh process (its validators are built on first use), what the cache is there to save; their
content is covered by the entry's digest. They are built back field by field from the models' own
annotations instead, each value checked for its JSON type (a string where a string is declared, an enum's
value, a Literal's choice); anything else is refused and the entry rebuilt from the files. `dumps` and
`load_model` round-trip every model of schema.py; `cacheable` says when one does not (a `value` JSON cannot
hold) and the entry is not written.
"""

from __future__ import annotations

import json
import types
import typing
from enum import Enum
from typing import Any, Callable


class NotRebuildable(ValueError):
    """A cached model's data does not fit its class: the entry is not used."""


def _ident(v: Any) -> Any:
    return v


def _typed(*kinds: type) -> Callable[[Any], Any]:
    """JSON gives exact types: a bool is no int here, as pydantic's strict mode has it."""
    def check(v: Any) -> Any:
        if type(v) in kinds:
            return v
        raise NotRebuildable(f"{v!r:.40} is not {'/'.join(k.__name__ for k in kinds)}")

    return check


def _converter(ann: Any) -> Callable[[Any], Any]:
    """How one field's JSON value becomes the model's value; built once per field of a class (`_fields_of`)."""
    from pydantic import BaseModel

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is Any:
        return _ident
    if origin is typing.Annotated:
        return _converter(args[0])
    if origin is typing.Union or origin is types.UnionType:
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"cannot rebuild {ann}")
        conv = _converter(inner[0])
        return lambda v: None if v is None else conv(v)
    if origin is typing.Literal:
        allowed = {(type(a), a) for a in args}

        def literal(v: Any) -> Any:
            if (type(v), v) in allowed:
                return v
            raise NotRebuildable(f"{v!r:.40} is not one of {args}")

        return literal
    if origin is list:
        item = _converter(args[0])

        def as_list(v: Any) -> list:
            if type(v) is not list:
                raise NotRebuildable(f"{v!r:.40} is not a list")
            return [item(x) for x in v]

        return as_list
    if origin is dict:
        key, val = _converter(args[0]), _converter(args[1])

        def as_dict(v: Any) -> dict:
            if type(v) is not dict:
                raise NotRebuildable(f"{v!r:.40} is not a mapping")
            return {key(k): val(x) for k, x in v.items()}

        return as_dict
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return lambda v: load_model(ann, v)
    if isinstance(ann, type) and issubclass(ann, Enum):
        members = {m.value: m for m in ann}

        def enum(v: Any) -> Any:
            try:
                return members[v]
            except (KeyError, TypeError):
                raise NotRebuildable(f"{v!r:.40} is no {ann.__name__}") from None

        return enum
    if ann is float:
        return _typed(float, int)
    if ann in (str, int, bool):
        return _typed(ann)
    raise TypeError(f"cannot rebuild {ann}")


_REQUIRED, _ABSENT = object(), object()
_FIELDS: dict[type, list] = {}


def _default_maker(field: Any) -> Any:
    import copy

    from pydantic import BaseModel

    factory = field.default_factory
    if isinstance(factory, type) and issubclass(factory, BaseModel):  # `When()` would build its validator: ~1 ms
        return lambda: load_model(factory, {})
    if factory is not None:
        return factory  # the schema's other factories take no argument (list, dict)
    if field.is_required():  # no default and (see above) no factory: pydantic's public test for PydanticUndefined
        return _REQUIRED
    default = field.default
    if isinstance(default, (list, dict, set)):
        return lambda: copy.deepcopy(default)
    return lambda: default


def _fields_of(cls: type) -> list:
    spec = _FIELDS.get(cls)
    if spec is None:
        spec = _FIELDS[cls] = [(name, _converter(f.annotation), _default_maker(f))
                               for name, f in cls.model_fields.items()]
    return spec


def load_model(cls: type, data: Any) -> Any:
    """`cls` (a pydantic model) from `dumps`' output, without running its validators (see above). Built as
    `model_construct` builds a model, minus its per-call signature inspection of every default factory (~0.1 ms a
    field: 25 ms for this repository's sets)."""
    if type(data) is not dict:
        raise NotRebuildable(f"{cls.__name__}: not a mapping")
    values, given = {}, 0
    for name, conv, default in _fields_of(cls):
        v = data.get(name, _ABSENT)
        if v is not _ABSENT:
            values[name] = conv(v)
            given += 1
        elif default is _REQUIRED:
            raise NotRebuildable(f"{cls.__name__}: {name!r} missing")
        else:
            values[name] = default()
    if given != len(data):
        raise NotRebuildable(f"{cls.__name__}: no field {sorted(data.keys() - values.keys())[0]!r}")
    if cls.__pydantic_post_init__ or cls.__private_attributes__:  # none in schema.py; pydantic's own way then
        return cls.model_construct(_fields_set=set(data), **values)
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(data))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


def dumps(model: Any) -> dict:
    """What `load_model` reads back: the fields that were given (their defaults come from the class again)."""
    return model.model_dump(mode="json", exclude_unset=True)


def cacheable(model: Any) -> bool:
    """True when the model comes back from its JSON dump equal (a `value` of a type JSON cannot hold does not)."""
    try:
        return load_model(type(model), json.loads(json.dumps(dumps(model)))) == model
    except (TypeError, ValueError):
        return False

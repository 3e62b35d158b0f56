"""Patch-set objects back from a cache entry's JSON, each value checked for its type.

Why apart from the store (`cache`): this is what one kind of entry holds (the validated patch sets and
manifests), not how entries are kept. The objects are msgspec Structs (declaration/schema.py, pins.py), so
msgspec's typed conversion reads them back in C: a string where a string is declared, an enum's value, a
Literal's choice, no unknown key; anything else is refused and the entry rebuilt from the files. The schema's
constraints (patterns, lengths) were checked when the file was read, and the entry's digest covers its content.
`dumps` and `load_model` round-trip every object; `cacheable` says when one does not (a `value` JSON cannot
hold) and the entry is not written.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


class NotRebuildable(ValueError):
    """A cached object's data does not fit its class: the entry is not used."""


def load_model(cls: type, data: Any) -> Any:
    """`cls` (a Struct of schema.py or pins.py) from `dumps`' output."""
    if type(data) is not dict:
        raise NotRebuildable(f"{cls.__name__}: not a mapping")
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise NotRebuildable(f"{cls.__name__}: {exc}") from None


def dumps(model: Any) -> dict:
    """What `load_model` reads back: every field, enums as their values."""
    return msgspec.to_builtins(model)


def cacheable(model: Any) -> bool:
    """True when the object comes back from its JSON dump equal (a `value` of a type JSON cannot hold does not)."""
    try:
        return load_model(type(model), json.loads(json.dumps(dumps(model)))) == model
    except (TypeError, ValueError):
        return False

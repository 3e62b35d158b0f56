"""The kinds of patch, one module each, named as the kind: the loader looks a patch's kind up here and never
branches on it. A kind's declarative part (what its YAML needs and takes) is its row in declaration/kinds.py; this
package finds each row's module by that name, so adding a kind is one module here and one row there
(docs/writing-a-kind.md). A kind's module is imported the first time a patch of that kind is needed in the
process (a worker with no `subclass` patch to apply never imports it)."""

from __future__ import annotations

from importlib import import_module

from vllm_patchkit.declaration.kinds import DECLARATIONS
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.kinds.base import PatchKind

_LOADED: dict[str, PatchKind] = {}


def kind_named(name: str) -> PatchKind:
    kind = _LOADED.get(name)
    if kind is None:
        kind = _LOADED[name] = import_module(f"{__name__}.{name}").KIND
    return kind


def kind_of(patch: Patch) -> PatchKind:
    return kind_named(patch.kind.value)


def all_kinds() -> dict[str, PatchKind]:
    """Every declared kind, by name (each module imported)."""
    return {d.name: kind_named(d.name) for d in DECLARATIONS}

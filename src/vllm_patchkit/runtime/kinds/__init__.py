"""The kinds of patch, one module each, named as the kind: the loader looks a patch's kind up here and never
branches on it. A kind's declarative part (what its YAML needs and takes) is its row in declaration/kinds.py; this
package finds each row's module by that name, so adding a kind is one module here and one row there
(docs/writing-a-kind.md)."""

from __future__ import annotations

from importlib import import_module

from vllm_patchkit.declaration.kinds import DECLARATIONS
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.kinds.base import PatchKind

KINDS: dict[str, PatchKind] = {d.name: import_module(f"{__name__}.{d.name}").KIND for d in DECLARATIONS}


def kind_of(patch: Patch) -> PatchKind:
    return KINDS[patch.kind.value]

"""The kinds of patch, one module each; the loader looks a patch's kind up here and never branches on it.
Adding a kind: its module, one line below, and its name and fields in the declaration (docs/writing-a-kind.md)."""

from __future__ import annotations

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.kinds.base import PatchKind
from vllm_patchkit.runtime.kinds.env_default import EnvDefault
from vllm_patchkit.runtime.kinds.refuse import Refuse
from vllm_patchkit.runtime.kinds.replace import Replace
from vllm_patchkit.runtime.kinds.set import Set
from vllm_patchkit.runtime.kinds.subclass import Subclass
from vllm_patchkit.runtime.kinds.wrap import Wrap

KINDS: dict[str, PatchKind] = {k.name: k for k in (Wrap(), Replace(), Set(), EnvDefault(), Refuse(), Subclass())}


def kind_of(patch: Patch) -> PatchKind:
    return KINDS[patch.kind.value]

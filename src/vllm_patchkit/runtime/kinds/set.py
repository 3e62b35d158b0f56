"""`set`: an attribute gets `value` (or what `value_from` returns): on the class or module, or on each object
vLLM builds (`instances: true`)."""

from __future__ import annotations

from vllm_patchkit.runtime.apply import install
from vllm_patchkit.runtime.kinds.base import PatchKind, counting


class Set(PatchKind):
    name = "set"
    changes_target = True
    installed_name = "value"

    def apply(self, patch, verified, record, flush):
        applied = install(patch, verified.place, verified.copies, verified.impl, counting(patch))
        return applied, {"places": [place.spec for place, _ in applied.places]}


KIND = Set()

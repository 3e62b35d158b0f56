"""`wrap`: the implementation is called around vLLM's function (`impl(wrapped, instance, args, kwargs[, ctx])`),
or, with no implementation, a counted passthrough."""

from __future__ import annotations

from vllm_patchkit.runtime.apply import install
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.runtime.kinds.base import PatchKind, counting


class Wrap(PatchKind):
    name = "wrap"
    changes_target = True
    installs_function = True
    installed_name = "wrapper"

    def apply(self, patch, verified, record, flush):
        ctx = PatchContext(patch, record=record, flush=flush) if patch.implementation is not None else None
        applied = install(patch, verified.place, verified.copies, verified.impl, counting(patch), ctx)
        return applied, {"places": [place.spec for place, _ in applied.places]}


KIND = Wrap()

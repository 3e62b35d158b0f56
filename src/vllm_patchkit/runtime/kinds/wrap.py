"""`wrap`: the implementation is called around vLLM's function (`impl(wrapped, instance, args, kwargs[, ctx])`),
or, with no implementation, a counted passthrough."""

from __future__ import annotations

from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.runtime.kinds.base import AtPlaces


class Wrap(AtPlaces):
    name = "wrap"
    installed_name = "wrapper"

    def context(self, patch, record, flush):
        return PatchContext(patch, record=record, flush=flush) if patch.implementation is not None else None


KIND = Wrap()

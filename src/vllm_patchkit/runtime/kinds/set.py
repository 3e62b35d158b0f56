"""`set`: an attribute gets `value` (or what `value_from` returns): on the class or module, or on each object
vLLM builds (`instances: true`)."""

from __future__ import annotations

from vllm_patchkit.runtime.kinds.base import AtPlaces


class Set(AtPlaces):
    name = "set"
    installed_name = "value"


KIND = Set()

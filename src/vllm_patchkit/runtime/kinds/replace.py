"""`replace`: the implementation stands where vLLM's function stood (it copies that function, or calls it)."""

from __future__ import annotations

from vllm_patchkit.runtime.kinds.base import AtPlaces


class Replace(AtPlaces):
    name = "replace"
    installed_name = "replacement"


KIND = Replace()

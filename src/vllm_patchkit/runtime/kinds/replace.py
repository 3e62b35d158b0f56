"""`replace`: the implementation stands where vLLM's function stood (it copies that function, or calls it)."""

from __future__ import annotations

from vllm_patchkit.runtime.apply import install
from vllm_patchkit.runtime.kinds.base import PatchKind, counting


class Replace(PatchKind):
    name = "replace"
    changes_target = True
    installs_function = True
    installed_name = "replacement"

    def apply(self, patch, verified, record, flush):
        applied = install(patch, verified.place, verified.copies, verified.impl, counting(patch))
        return applied, {"places": [place.spec for place, _ in applied.places]}


KIND = Replace()

"""`env_default`: an environment variable gets a default when it is unset; an explicit value is kept."""

from __future__ import annotations

from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.apply import set_env_default
from vllm_patchkit.runtime.kinds.base import PatchKind


class EnvDefault(PatchKind):
    name = "env_default"

    def apply(self, patch, verified, record, flush):
        applied = Applied(patch)
        return applied, {"env": set_env_default(patch, applied)}


KIND = EnvDefault()

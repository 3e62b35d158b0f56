"""`warn`: when `when` holds, the process logs `message` as a warning and its record carries it; start-up goes
on. The soft sibling of `refuse`, for a configuration a set serves but would rather not (a slow path, a feature
off)."""

from __future__ import annotations

import logging

from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.kinds.base import PatchKind

log = logging.getLogger("vllm.patchkit")


class Warn(PatchKind):
    name = "warn"

    def not_needed(self, unmet):
        return f"warning condition does not hold: {unmet}"

    def apply(self, patch, verified, record, flush):
        message = " ".join(patch.message.split())
        record.warning = message
        log.warning("vllm-patchkit: %s: %s", patch.key, message)
        return Applied(patch), {"warned": message}


KIND = Warn()

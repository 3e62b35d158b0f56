"""`refuse`: start-up stops with `message` when `when` holds (a configuration the set cannot serve)."""

from __future__ import annotations

from vllm_patchkit.runtime.kinds.base import PatchKind


class Refuse(PatchKind):
    name = "refuse"
    refuses = True

    def not_needed(self, unmet):
        return f"refusal condition does not hold: {unmet}"


KIND = Refuse()

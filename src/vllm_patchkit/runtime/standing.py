"""Does an applied patch still stand where it was put, and can it run at all? A plugin loaded later may put
its own object over a wrapper (`replaced_after_apply`); a class vLLM uses may override a patched method without
calling it (`shadowed`); a kind may know more once the engine stepped (a subclass never built)."""

from __future__ import annotations

import logging
from typing import Optional

from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.wrappers import MARK
from vllm_patchkit.runtime.kinds import kind_of
from vllm_patchkit.runtime.record import APPLIED, FAILED
from vllm_patchkit.runtime.shadow import find_shadowed
from vllm_patchkit.runtime.provenance import replaced_in_place
from vllm_patchkit.upstream.targets import function_of
from vllm_patchkit.upstream.findings import Finding

log = logging.getLogger("vllm.patchkit")


class Standing:
    """The after-apply checks of one process: no state of its own; reads the applied patches and the patch set,
    writes outcomes and findings into the ledger."""

    def __init__(self, ledger: Ledger, applied: dict[str, Applied], patch_set: PatchSet):
        self.ledger = ledger
        self.applied = applied
        self.patch_set = patch_set

    def check_in_place(self) -> int:
        """Every applied wrap/replace must still stand at its places: a plugin loaded after this loader ran may
        have put its own object there (`setattr`), and the patch then runs no more while its row said
        `applied`. Such a patch becomes a failure (`replaced_after_apply`, naming what stands there now); a
        required one is a problem for `status` (exit 1) unless VLLM_PATCHKIT_ALLOW_UNPATCHED names it. Run at
        every flush (the flusher's periodic tick, the stage ends, exit); a few attribute reads per patch.
        Returns the patches newly found replaced."""
        new = 0
        for patch_id, applied in list(self.applied.items()):
            rec = self.ledger.records.get(patch_id)
            kind = kind_of(applied.patch)
            if rec is None or rec.state != APPLIED or applied.installed is None or not kind.installs_function:
                continue
            for place, original in list(applied.places):
                try:
                    now = function_of(place.get_raw())
                except Exception:
                    continue
                obj, seen = now, set()
                while obj is not applied.installed and hasattr(obj, "__wrapped__") and id(obj) not in seen:
                    seen.add(id(obj))  # a layer stacked on ours (another patch, a decorator) still calls ours
                    obj = obj.__wrapped__
                if obj is applied.installed or self.applied.get(patch_id) is not applied:
                    continue  # in place; or unpatched meanwhile (popped before its places are put back)
                site = replaced_in_place(now)
                applied.places.remove((place, original))  # never put vLLM's original back over that object
                reason = (f"{place.spec} no longer holds this patch's {kind.installed_name}: "
                          f"after it was applied, something replaced it with {site} (a plugin loaded later, a "
                          f"`setattr`), so the patch no longer runs there ({applied.counter.calls} call(s) before "
                          "it was noticed)")
                expected = f"{applied.patch.key} installed at {place.spec}"
                found = site if getattr(now, MARK, None) is None else f"{site} (another patch: {getattr(now, MARK)})"
                if applied.patch.required:
                    self.ledger.required_failed(applied.patch, FailureCode.replaced_after_apply, reason, expected, found)
                else:
                    rec.set(FAILED, FailureCode.replaced_after_apply, reason, expected, found)
                    self.ledger.warn(rec, f"optional patch {rec.patch} failed (replaced_after_apply): {reason}")
                if rec.state == FAILED:
                    log.error("vllm-patchkit: %s: %s", rec.patch, reason)
                new += 1
                break
        return new

    def report_shadowed(self, in_use: dict[str, str]) -> None:
        """Applied class-level patches that the classes this process uses can never reach."""
        for rec in self.ledger.records.values():
            patch = self.patch_set.patches.get(rec.patch)
            if rec.state != APPLIED or rec.target is None or patch is None or not kind_of(patch).installs_function:
                continue
            if patch.instances:
                continue  # set on each object: an override in its class is wrapped too, never shadowing it
            for used, by in find_shadowed(rec.target, in_use):
                rec.findings.append(Finding("shadowed", f"{used} uses {by}'s override, which never calls up to "
                                            f"{rec.target}", where=used).as_record(by=by))
                log.warning("vllm-patchkit: %s is shadowed: %s overrides %s without calling it; the patch can never run",
                            rec.patch, by, rec.target)

    def report_not_built(self, steps: Optional[int]) -> None:
        """What only running reveals, each kind for its own patches (a selected subclass vLLM never built)."""
        for patch_id, applied in self.applied.items():
            kind_of(applied.patch).report(applied, self.ledger.records[patch_id], steps)

"""The ledger: one process's patch records and process record, and the few ways an outcome is written into them.

Every job of the loader (deciding, waiting for a module, the after-apply checks, hosting) writes outcomes here and
nowhere else: a warning, a required patch that failed (or is let through by VLLM_PATCHKIT_ALLOW_UNPATCHED), a
refusal, and the fail-closed rule that stops start-up. Writing the file is the loader's flush, handed in."""

from __future__ import annotations

import logging
from typing import Any, Callable, NoReturn

from vllm_patchkit.declaration.errors import RequiredPatchFailed, RequiredPatchUnavailable, remedies
from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.availability import Unavailable, allowed_unpatched, refusal_message
from vllm_patchkit.runtime.record import FAILED, REFUSED, SKIPPED, PatchRecord, ProcessRecord

log = logging.getLogger("vllm.patchkit")


class Ledger:
    """The records of one process (`records`: patch id -> record; `process`), written only through these methods
    or by the job that owns the outcome (`PatchRecord.set`)."""

    def __init__(self, process: ProcessRecord, vllm_version: str, manifests: dict,
                 flush: Callable[[], Any] = lambda: None):
        self.process = process
        self.records: dict[str, PatchRecord] = {}
        self.vllm_version = vllm_version
        self.manifests = manifests  # for the remedies a message offers (other releases' pins)
        self.flush = flush  # the loader's: writes the record file; set once the loader exists

    def warn(self, rec: PatchRecord, message: str) -> None:
        rec.warning = message
        log.warning("vllm-patchkit: %s", message)

    def required_failed(self, patch: Patch, code: str, reason: str, expected: Any = None,
                        found: Any = None) -> PatchRecord:
        """A needed required patch cannot apply (`code`): failed, with the remedies its class has; or, when
        $VLLM_PATCHKIT_ALLOW_UNPATCHED names it (or `all`), skipped loudly as the remedies promise."""
        rec = self.records[patch.id]
        if allowed_unpatched(patch.id):
            rec.set(SKIPPED, FailureCode.unpatched_allowed, f"needed here but failed ({code}): {reason}; served without it "
                    "because VLLM_PATCHKIT_ALLOW_UNPATCHED names it", expected, found)
            rec.detail["failure"] = code
            self.warn(rec, f"REQUIRED patch {patch.key} is needed here but failed ({code}): {reason}; serving "
                           "WITHOUT it because VLLM_PATCHKIT_ALLOW_UNPATCHED names it")
            return rec
        rec.set(FAILED, code, reason, expected, found)
        rec.detail["remedy"] = remedies(code, patch.id, self.vllm_version, self.manifests)
        return rec

    def refuse_unavailable(self, patch: Patch, why: Unavailable, why_needed: str) -> NoReturn:
        """A needed required patch this release's manifest offers no entry for: refused, start-up stops."""
        rec = self.records[patch.id]
        remedy = remedies(FailureCode.unavailable, patch.id, self.vllm_version, self.manifests)
        message = refusal_message(patch.key, self.vllm_version, why_needed, why.reason, remedy)
        rec.set(REFUSED, FailureCode.unavailable, message, "an entry in the manifest for this release", why.code)
        rec.detail["remedy"] = remedy
        self.process.error = message
        log.error("%s", message)
        self.flush()
        raise RequiredPatchUnavailable(rec, message)

    def fail_closed(self) -> None:
        """A required patch that failed stops start-up (after the record is written); an optional one warns once."""
        bad = [r for r in self.records.values() if r.required and r.state == FAILED]
        for r in self.records.values():
            if r.state == FAILED and not r.required and r.warning is None:
                self.warn(r, f"optional patch {r.patch} failed ({r.code}): {r.reason}; "
                             f"expected {r.expected}, found {r.found}")
        if bad:
            self.stop(RequiredPatchFailed(bad[0]))

    def stop(self, exc: Exception, log_it: bool = False) -> NoReturn:
        """Start-up (or an import) stops with `exc`: the process record says why, and is written first."""
        self.process.error = str(exc)
        if log_it:
            log.error("%s", exc)
        self.flush()
        raise exc

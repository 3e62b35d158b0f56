"""Patches whose target module is not imported when their stage runs: recorded `not_imported`, then verified
and applied when the module is imported (lazy.py's import hook), never imported early. A declared copy in a
module imported later is patched then, if it still holds the original."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Optional

from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.errors import RequiredPatchFailed
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.decide import Deferred, NeededButUnavailable, Outcome
from vllm_patchkit.runtime import nearest
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.lazy import HOOK
from vllm_patchkit.runtime.record import APPLIED, FAILED, NOT_IMPORTED, PENDING
from vllm_patchkit.runtime.verify import Verified, verify_use
from vllm_patchkit.upstream.targets import MISSING, TargetError, function_of, resolve
from vllm_patchkit.upstream.findings import Finding

log = logging.getLogger("vllm.patchkit")


def _imported(module: str) -> bool:
    """Executed already (not half-way through its own import): the finder will not be asked for it again."""
    mod = sys.modules.get(module)
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


class Waiting:
    """The loader's watches on modules not imported yet; owns `waiting_on` (patch id -> the module whose import it
    waits for) and every watch it set on the import hook. When a module comes, it asks the loader's pipeline,
    handed in as callbacks: `decide` (the Decider's), `apply` (install and record one verified patch), `applied_late`
    (a patch applied here: the stale-copy watch takes it)."""

    def __init__(self, ledger: Ledger, applied: dict[str, Applied], *, pins_of: Any,
                 decide: Callable[[Patch, Optional[ManifestEntry], str, Optional[dict]], Outcome],
                 apply: Callable[[Patch, Verified], None], applied_late: Callable[[Patch, Applied], None]):
        self.ledger = ledger
        self.applied = applied
        self.pins_of = pins_of
        self.decide = decide
        self.apply = apply
        self.applied_late = applied_late
        self.waiting_on: dict[str, str] = {}

    def waits_for(self, patch_id: str) -> Optional[str]:
        """The module `patch_id` waits for, or None."""
        return self.waiting_on.get(patch_id)

    def defer(self, patch: Patch, d: Deferred) -> None:
        self.waiting_on[patch.id] = d.module
        self.ledger.records[patch.id].set(
            NOT_IMPORTED, FailureCode.not_imported,
            f"needed here; {d.because}: verified and applied when it is imported. Still in this state at the "
            "end: the module was never imported in this process, so the code it changes never ran here",
            f"{d.module} imported", "not imported")

    def watch(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict],
              module: str) -> None:
        if _imported(module):
            # imported since it was deferred (another patch's `uses` or implementation imported it): the
            # finder will not be asked again, so judge it now
            self._on_import(patch, entry, stage, cfg, module)
            return
        HOOK.watch(module, self, lambda mod: self._on_import(patch, entry, stage, cfg, module))

    def forget(self) -> None:
        """Unpatch: every watch dropped; what still waited goes back to pending."""
        HOOK.forget(self)
        for patch_id in self.waiting_on:
            self.ledger.records[patch_id].set(PENDING, None, "unpatched")
        self.waiting_on.clear()

    def _on_import(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict],
                   module: str) -> None:
        """`module` has just executed: judge the patch again (its target now resolves), verify against the
        pin, apply, record, flush. A required patch that fails here fails that import, naming the patch."""
        ledger = self.ledger
        rec = ledger.records[patch.id]
        if rec.state != NOT_IMPORTED or self.waiting_on.get(patch.id) != module:
            return  # unpatched meanwhile, or already judged: never applied twice
        del self.waiting_on[patch.id]
        rec.set(PENDING)
        outcome = self.decide(patch, entry, stage, cfg)
        if isinstance(outcome, Deferred):  # it also waits for another module (its own target, after a dependency)
            self.defer(patch, outcome)
            self.watch(patch, entry, stage, cfg, outcome.module)
            ledger.flush()
            return
        if isinstance(outcome, NeededButUnavailable):  # a deferral passed availability: defensive, never silent
            ledger.refuse_unavailable(patch, outcome.why, f"{module} was imported and the patch is needed here")
        if isinstance(outcome, Verified):
            self.apply(patch, outcome)
            if rec.state == APPLIED:
                rec.detail["lazy"] = f"applied when {module} was imported"
                applied = self.applied.get(patch.id)
                if applied is not None and applied.places:
                    self.applied_late(patch, applied)
                self.watch_late_copies(patch)
        if rec.state == FAILED and patch.required:
            self._fail_import(rec, module)
        if rec.state == FAILED and rec.warning is None:
            ledger.warn(rec, f"optional patch {rec.patch} failed when {module} was imported ({rec.code}): "
                             f"{rec.reason}; expected {rec.expected}, found {rec.found}")
        ledger.flush()
        log.info("vllm-patchkit: role=%s pid=%d %s %s when %s was imported", ledger.process.role, os.getpid(),
                 rec.patch, rec.state, module)

    def _fail_import(self, rec, module: str) -> None:
        """A required patch failed while `module` was imported: that import fails, naming the patch, and so does
        every later import of it (a caller that catches the error and imports again)."""
        exc = RequiredPatchFailed(rec)

        def again(mod, exc=exc):
            raise exc

        HOOK.keep_failing(module, self, again)
        self.ledger.stop(exc, log_it=True)

    def watch_uses(self, patch: Patch, entry: Optional[ManifestEntry], specs: list[str]) -> None:
        """`uses` places whose module vLLM had not imported when the patch applied: verified the moment it is (the
        front end's config-ready hook pins the model registry, which vLLM imports while it builds the config)."""
        for spec in specs:
            module = Target.parse(spec).module
            if _imported(module):
                self._on_use_import(patch, entry, spec, module)
            else:
                HOOK.watch(module, self, lambda mod, spec=spec, module=module: self._on_use_import(patch, entry, spec,
                                                                                                  module))

    def _on_use_import(self, patch: Patch, entry: Optional[ManifestEntry], spec: str, module: str) -> None:
        ledger = self.ledger
        rec = ledger.records[patch.id]
        applied = self.applied.get(patch.id)
        if rec.state != APPLIED or applied is None:
            return  # unpatched meanwhile
        found = verify_use(patch, entry, spec)
        if found is None:
            rec.detail.setdefault("uses_verified_on_import", []).append(spec)
            return
        self.applied.pop(patch.id).undo()  # it must not run on a callable that is no longer what was pinned
        if self.pins_of is not None:
            found = nearest.judged(found, self.pins_of, ledger.vllm_version)
        reason = f"{found.reason} (verified when {module} was imported; the patch was taken back)"
        if patch.required:
            ledger.required_failed(patch, found.code, reason, found.expected, found.found)
        else:
            rec.set(FAILED, found.code, reason, found.expected, found.found)
            ledger.warn(rec, f"optional patch {rec.patch} failed when {module} was imported ({found.code}): {reason}")
        if rec.state == FAILED and patch.required:
            self._fail_import(rec, module)
        ledger.flush()

    def watch_late_copies(self, patch: Patch) -> None:
        """Declared copies whose module is not imported yet: patched when it is, if it then holds the original
        (normally it takes the patched object by value and there is nothing to do)."""
        applied = self.applied.get(patch.id)
        if applied is None or not applied.late_copies or applied.installed is None:
            return
        for spec in applied.late_copies:
            module = Target.parse(spec).module
            if module not in sys.modules:
                HOOK.watch(module, self, lambda mod, spec=spec: self._on_copy_import(patch.id, spec))

    def _on_copy_import(self, patch_id: str, spec: str) -> None:
        applied = self.applied.get(patch_id)
        if applied is None or spec not in applied.late_copies:
            return
        rec = self.ledger.records[patch_id]
        try:
            place = resolve(spec, import_module=False)
            held = place.get_raw()
        except TargetError as exc:
            held, place = MISSING, None
            rec.findings.append(Finding("copy", f"declared copy not found: {exc}", where=spec).as_record())
        if place is not None and held is not MISSING and held is not applied.installed:
            if function_of(held) is applied.original:
                place.set_raw(applied.installed)
                applied.places.append((place, held))
                applied.late_copies.remove(spec)
                rec.detail.setdefault("places", []).append(spec)
            else:
                rec.findings.append(Finding("copy", f"declared copy {spec} holds a different object: "
                                            f"{repr(held)[:120]}", where=spec).as_record())
                log.warning("vllm-patchkit: %s: declared copy %s holds a different object", rec.patch, spec)
        self.ledger.flush()

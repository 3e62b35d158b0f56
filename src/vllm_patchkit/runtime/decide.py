"""The decision for one patch in one process, in order: needed here (process, preconditions)? available
(requires, a pin in the manifest)? verified against the pin (and chosen by its kind)? Each step ends in a typed
outcome; a record is only ever written with what happened, never with a flag for the next step.

The front end's pre-flight refuses early what another process will need and this release cannot give."""

from __future__ import annotations

import sys
from typing import Any, Callable, NamedTuple, Optional, Union

from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.preconditions import Facts, Unknown, held, unmet_at_config, unmet_at_import
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.runtime.availability import Unavailable, allowed_unpatched
from vllm_patchkit.runtime import nearest
from vllm_patchkit.runtime.kinds import kind_of
from vllm_patchkit.runtime.kinds.base import Skip
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.record import APPLIED, FAILED, NOT_IMPORTED, SKIPPED
from vllm_patchkit.runtime.verify import Verified, verify
from vllm_patchkit.upstream.findings import Finding


class Settled:
    """The record already says what happened here (skipped, failed): nothing to apply."""


SETTLED = Settled()


class Deferred(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """Needed, but its target module (or a dependency's) is not imported yet: judged again when `module` is."""

    module: str
    because: str


class NeededButUnavailable(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """Needed and required here, and this release's manifest offers no entry: refused once the stage has judged
    every patch (so the refusal names the first of them, with nothing half-applied)."""

    why: Unavailable


Outcome = Union[Settled, Deferred, NeededButUnavailable, Verified]


class Decider:
    """Decides each patch of one process; owns `decided` (verified in this stage, not applied yet: their dependents
    go on). What it reads is handed in: the ledger, the facts, the plan's unavailable entries and pinned places,
    and two questions to the loader's other jobs (does this process host a role? which module does a patch wait
    for?)."""

    def __init__(self, ledger: Ledger, facts: Facts, *, unavailable: dict[str, Unavailable],
                 pinned_by: dict[str, list[str]], pins_of: Any, lazy: bool,
                 hosts: Callable[[str], bool], waits_for: Callable[[str], Optional[str]]):
        self.ledger = ledger
        self.facts = facts
        self.unavailable = unavailable
        self.pinned_by = pinned_by
        self.pins_of = pins_of  # another release's pins, for a release no manifest pins (nearest.py); else None
        self.lazy = lazy
        self.hosts = hosts
        self.waits_for = waits_for
        self.decided: set[str] = set()

    def done(self, patch_id: str) -> None:
        """`patch_id` is past its decision (applied, refused or failed): no longer counts as decided for its dependents."""
        self.decided.discard(patch_id)

    def preflight(self, plan: list[tuple[Patch, Optional[ManifestEntry], str]], role: str, cfg: dict) -> None:
        """Refuse here, early, when another process will need a required patch this release cannot give.

        The front end knows the release, the manifest and the architecture before it
        starts EngineCore; a worker failing later costs a model load and reads worse.
        Only a refusal leaves a row here: other processes' patches stay `process` skips.
        """
        for patch, _, _ in plan:
            why = self.unavailable.get(patch.id)
            if why is None or not patch.required or kind_of(patch).refuses or role in patch.processes:
                continue
            if allowed_unpatched(patch.id):
                continue
            judged = unmet_at_import(patch.when, self.facts) or unmet_at_config(patch.when, cfg)
            if judged is not None and not isinstance(judged, Unknown):  # unknown: cannot tell it is not needed
                continue
            owners = ", ".join(p.value for p in patch.processes)
            self.ledger.refuse_unavailable(patch, why, f"the {owners} process(es) will need it: {held(patch.when, cfg)}")

    def _unknown_fact(self, patch: Patch, unknown: Unknown) -> Settled:
        """A precondition this release does not let the framework read: the patch may be needed. Required: it
        fails (start-up stops, naming the fact and the release); optional: skipped with a warning. Never a quiet
        'not needed'."""
        reason = (f"may be needed here: its precondition {unknown.field} (expected {unknown.expected}) cannot be "
                  f"read on vLLM {self.ledger.vllm_version}; an unknown fact is never taken as unmet")
        if patch.required:
            self.ledger.required_failed(patch, FailureCode.precondition_unknown, reason, unknown.expected, "unknown")
            return SETTLED
        rec = self.ledger.records[patch.id]
        rec.set(SKIPPED, FailureCode.precondition_unknown, reason, unknown.expected, "unknown")
        self.ledger.warn(rec, f"optional patch {patch.key} {reason}")
        return SETTLED

    def decide(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict],
               vllm_config: Any = None) -> Outcome:
        """Is it needed here (process, preconditions)? Then: can it be applied (requires, manifest, verify)?"""
        ledger = self.ledger
        rec = ledger.records[patch.id]
        if not any(self.hosts(p.value) for p in patch.processes):
            rec.set(SKIPPED, FailureCode.process, "not for this process", [p.value for p in patch.processes],
                    ledger.process.role)
            return SETTLED
        kind = kind_of(patch)  # imported for a patch this process may need, not for every patch of the set
        unmet = unmet_at_import(patch.when, self.facts)
        if unmet is None and stage == "config":
            unmet = unmet_at_config(patch.when, cfg or {})
        if isinstance(unmet, Unknown):
            return self._unknown_fact(patch, unmet)
        if unmet is not None:
            rec.set(SKIPPED, FailureCode.precondition, kind.not_needed(unmet), unmet.expected, unmet.actual)
            return SETTLED
        # needed here from this point on
        waits_for = None  # a dependency still waiting for its module: this one waits with it
        for dep in patch.requires:
            drec = ledger.records[dep]
            if drec.state == NOT_IMPORTED and self.waits_for(dep) is not None:
                waits_for = waits_for or dep
                continue
            if drec.state != APPLIED and dep not in self.decided:
                reason = f"requires {dep}, which is {drec.state}" + (f" ({drec.code})" if drec.code else "")
                if patch.required:  # needed and required: a missing dependency must not read as a skip
                    ledger.required_failed(patch, FailureCode.requires, reason, f"{dep} applied", drec.state)
                    return SETTLED
                rec.set(SKIPPED, FailureCode.requires, reason, f"{dep} applied", drec.state)
                ledger.warn(rec, f"optional patch {patch.key} is needed here but {reason}")
                return SETTLED
        why = self.unavailable.get(patch.id)
        if why is not None:
            if kind.refuses:  # its condition holds: refuse, even with no pin to check
                self.decided.add(patch.id)
                return Verified()
            if not patch.required:
                rec.set(SKIPPED, FailureCode.unavailable, f"needed here but {why.reason}", "an entry in the manifest",
                        why.code)
                ledger.warn(rec, f"optional patch {patch.key} is needed here but cannot be applied on vLLM "
                                 f"{ledger.vllm_version}: {why.reason}")
                return SETTLED
            if allowed_unpatched(patch.id):
                rec.set(SKIPPED, FailureCode.unpatched_allowed, f"needed here but {why.reason}; served without it because "
                        f"VLLM_PATCHKIT_ALLOW_UNPATCHED names it", "an entry in the manifest", why.code)
                ledger.warn(rec, f"REQUIRED patch {patch.key} is needed here but cannot be applied on vLLM "
                                 f"{ledger.vllm_version} ({why.reason}); serving WITHOUT it because "
                                 "VLLM_PATCHKIT_ALLOW_UNPATCHED names it")
                return SETTLED
            return NeededButUnavailable(why)
        if waits_for is not None:
            module = self.waits_for(waits_for)
            return Deferred(module, f"requires {waits_for}, which waits for {module} to be imported")
        if self.lazy and kind.changes_target and patch.target is not None:
            module = Target.parse(patch.target).module
            if module not in sys.modules:
                return Deferred(module, f"its target module {module} is not imported")
        # a `uses` place whose module vLLM has not imported is verified when it is, never imported here for it
        later = frozenset(s for s in patch.uses if self.lazy and Target.parse(s).module not in sys.modules)
        if self.pins_of is not None:  # another release's calls say nothing of this one's: every call is judged
            entry = nearest.without_calls(entry)
        result = verify(patch, entry, self.pinned_by, later)
        if not isinstance(result, Finding):
            result = kind.choose(patch, result, vllm_config)
        if isinstance(result, Skip):
            rec.set(SKIPPED, result.code, result.reason, result.expected, result.found)
            return SETTLED
        if isinstance(result, Finding):
            if self.pins_of is not None:  # a release no manifest pins: say whose pins the difference is from
                result = nearest.judged(result, self.pins_of, ledger.vllm_version)
            rec.findings.extend({"code": FailureCode.breakage, **b.as_dict(), "patch": patch.key} for b in result.breakages)
            if patch.required:
                ledger.required_failed(patch, result.code, result.reason, result.expected, result.found)
                return SETTLED
            rec.set(FAILED, result.code, result.reason, result.expected, result.found)
            return SETTLED
        self.decided.add(patch.id)
        if self.pins_of is not None:  # verified against another release's pins: its record (and status) say so
            nearest.mark_verified(rec.detail, self.pins_of, ledger.vllm_version)
        return result

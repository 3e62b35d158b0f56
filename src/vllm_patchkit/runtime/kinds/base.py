"""A kind: how one sort of patch changes vLLM, as the loader asks it.

The loader runs the same pipeline for every patch (needed? available? verified? apply, record) and asks the
patch's kind only what differs: whether it changes an object at a target (then it can wait for the target's
module), whether what it installs is a function (then stale copies, stacking and "still in place" are watched),
how it is applied and what it adds to the record. It never branches on which kind a patch is.
"""

from __future__ import annotations

import os
from typing import Any, Callable, ClassVar, NamedTuple, Optional

from vllm_patchkit.declaration.kinds import declaration_of
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.apply import install


class Skip(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """A patch that turns out not to be needed after verification (a subclass already selected by the user)."""

    code: str
    reason: str
    expected: Any = None
    found: Any = None


def counting(patch: Patch) -> bool:
    """Count calls unless the patch or the operator ($VLLM_PATCHKIT_COUNT_CALLS=0) says not to."""
    return patch.count_calls and os.environ.get("VLLM_PATCHKIT_COUNT_CALLS", "1") != "0"


class PatchKind:
    """The defaults: a kind that changes nothing by itself (each kind overrides what it does)."""

    name: ClassVar[str] = ""
    #: it changes an object at `target`: deferred until the target's module is imported (lazy loading)
    changes_target: ClassVar[bool] = False
    #: its whole effect is to stop start-up when its `when` holds (nothing to pin or install)
    refuses: ClassVar[bool] = False
    #: how a finding names what it installed
    installed_name: ClassVar[str] = "object"

    # what it does at its target is its row's (declaration/kinds.py), read by the layers below the runtime too
    @property
    def installs_function(self) -> bool:
        """It installs a function at its places: stale copies, stacking and "still in place" are watched."""
        return declaration_of(self.name).installs_function

    @property
    def selects_class(self) -> bool:
        """It selects a class through a config field: the classes in use are read again once it applied."""
        return declaration_of(self.name).selects_class

    def not_needed(self, unmet: Any) -> str:
        """The skip reason when its preconditions do not hold."""
        return str(unmet)

    def choose(self, patch: Patch, verified: Any, vllm_config: Any) -> Any:
        """After verification, before anything is installed: the Verified to apply, a Finding, or a Skip."""
        return verified

    def apply(self, patch: Patch, verified: Any, record: Any, flush: Callable[[], Any]) -> tuple[Optional[Applied], dict]:
        """Install; returns what undo needs (None: nothing to undo) and what goes into the record's detail."""
        return Applied(patch), {}

    def report(self, applied: Applied, record: Any, steps: Optional[int]) -> None:
        """At each flush, after the counters are read: findings that only running reveals."""


class AtPlaces(PatchKind):
    """A kind that changes the object at `target` (and at every declared copy holding it): installed by
    `apply.install`, recorded with the places it now stands at."""

    changes_target = True

    def context(self, patch: Patch, record: Any, flush: Callable[[], Any]) -> Any:
        """The PatchContext its implementation is handed, if it takes one."""
        return None

    def apply(self, patch, verified, record, flush):
        applied = install(patch, verified.place, verified.copies, verified.impl, counting(patch),
                          self.context(patch, record, flush))
        return applied, {"places": [place.spec for place, _ in applied.places]}

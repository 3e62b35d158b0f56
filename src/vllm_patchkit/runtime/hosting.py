"""A process that runs another role's code too: EngineCore inside the front end (VLLM_ENABLE_V1_MULTIPROCESSING=0),
a worker inside EngineCore (the `uni` executor, vLLM's default on one GPU) or inside that front end.

vLLM loads the plugins once per process, so the role found then (`process.detect_role`) is the first one only.
The optional core hooks `core.hosted.engine-core` and `core.hosted.worker` (hooks/hosted_*.yaml, the same
functions as the config-ready points) are installed in the processes that can host those roles and say when the
role's code starts here; its patches are then planned, judged and applied here with that config, both stages, as
in a process of their own (`Loader.host`); where vLLM's configuration says a role will run here, its hook must be
in place (`Hosting.check`). Skipping them as "not for this process" would leave a required fix absent
(a worker's patch in a one-GPU EngineCore) while the status read OK.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.record import APPLIED, FAILED, NOT_IMPORTED, PENDING, SKIPPED

log = logging.getLogger("vllm.patchkit")

#: the optional core hook that marks each hostable role's start in a process of another role
HOOKS = {"engine_core": "core.hosted.engine-core", "worker": "core.hosted.worker"}


def expected_hosts(role: str, vllm_config: Any) -> dict[str, str]:
    """The roles a process of `role` will host by vLLM's own configuration, with why: the front end runs EngineCore
    in-process without multiprocessing; EngineCore builds the worker in-process with the uni executor (or under an
    external launcher)."""
    out = {}
    if role == "frontend" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
        out["engine_core"] = "VLLM_ENABLE_V1_MULTIPROCESSING=0"
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    if role == "engine_core" and backend in ("uni", "external_launcher"):
        out["worker"] = f"distributed_executor_backend={backend}"
    return out


class Hosting:
    """The roles this process hosts besides its own; owns `hosted`. Reopens the patches of a role it admits and
    checks that every role vLLM's configuration puts here can be admitted; judging them is the loader's."""

    def __init__(self, role: str, ledger: Ledger):
        self.role = role
        self.ledger = ledger
        self.hosted: set[str] = set()

    def hosts(self, role: str) -> bool:
        return role == self.role or role in self.hosted

    def admit(self, role: str, plan: list[tuple[Patch, Optional[ManifestEntry], str]]) -> bool:
        """`role`'s code starts in this process (its config-ready point ran here): its patches, until now skipped
        as not for this process, go back to pending for the loader to judge; the record says which roles the
        process hosts. False when it is hosted already (nothing to judge again)."""
        if self.hosts(role):
            return False
        self.hosted.add(role)
        process = self.ledger.process
        process.hosts = sorted(self.hosted)
        reopened = []
        for patch, _, _ in plan:
            rec = self.ledger.records[patch.id]
            if rec.state == SKIPPED and rec.code == FailureCode.process and role in {p.value for p in patch.processes}:
                rec.set(PENDING, reason="")
                reopened.append(patch.key)
        log.info("vllm-patchkit: %s (pid %d) also runs %s's code here: %d patch(es) judged for it: %s", self.role,
                 os.getpid(), role, len(reopened), ", ".join(reopened) or "none")
        process.notes.append(f"hosts {role} (its config-ready point ran in this process): "
                             f"{len(reopened)} patch(es) for it judged here")
        return True

    def check(self, as_role: str, vllm_config: Any) -> None:
        """The hooks are optional (a process that hosts nothing may never import their modules), so a hook that
        could not be installed where vLLM's configuration says the role's code will run (a pin broken on a new
        release) is a failure of a required patch: else that role's patches would read "not for this process"
        and the status OK."""
        for role, why in expected_hosts(as_role, vllm_config).items():
            rec = self.ledger.records.get(HOOKS[role])
            if rec is None or rec.state in (APPLIED, NOT_IMPORTED, PENDING):
                continue  # not in these sets (narrowed by hand), or in place or waiting for its module
            reason = (f"this process will run {role}'s code too ({why}) and its hook is {rec.state.value}"
                      f" ({rec.reason or rec.code}): {role}'s patches would not be judged here")
            if rec.state != FAILED:
                rec.set(FAILED, FailureCode.hosting, reason, "applied", rec.state.value)
            else:
                rec.reason = reason
            rec.required = True
            self.ledger.fail_closed()

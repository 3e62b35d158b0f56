"""A process that runs another role's code too: EngineCore inside the front end (VLLM_ENABLE_V1_MULTIPROCESSING=0),
a worker inside EngineCore (the `uni` executor, vLLM's default on one GPU) or inside that front end.

vLLM loads the plugins once per process, so the role found then (`process.detect_role`) is the first one only.
The optional core hooks `core.hosted.engine-core` and `core.hosted.worker` (hooks/hosted_*.yaml, the same
functions as the config-ready points) are installed in the processes that can host those roles and say when the
role's code starts here; its patches are then planned, judged and applied here with that config, both stages, as
in a process of their own; where vLLM's configuration says a role will run here, its hook must be in place
(`check_hosting`). Skipping them as "not for this process" would leave a required fix absent
(a worker's patch in a one-GPU EngineCore) while the status read OK.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm_patchkit.declaration.preconditions import config_facts
from vllm_patchkit.runtime.record import APPLIED, FAILED, NOT_IMPORTED, PENDING, SKIPPED
from vllm_patchkit.runtime.shadow import classes_in_use

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
    """The Loader's part for roles this process hosts besides its own (`hosted`)."""

    def check_hosting(self, as_role: str, vllm_config: Any) -> None:
        """The hooks are optional (a process that hosts nothing may never import their modules), so a hook that
        could not be installed where vLLM's configuration says the role's code will run (a pin broken on a new
        release) is a failure of a required patch: else that role's patches would read "not for this process"
        and the status OK."""
        for role, why in expected_hosts(as_role, vllm_config).items():
            rec = self.records.get(HOOKS[role])
            if rec is None or rec.state in (APPLIED, NOT_IMPORTED, PENDING):
                continue  # not in these sets (narrowed by hand), or in place or waiting for its module
            reason = (f"this process will run {role}'s code too ({why}) and its hook is {rec.state.value}"
                      f" ({rec.reason or rec.code}): {role}'s patches would not be judged here")
            if rec.state != FAILED:
                rec.set(FAILED, "hosting", reason, "applied", rec.state.value)
            else:
                rec.reason = reason
            rec.required = True
            self._fail_closed()

    def hosts(self, role: str) -> bool:
        return role == self.role or role in self.hosted

    def host(self, role: str, vllm_config: Any) -> None:
        """`role`'s code starts in this process (its config-ready point ran here): its patches, until now skipped
        as not for this process, are judged and applied here; the record says which roles the process hosts."""
        if self.hosts(role):
            return
        self.hosted.add(role)
        self.process.hosts = sorted(self.hosted)
        reopened = []
        for patch, _, _ in self.plan:
            rec = self.records[patch.id]
            if rec.state == SKIPPED and rec.code == "process" and role in {p.value for p in patch.processes}:
                rec.set(PENDING, reason="")
                reopened.append(patch.key)
        log.info("vllm-patchkit: %s (pid %d) also runs %s's code here: %d patch(es) judged for it: %s", self.role,
                 os.getpid(), role, len(reopened), ", ".join(reopened) or "none")
        self.process.notes.append(f"hosts {role} (its config-ready point ran in this process): "
                                  f"{len(reopened)} patch(es) for it judged here")
        self._run_stage("import", None)
        cfg = config_facts(vllm_config)
        cfg["classes"] = classes_in_use(vllm_config, role, cfg.get("runner"))
        self._run_stage("config", cfg)
        self.check_hosting(role, vllm_config)
        self.flush()

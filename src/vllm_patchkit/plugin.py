"""vLLM's `vllm.general_plugins` entry point: vLLM calls it once in every process.

That makes it the one place that reaches the front end, EngineCore and every
worker alike (a platform plugin's hooks are not guaranteed to run).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import envs, runtime
from .flush import Flusher
from .knobs import KNOBS
from .loader import Loader
from .process import detect_role

log = logging.getLogger("vllm.patchkit")


def extra_patch_dirs() -> list[Path]:
    raw = os.environ.get("VLLM_PATCHKIT_EXTRA_PATCHES", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def register() -> None:
    """Load, verify and apply the import-stage patches for this process."""
    if os.environ.get("VLLM_PATCHKIT_DISABLE") == "1":
        log.warning("vllm-patchkit: disabled by VLLM_PATCHKIT_DISABLE=1; no patch applied in pid %d", os.getpid())
        return
    role = detect_role()
    if role == "inspect":
        return  # vLLM's throw-away model-inspection subprocess: nothing of ours runs there
    envs.register(KNOBS, constant=True)  # never part of vLLM's compile cache key
    loader = Loader.builtin(role=role, extra_patch_dirs=extra_patch_dirs())
    envs.register(ev for p in loader.patch_set.patches.values() for ev in p.env_vars)
    runtime.install(loader)
    Flusher(loader).start()
    loader.run_import_stage()

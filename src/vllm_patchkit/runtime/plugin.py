"""vLLM's `vllm.general_plugins` entry point: vLLM calls it once in every process.

That makes it the one place that reaches the front end, EngineCore and every
worker alike (a platform plugin's hooks are not guaranteed to run).
"""

from __future__ import annotations

import logging
import os
import time

from vllm_patchkit.declaration import envs
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.flush import Flusher
from vllm_patchkit.declaration.knobs import KNOBS
from vllm_patchkit.declaration.errors import PatchkitError
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.runtime.record import ProcessRecord, default_status_dir, process_file, run_id, write_atomic
from vllm_patchkit.runtime.process import detect_role

log = logging.getLogger("vllm.patchkit")


def _record_startup_error(role: str, exc: BaseException) -> None:
    """A start-up that dies before a loader exists still leaves a record for `status` (exit 1)."""
    rec = ProcessRecord(run_id=run_id(), role=role, pid=os.getpid(), ppid=os.getppid(), vllm_version=_vllm_version(),
                        manifest=None, started=time.time(), updated=time.time(), error=f"{type(exc).__name__}: {exc}")
    try:
        write_atomic(process_file(default_status_dir(), rec), rec.to_json())
    except (OSError, RuntimeError) as werr:
        log.warning("vllm-patchkit: could not record the start-up error: %s", werr)


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # the record is about our error, not vLLM's
        return "?"


def _flush_current() -> None:
    loader = runtime.current()
    if loader is not None:
        loader.flush()


def register() -> None:
    """Load, verify and apply the import-stage patches for this process."""
    if os.environ.get("VLLM_PATCHKIT_DISABLE") == "1":
        log.warning("vllm-patchkit: disabled by VLLM_PATCHKIT_DISABLE=1; no patch applied in pid %d", os.getpid())
        return
    role = detect_role()
    if role == "inspect":
        return  # vLLM's throw-away model-inspection subprocess: nothing of ours runs there
    envs.register(KNOBS, constant=True)  # never part of vLLM's compile cache key
    try:
        # lazy: a target module not imported yet is patched when vLLM imports it (lazy.py), never imported here
        loader = Loader.builtin(role=role, lazy=True)
    except PatchkitError as exc:
        _record_startup_error(role, exc)
        log.error("vllm-patchkit: start-up stopped in %s (pid %d): %s", role, os.getpid(), exc)
        raise
    envs.register(ev for p in loader.patch_set.patches.values() for ev in p.env_vars)
    runtime.install(loader)
    Flusher(loader).start()
    from vllm_patchkit.runtime import raised
    from vllm_patchkit.runtime.process import install_end_handlers

    raised.ALERT = _flush_current  # a patch's first exception of a kind reaches the disk at once (a crash may follow)

    install_end_handlers(loader)  # SIGTERM/SIGINT noted in the record (how the process ended), then chained on
    loader.run_import_stage()

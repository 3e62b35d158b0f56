"""Flushing: counts reach the status directory with bounded staleness, and on exit.

A daemon thread wakes every `VLLM_PATCHKIT_FLUSH_SECONDS` and rewrites the
process's record file only when some count changed (or an applied patch was
found replaced by someone else since: `Loader.check_in_place`), so the hot path
does no flush work at all. At interpreter exit (a clean stop, or vLLM's SIGTERM
handlers raising SystemExit) one last flush loses no call. A SIGKILL loses at
most one interval.

A write that fails (a full disk, a read-only folder) is a state, not a loss: the record in memory says since
when its newest state is not on disk (`unpersisted_since`), the first failure is logged once, and every later
tick retries until a write succeeds; nothing counts as written before the file's rename. So that `status`
can tell a live process's record that stopped being written from one with nothing new, the flusher rewrites
the file at least every `refresh_seconds` (REFRESH_INTERVALS intervals, at least REFRESH_MIN_SECONDS), both
written into the record (reporting/verdict.py judges a live process's record older than that as stale).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time
from pathlib import Path
from typing import Optional

from vllm_patchkit.runtime.record import ProcessRecord, default_status_dir, process_file, write_atomic

INTERVAL_ENV = "VLLM_PATCHKIT_FLUSH_SECONDS"
REFRESH_INTERVALS = 10
REFRESH_MIN_SECONDS = 30.0

log = logging.getLogger("vllm.patchkit")


def write_record(process: ProcessRecord, status_dir: Optional[Path]) -> Optional[Path]:
    """Write `process` to its file; the path, or None when it could not be written (then the record in memory
    says since when, and why: the next flush retries). Logs the first failure of a run of them, and the write
    that ends it."""
    try:
        path = process_file(status_dir or default_status_dir(), process)
    except RuntimeError as exc:  # Path.home() with no home directory (arbitrary uid in a container)
        if process.unpersisted_since is None:
            log.warning("vllm-patchkit: no status directory (%s); set VLLM_PATCHKIT_STATUS_DIR", exc)
        _failed(process, f"no status directory ({exc})")
        return None
    since = process.unpersisted_since
    process.unpersisted_since = None  # what the file says once written: this state is on disk
    try:
        write_atomic(path, process.to_json())
    except OSError as exc:
        process.unpersisted_since = since
        if since is None:
            log.warning("vllm-patchkit: cannot write records to %s: %s; `vllm-patchkit status` does not see this "
                        "process's newest state until a write succeeds (retried at every flush)", path, exc)
        _failed(process, f"{path}: {exc}")
        return None
    if since is not None:
        log.warning("vllm-patchkit: records written again to %s (not on disk since %s, %d failed write(s): %s)",
                    path, time.strftime("%H:%M:%S", time.localtime(since)), process.write_failures,
                    process.write_error)
    return path


def _failed(process: ProcessRecord, error: str) -> None:
    if process.unpersisted_since is None:
        process.unpersisted_since = time.time()
    process.write_failures += 1
    process.write_error = error


class Flusher:
    def __init__(self, loader, interval: Optional[float] = None):
        self.loader = loader
        self.interval = interval if interval is not None else float(os.environ.get(INTERVAL_ENV, "2"))
        self.refresh = max(REFRESH_MIN_SECONDS, REFRESH_INTERVALS * self.interval)
        self._stop = threading.Event()
        self._last = -1
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()
        self._searched = 0  # the last start-up phase whose stale-copy search ran (see _search_stale)

    def start(self) -> "Flusher":
        from vllm_patchkit.runtime import process as process_mod

        proc = self.loader.process  # who this process is, so `status` can tell it from a later one with its pid
        proc.hostname, proc.boot_id = process_mod.HOSTNAME, process_mod.boot_id()
        proc.start_ticks = process_mod.start_ticks(os.getpid())
        if self.interval > 0:  # what a reader may expect of this process's file while it lives
            proc.flush_seconds, proc.refresh_seconds = self.interval, self.refresh
        # vLLM's EngineCore and workers are multiprocessing children, which leave through
        # os._exit() without running atexit; their finalizers do run, so register both.
        atexit.register(self.final)
        multiprocessing.util.Finalize(None, self.final, exitpriority=100)
        if self.interval > 0:
            self._thread = threading.Thread(target=self._run, name="vllm-patchkit-flush", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> bool:
        """Flush if anything changed since the last write, if the last write failed, or if the file is due for
        its refresh; True when it wrote. Nothing counts as written until the write succeeded."""
        if os.getpid() != self._pid:
            return False  # a forked child must never overwrite its parent's file
        found = self._search_stale()
        replaced = self._check_in_place()
        total = self.loader.sync_calls()
        proc = self.loader.process
        unwritten = proc.unpersisted_since is not None
        due = time.time() - (proc.updated or 0.0) >= self.refresh
        if total == self._last and not found and not replaced and not unwritten and not due:
            return False
        wrote = self.loader.flush() is not None
        if wrote:
            self._last = total
        return wrote

    def _search_stale(self) -> int:
        """The full stale-copy search, once after the config stage and once after the first step: by then the
        modules a process imports after start-up (the plugin's, the model's, lazily patched ones) are in."""
        process = self.loader.process
        phase = 2 if process.steps else 1 if process.config else 0
        if phase <= self._searched or not hasattr(self.loader, "rescan_stale"):
            return 0
        self._searched = phase
        try:
            return self.loader.rescan_stale()
        except Exception as exc:  # a search must never stop the flusher
            logging.getLogger("vllm.patchkit").warning("vllm-patchkit: stale-copy search failed: %s", exc)
            return 0

    def _check_in_place(self) -> int:
        """Applied patches whose object a later `setattr` replaced (`Loader.check_in_place`): each becomes a
        `replaced_after_apply` failure, written at this flush."""
        check = getattr(self.loader, "check_in_place", None)
        if check is None:
            return 0
        try:
            return check()
        except Exception as exc:  # a check must never stop the flusher
            logging.getLogger("vllm.patchkit").warning("vllm-patchkit: in-place check failed: %s", exc)
            return 0

    def final(self) -> None:
        if self._stop.is_set() or os.getpid() != self._pid:
            return
        self._stop.set()
        proc = self.loader.process
        proc.exited = True
        proc.end, proc.ended_at = "clean", time.time()
        self.loader.flush()

"""Flushing: counts reach the status directory with bounded staleness, and on exit.

A daemon thread wakes every `VLLM_PATCHKIT_FLUSH_SECONDS` and rewrites the
process's record file only when some count changed (or an applied patch was
found replaced by someone else since: `Loader.check_in_place`), so the hot path
does no flush work at all. At interpreter exit (a clean stop, or vLLM's SIGTERM
handlers raising SystemExit) one last flush loses no call. A SIGKILL loses at
most one interval.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading
import time
from typing import Optional

INTERVAL_ENV = "VLLM_PATCHKIT_FLUSH_SECONDS"


class Flusher:
    def __init__(self, loader, interval: Optional[float] = None):
        self.loader = loader
        self.interval = interval if interval is not None else float(os.environ.get(INTERVAL_ENV, "2"))
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
        """Flush if anything changed since the last flush; True when it wrote."""
        if os.getpid() != self._pid:
            return False  # a forked child must never overwrite its parent's file
        found = self._search_stale()
        replaced = self._check_in_place()
        total = self.loader.sync_calls()
        if total == self._last and not found and not replaced:
            return False
        self._last = total
        return self.loader.flush() is not None

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
            import logging

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
            import logging

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

"""Workers' records fetched through vLLM's own channel to its workers, for the API server's status views.

Why: every process writes its record file on its own host. With workers on other machines (multi-node
serving: vLLM's multiprocessing executor with `--nnodes`, or Ray), the API server's status directory lacks
theirs, so /metrics and GET /patchkit/status would show a server without them. vLLM already reaches every
worker wherever it runs: EngineCore's `collective_rpc`, which the API server calls through its engine
client. Each worker (the framework's config-ready hook attaches the answer to the worker object, see
`attach`) answers with its current process record and its host name. `merge` adds to the directory's view
every answer that is not already in it (same host, same pid); the rest stays as the directory says. Merged
processes are judged with the others by `verdict.judge` (an answer's `host` marks it live: its unwritten file
is a warning there, not a problem); nothing here judges a row.

What it cannot see: a worker that never reached its config-ready point (no answer to give), and answers of
another run (ignored, with a warning in the view). A failed or slow gather leaves the view as the directory
shows it and says so in a warning; the route and /metrics never fail because of it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, Optional

from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.record import ProcessRecord

log = logging.getLogger("vllm.patchkit")

#: The name `collective_rpc` resolves on each worker (vLLM's WorkerWrapperBase passes unknown names on to
#: the worker object, where `attach` put it).
RPC_METHOD = "vllm_patchkit_records"
HOST = socket.gethostname()
TIMEOUT_SECONDS = 5.0
CACHE_SECONDS = 1.0


def worker_records() -> Optional[dict]:
    """This worker's answer: its host and its process record as of now (flushed first, so calls are current)."""
    loader = runtime.current()
    if loader is None:
        return None
    loader.flush()
    loader.process.patches = list(loader.records.values())
    return {"host": HOST, "record": loader.process.to_json()}


def attach(worker: Any) -> None:
    """Give a vLLM worker object the answer `collective_rpc(RPC_METHOD)` calls. An instance attribute, not a
    class patch: nothing of vLLM's changes, and a worker vLLM did not build through WorkerBase has none."""
    setattr(worker, RPC_METHOD, worker_records)


def merge(run: Any, answers: list, local_host: str = HOST) -> tuple[Any, int]:
    """The run with every answered record not already in it (host, pid) appended; and how many were added.

    A process read from the directory is this host's; an answer from another host (or a pid the directory
    does not have) is added with its `host`. Answers of another run are left out with a warning."""
    from vllm_patchkit.reporting.run_folder import Run

    if run is None:
        ids = {a["record"].get("run_id") for a in answers if a}
        if len(ids) != 1:
            return run, 0
        run = Run(ids.pop(), [], [])
    have = {(local_host, p.get("pid")) for p in run.processes if "host" not in p}
    have |= {(p.get("host"), p.get("pid")) for p in run.processes if "host" in p}
    added = 0
    for answer in answers:
        if not answer:
            continue
        host, data = answer.get("host"), answer.get("record") or {}
        if data.get("run_id") != run.run_id:
            run.warnings.append(f"ignored the record of pid {data.get('pid')} on {host}: run {data.get('run_id')}, "
                                f"not {run.run_id}")
            continue
        if (host, data.get("pid")) in have:
            continue
        try:
            proc = ProcessRecord.from_json(data).to_json()
        except ValueError as exc:
            run.warnings.append(f"unreadable record from {host}: {str(exc).splitlines()[0]}")
            continue
        run.processes.append({**proc, "host": host})
        have.add((host, data.get("pid")))
        added += 1
    return run, added


class Gatherer:
    """The answers of the server's workers, fetched at most once per CACHE_SECONDS, single-flight."""

    def __init__(self, app: Any, ttl: float = CACHE_SECONDS, timeout: float = TIMEOUT_SECONDS):
        self.app, self.ttl, self.timeout = app, ttl, timeout
        self.answers: list = []
        self.error: Optional[str] = None
        self.at = -1e18
        self._lock: Optional[asyncio.Lock] = None
        self._task: Any = None
        try:  # built in build_app, on the server's loop: /metrics (synchronous) schedules its gathers there
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        from vllm_patchkit.runtime.process import keep_chained

        keep_chained(self._loop)  # the API server's SIGTERM noted (a clean stop of the run), ahead of vLLM's handler

    def _client(self) -> Any:
        state = getattr(self.app, "state", None)
        return getattr(state, "engine_client", None) if state is not None else None

    async def fetch(self) -> list:
        """Current answers (cached); on failure the last ones, with `error` set."""
        if time.monotonic() - self.at < self.ttl:
            return self.answers
        self._loop = asyncio.get_running_loop()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self.at < self.ttl:
                return self.answers
            client = self._client()
            if client is None or not hasattr(client, "collective_rpc"):
                self.answers, self.error = [], None  # no engine (yet): nobody to ask; the directory's view stands
            else:
                try:
                    got = await asyncio.wait_for(client.collective_rpc(RPC_METHOD, timeout=self.timeout),
                                                 self.timeout + 1)
                    self.answers = [a for a in (got or []) if isinstance(a, dict)]
                    self.error = None
                except Exception as exc:  # never fail the route or /metrics because of a gather
                    self.error = f"{type(exc).__name__}: {exc}"
                    log.warning("vllm-patchkit: could not gather the workers' records: %s", self.error)
            self.at = time.monotonic()
        return self.answers

    def refresh_soon(self) -> None:
        """From a synchronous reader (/metrics): start a fetch on the server's loop, do not wait for it."""
        loop = self._loop
        if loop is None or loop.is_closed() or time.monotonic() - self.at < self.ttl:
            return
        if self._task is not None and not self._task.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._task = loop.create_task(self.fetch())
        else:
            self._task = asyncio.run_coroutine_threadsafe(self.fetch(), loop)

    def apply(self, run: Any) -> Any:
        """The run with the last answers merged in; a failed gather is a warning of the view."""
        run, added = merge(run, list(self.answers))
        if run is not None and self.error:
            run.warnings.append(f"workers' records not gathered over collective_rpc: {self.error}")
        return run

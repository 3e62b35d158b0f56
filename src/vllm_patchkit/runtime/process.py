"""Which vLLM process is this? Told by who called the plugin entry point.

vLLM calls `load_general_plugins()` from a known place in each process, so the
caller's frame is a reliable role signal; process titles are set later in some
processes and not at all in others.
"""

from __future__ import annotations

import os
import sys

from vllm_patchkit.declaration.names import Target

ROLE_ENV = "VLLM_PATCHKIT_ROLE"

# The callers of `load_general_plugins()` that tell the roles apart, as `module:Qualname` specs.
# Each is pinned as a `uses` of the framework's config-ready hook of that role (src/vllm_patchkit/hooks/),
# so `vllm-patchkit check` and the manifests catch it when vLLM moves or renames it
# (tests/framework/test_plugin.py checks the two lists agree).
CALLERS = (
    ("vllm.v1.engine.core:EngineCore.__init__", "engine_core"),
    ("vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker", "worker"),
    ("vllm.model_executor.models.registry:_run", "inspect"),
)


def _frame_key(spec: str) -> tuple[str, str]:
    """(file path suffix, function name) of a spec, matched against a frame's code."""
    target = Target.parse(spec)
    return os.path.join(*target.module.split(".")) + ".py", target.attr


_CALLERS = tuple((*_frame_key(spec), role) for spec, role in CALLERS)


def detect_role(max_depth: int = 40) -> str:
    """Role of this process from the call stack; $VLLM_PATCHKIT_ROLE wins when set."""
    forced = os.environ.get(ROLE_ENV)
    if forced:
        return forced
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        code = frame.f_code
        for fragment, func, role in _CALLERS:
            if code.co_name == func and code.co_filename.endswith(fragment):
                return role
        frame = frame.f_back
        depth += 1
    return "frontend"


# -- how a process ended (issue 21: a crash is a state) -----------------------------------------------------
# Identity: /proc/<pid>/stat's starttime (field 22) tells this process from a later one given the same pid;
# the boot id and host name say whether a pid in a record can be checked here at all.

import signal as _signal
import socket as _socket
import time as _time
from pathlib import Path as _Path
from typing import Any, Optional

HOSTNAME = _socket.gethostname()


def boot_id() -> Optional[str]:
    try:
        return _Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _stat_fields(pid: int) -> Optional[list[str]]:
    try:
        text = _Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[1].split()  # fields from 3 (state) on: index = field number - 3


def start_ticks(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def liveness(pid: int, ticks: Optional[int]) -> tuple[str, Optional[int]]:
    """("alive" | "gone" | "reused", signal): gone when there is no such process or it is a zombie (its wait
    status, field 52, then names the signal that killed it, when it did), reused when the pid now belongs to a
    process started at another time than the record says."""
    fields = _stat_fields(pid)
    if fields is None:
        return "gone", None
    if ticks is not None and len(fields) > 19 and int(fields[19]) != ticks:
        return "reused", None
    if fields[0] in ("Z", "X"):
        sig = None
        if len(fields) > 49:
            status = int(fields[49])
            sig = (status & 0x7F) or None
        return "gone", sig
    return "alive", None


_loader: Any = None
_chained: dict[int, Any] = {}  # signal number -> our handler installed for it


def _note_signal(signum: int) -> None:
    loader = _loader
    if loader is None:
        return
    proc = loader.process
    if proc.end != "clean":
        proc.end, proc.end_signal, proc.ended_at = "signal", int(signum), _time.time()
    else:
        proc.end_signal = int(signum)
    if proc.role == "frontend" and proc.shutdown is None:
        proc.shutdown = {"signal": int(signum), "at": _time.time(), "alive": _alive_in_run(loader)}
    try:
        loader.flush()
    except Exception:  # noqa: BLE001 - a signal handler must never fail the shutdown it observes
        pass


def _alive_in_run(loader: Any) -> list[int]:
    """Pids of this run's processes (from the record files' names, `<role>-<pid>.json`) alive right now."""
    from vllm_patchkit.runtime.record import default_status_dir

    try:
        folder = (loader.status_dir or default_status_dir()) / loader.process.run_id
        names = [n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")]
    except (OSError, RuntimeError):
        return []
    out = []
    for name in names:
        try:
            pid = int(name[:-5].rsplit("-", 1)[1])
        except (IndexError, ValueError):
            continue
        if liveness(pid, None)[0] == "alive":
            out.append(pid)
    return sorted(out)


def _chain(signum: int) -> bool:
    """Put our handler in front of the current one for `signum` (main thread only); True when it is ours now."""
    current = _signal.getsignal(signum)
    if current is _chained.get(signum):
        return True

    def handler(sig, frame, _prev=current):
        _note_signal(sig)
        if callable(_prev):
            return _prev(sig, frame)
        if _prev == _signal.SIG_DFL:  # die by the signal as the process would have
            _signal.signal(sig, _signal.SIG_DFL)
            _signal.raise_signal(sig)
        return None

    try:
        _signal.signal(signum, handler)
    except (ValueError, OSError):  # not the main thread, or not a signal we may handle
        return False
    _chained[signum] = handler
    return True


def install_end_handlers(loader: Any) -> None:
    """Note SIGTERM/SIGINT in this process's record (end "signal"; the front end's `shutdown`), chaining to the
    handler in place. vLLM installs its own later in EngineCore (ours is then replaced: its end is inferred)
    and in the API server's event loop (`keep_chained` puts ours back in front of it)."""
    global _loader
    _loader = loader
    for sig in (_signal.SIGTERM, _signal.SIGINT):
        _chain(sig)


def keep_chained(loop: Any, every: float = 0.1) -> None:
    """From the API server's loop (the main thread): put our handlers back in front whenever another one
    replaced them (vLLM's serve_http adds the loop's handlers after the app is built)."""
    if _loader is None or loop is None:
        return

    def check():
        ok = all(_chain(sig) for sig in (_signal.SIGTERM, _signal.SIGINT))
        if not loop.is_closed():
            loop.call_later(every if not ok else min(1.0, every * 5), check)

    try:
        loop.call_soon_threadsafe(check)
    except RuntimeError:  # the loop is closed
        pass

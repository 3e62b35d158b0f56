"""Records: the outcome of every patch in one process, written where `status` can find them.

One JSON file per process, replaced atomically (temp file + rename), in a
per-user directory created 0700. Runs are folders named by a run id that the
first process of a server creates and its children inherit through the
environment, so records of an older run never mix with a newer one.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import msgspec
from msgspec import Struct, field

from vllm_patchkit.upstream.files import ensure_dir

STATUS_DIR_ENV = "VLLM_PATCHKIT_STATUS_DIR"
RUN_ID_ENV = "VLLM_PATCHKIT_RUN_ID"
# 2: state enum, `warning` per patch, `warnings`/`error` per process; 3: state not_imported; 4: how the process
# ended (`end`, `end_signal`, `ended_at`), its identity (`hostname`, `boot_id`, `start_ticks`) and the front end's
# `shutdown` (a clean stop of the run: the signal and which processes of the run were alive then); 5: exceptions
# out of an installed function per patch (`raised`, `passed_through`, `exceptions`), and per process how its
# records reach the disk (`flush_seconds`, `refresh_seconds`, `unpersisted_since`, `write_failures`, `write_error`)
SCHEMA_VERSION = 5


class State(str, Enum):
    """What happened to a patch in one process (a str, so records compare with plain strings)."""

    applied = "applied"
    skipped = "skipped"
    failed = "failed"
    refused = "refused"
    pending = "pending"
    # needed here and verifiable, but its target module was never imported in this process, so the code
    # it changes never ran here; it is applied (and verified) the moment that module is imported (lazy.py)
    not_imported = "not_imported"

    def __str__(self) -> str:
        return self.value


APPLIED, SKIPPED, FAILED, REFUSED, PENDING = State.applied, State.skipped, State.failed, State.refused, State.pending
NOT_IMPORTED = State.not_imported


def jsonable(value: Any) -> Any:
    """Plain JSON data: enums as their values, tuples and sets as lists, anything else a patch put in `detail` as
    its str (what `status` reads back)."""
    if isinstance(value, Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, Struct):
        return {name: jsonable(getattr(value, name)) for name in value.__struct_fields__}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump(mode="json"))
    return str(value)


# Records are msgspec Structs (a class costs ~0.02 ms to make, a dataclass 0.4-0.8 ms: start-up makes a dozen),
# mutated in place by the loader (a counter copy is the hot path) and written as JSON: nothing of pydantic on the
# start-up path. They are validated when read back (`ProcessRecord.from_json`, msgspec's typed conversion).
class PatchRecord(Struct, kw_only=True):
    """What happened to one patch in one process, with the evidence."""

    patch: str  # id@version
    patch_set: Optional[str] = None  # the name of the patch set it came from (see patchsets.py)
    kind: str
    required: bool
    stage: str
    target: Optional[str] = None
    state: State = State.pending
    code: Optional[str] = None  # machine-readable cause: precondition, fingerprint, conflict, unavailable, ...
    reason: str = ""
    expected: Any = None
    found: Any = None
    findings: list[dict] = field(default_factory=list)
    expected_calls: str = "never_counted"
    calls: int = 0
    # exceptions out of its installed function (runtime/raised.py): its own code's, and vLLM's original's that
    # passed through it; `exceptions`: each distinct one {type, message (first line), at (file:line in the
    # implementation), raised_in (the innermost frame, when elsewhere), passed_through, count, first, last}
    raised: int = 0
    passed_through: int = 0
    exceptions: list[dict] = field(default_factory=list)
    detail: dict = field(default_factory=dict)
    warning: Optional[str] = None  # set when this row must be shown as a warning (needed but not applied, ...)
    at: float = 0.0

    def set(self, state: str, code: Optional[str] = None, reason: str = "", expected: Any = None, found: Any = None):
        self.state, self.code, self.reason, self.expected, self.found = State(state), code, reason, expected, found
        self.at = time.time()
        return self


class ProcessRecord(Struct, kw_only=True):
    """One process's records; one JSON file per process (see module docstring)."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    role: str
    hosts: list[str] = field(default_factory=list)  # other roles whose code ran in this process too (hosting.py)
    pid: int
    ppid: int
    vllm_version: str
    manifest: Optional[str] = None
    started: float
    updated: float = 0.0
    config: dict = field(default_factory=dict)
    steps: Optional[int] = None  # calls of this process's step-counting core patch, if any
    exited: bool = False  # True once the last flush ran at interpreter exit
    # identity, to tell this process from a later one with the same pid (written by the plugin's flusher;
    # None in records of loaders made by hand, whose end is then not judged): /proc/<pid>/stat starttime
    hostname: Optional[str] = None
    boot_id: Optional[str] = None
    start_ticks: Optional[int] = None
    # how it ended: None (not written: running, or gone without a word), "clean" (the exit flush ran),
    # "signal" (a signal handler noted `end_signal` and the exit flush never ran)
    end: Optional[str] = None
    end_signal: Optional[int] = None  # the signal noted (kept after a clean exit that followed it)
    ended_at: Optional[float] = None
    # front end only: a requested stop of the server (SIGTERM/SIGINT): {"signal", "at", "alive": [pids of the run
    # alive at that moment]}; processes that vanish after it were stopped with the run, not crashed
    shutdown: Optional[dict] = None
    patches: list[PatchRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # process-level: no manifest pins this release, nearest used
    error: Optional[str] = None  # why start-up stopped here (declaration error, refusal, required failure)
    # counters of a plugin's own components that are not patches (its copier, a stand-in executor):
    # source -> name -> count, added with `vllm_patchkit.runtime.state.count`
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    # how the records reach the disk (flush.py): the flusher's interval and the longest a live process leaves
    # its file unwritten (None: no flusher, nothing promised); since when the newest state is not on disk (set
    # in memory when a write fails, so only a record read from the process itself, a gather's, shows it);
    # failed writes in all, and the last one's error (kept after a later write succeeded)
    flush_seconds: Optional[float] = None
    refresh_seconds: Optional[float] = None
    unpersisted_since: Optional[float] = None
    write_failures: int = 0
    write_error: Optional[str] = None

    def to_json(self) -> dict:
        """Plain JSON data; states as their strings, anything else a patch put in `detail` as str."""
        return jsonable(self)

    @classmethod
    def from_json(cls, data: Any) -> "ProcessRecord":
        """Read a record file's content back (raises msgspec.ValidationError, a ValueError, on a malformed one;
        unknown keys are ignored, so a newer writer's additions do not stop an older reader)."""
        return msgspec.convert(data, cls)


def default_status_dir() -> Path:
    """$VLLM_PATCHKIT_STATUS_DIR, else $XDG_RUNTIME_DIR/vllm-patchkit, else ~/.cache/vllm-patchkit/status."""
    env = os.environ.get(STATUS_DIR_ENV)
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "vllm-patchkit"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "vllm-patchkit" / "status"


def run_id() -> str:
    """This server run's id: inherited from the parent process, or made here (and exported)."""
    rid = os.environ.get(RUN_ID_ENV)
    if not rid:
        rid = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        os.environ[RUN_ID_ENV] = rid
    return rid


def write_atomic(path: Path, data: dict) -> None:
    """Write JSON so a reader sees the old file or the new one, never a torn one."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # msgspec's encoder: json.dump with an indent runs the pure-Python encoder (~0.5 ms for a worker's
        # record, every flush), msgspec ~0.02 ms with the same layout
        with os.fdopen(fd, "wb") as fh:
            fh.write(msgspec.json.format(msgspec.json.encode(data, enc_hook=str), indent=1))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def process_file(base: Path, rec: ProcessRecord) -> Path:
    return base / rec.run_id / f"{rec.role}-{rec.pid}.json"

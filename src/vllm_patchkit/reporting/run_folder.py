"""One server run's folder of process records, read defensively.

Why: `status`, the API server's /patchkit/status and the metrics endpoint read files that any process of the
user (or anything that can write the folder) may have left there. So a record is opened without following a
symlink or blocking on a FIFO, its owner, mode and size are checked on the open descriptor before a byte is
read, its schema_version must be one this reader knows, and every file refused is named with the reason
(`Run.refused`) instead of stopping the read.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Optional

from msgspec import Struct, field

from vllm_patchkit.reporting.storage import full
from vllm_patchkit.upstream.files import trusted_folder, uid
from vllm_patchkit.runtime.record import SCHEMA_VERSION, ProcessRecord

log = logging.getLogger("vllm.patchkit")


class Run(Struct):
    run_id: str
    processes: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # record files not read, each with why (also warnings)
    storage: list[str] = field(default_factory=list)  # why records may be missing: a full file system (storage.py)


#: The largest record file `status` reads, in bytes (a record of a process with every patch of a big set is
#: tens of kB); a larger file is refused by its size, without reading it. Override: VLLM_PATCHKIT_MAX_RECORD_BYTES.
MAX_RECORD_ENV = "VLLM_PATCHKIT_MAX_RECORD_BYTES"
DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024
#: Record files read per run at most (a server has a front end, EngineCore(s) and a worker per GPU). Counted over
#: the files named like a record only (`record_names`), the known roles' first, so other files never crowd them out.
MAX_RECORDS_PER_RUN = 1024
#: The name a process's record file has (`record.process_file`): `<role>-<pid>.json`.
RECORD_NAME = re.compile(r"(?P<role>[A-Za-z0-9_]+)-(?P<pid>[0-9]{1,10})\.json")
#: Roles vLLM's processes have (`runtime.process`), read first: a record of another role is a forced
#: $VLLM_PATCHKIT_ROLE's.
_ROLE_ORDER = {"frontend": 0, "engine_core": 1, "worker": 2}
#: Schema versions of records this reader understands (record.SCHEMA_VERSION is the one written).
KNOWN_SCHEMA_VERSIONS = range(1, SCHEMA_VERSION + 1)

# Open a record without following a symlink (O_NOFOLLOW: ELOOP) and without blocking on a FIFO or a device
# (O_NONBLOCK: a FIFO opens at once, and fstat then says it is no regular file).
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


def max_record_bytes() -> int:
    try:
        value = int(os.environ.get(MAX_RECORD_ENV) or DEFAULT_MAX_RECORD_BYTES)
    except ValueError:
        value = DEFAULT_MAX_RECORD_BYTES
    return value if value > 0 else DEFAULT_MAX_RECORD_BYTES


_KIND = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def read_record(folder_fd: int, name: str, limit: Optional[int] = None) -> tuple[Optional[dict], Optional[str]]:
    """One record file of a run folder, read defensively: (its JSON data, None) or (None, why it was refused).

    Never follows a symlink, never blocks (a FIFO or a device is refused by what `fstat` of the opened
    descriptor says, before any read), checks the owner on that descriptor, refuses a file over `limit`
    bytes by its size without reading it (and never reads more than `limit` + 1 bytes), and refuses a
    schema_version this reader does not know."""
    limit = limit or max_record_bytes()
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            try:
                target = os.readlink(name, dir_fd=folder_fd)
            except OSError:
                target = "?"
            return None, f"a symlink (to {target}): records are regular files and symlinks are never followed"
        return None, f"cannot be opened: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"not a regular file but {_KIND.get(stat.S_IFMT(st.st_mode), 'a special file')}: never read"
        if uid() is not None and st.st_uid != uid():
            return None, f"owned by uid {st.st_uid}, not {uid()}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, "group/world-writable: records are written 0600"
        if st.st_size > limit:
            return None, (f"{st.st_size} bytes, over the limit of {limit} bytes per record ({MAX_RECORD_ENV}): "
                          "not read")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            return None, f"grew past the limit of {limit} bytes per record ({MAX_RECORD_ENV}) while read: not used"
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    finally:
        os.close(fd)
    try:
        data = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than Python's stack
        return None, f"not valid JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if not isinstance(data, dict):
        return None, f"not a record: a JSON {type(data).__name__}, not an object"
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_SCHEMA_VERSIONS:
        return None, (f"unknown schema_version {version!r}: this vllm-patchkit reads versions "
                      f"{KNOWN_SCHEMA_VERSIONS.start}-{KNOWN_SCHEMA_VERSIONS.stop - 1} (a newer vllm-patchkit wrote "
                      "it: run that one's `vllm-patchkit status`; or it is not a record)")
    return data, None


def list_runs(base: Path) -> list[str]:
    if not base.is_dir():
        return []
    runs = []
    for p in base.iterdir():
        if p.name.startswith("."):
            continue
        try:
            if p.is_dir():
                runs.append((p.stat().st_mtime, p.name))
        except OSError:
            continue
    return [name for _, name in sorted(runs)]


def record_names(listing: list[str]) -> tuple[list[str], list[str]]:
    """(the names of a run folder that can be records, in the order they are read; the other `*.json` names).

    Temporary files of an atomic write (a leading dot) and files not ending in `.json` are no one's business;
    a `.json` file not named `<role>-<pid>.json` is named (not read). Records of vLLM's own roles come first,
    each role by pid, so no number of other files pushes them past `MAX_RECORDS_PER_RUN`."""
    names, others = [], []
    for n in listing:
        if n.startswith(".") or not n.endswith(".json"):
            continue
        m = RECORD_NAME.fullmatch(n)
        if m:
            names.append((_ROLE_ORDER.get(m["role"], 9), m["role"], int(m["pid"]), n))
        else:
            others.append(n)
    names.sort()
    return [n for *_, n in names], sorted(others)


def load_run(base: Path, run_id: Optional[str] = None) -> Optional[Run]:
    """The named run, or the latest one; None when there are no records.

    Only regular files named `*.json` are read, each by `read_record`; every file refused is named in
    `Run.refused` with the reason, and listed among the run's warnings (as an unreadable record always was)."""
    warnings: list[str] = []
    if base.is_dir() and not trusted_folder(base, warnings):
        for w in warnings:
            log.warning("vllm-patchkit: %s", w)
        return Run(run_id or "?", [], warnings)
    runs = list_runs(base)
    storage = [why] if (why := full(base)) else []
    if not runs or not (base / (run_id or runs[-1])).is_dir():
        return Run(run_id or "?", [], warnings, storage=storage) if storage else None
    rid = run_id or runs[-1]
    folder = base / rid
    run = Run(rid, [], warnings, storage=storage)
    if not trusted_folder(folder, warnings):
        return run
    try:
        dfd = os.open(os.path.realpath(folder), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                      | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        warnings.append(f"ignored {folder}: cannot be opened: {exc.strerror}")
        return run
    try:
        names, others = record_names(os.listdir(dfd))
        if others:
            run.refused.append(f"{len(others)} file(s) of {folder} not read: not named like a record "
                               f"(<role>-<pid>.json), e.g. {others[0]!r:.120}")
        if len(names) > MAX_RECORDS_PER_RUN:
            run.refused.append(f"{len(names) - MAX_RECORDS_PER_RUN} record file(s) of {folder} not read: more than "
                               f"{MAX_RECORDS_PER_RUN} in one run (from {names[MAX_RECORDS_PER_RUN]})")
            names = names[:MAX_RECORDS_PER_RUN]
        for name in names:
            data, why = read_record(dfd, name)
            if why is None:
                try:
                    run.processes.append(ProcessRecord.from_json(data).to_json())
                    continue
                except ValueError as exc:  # msgspec's ValidationError is a ValueError
                    why = f"not a valid record: {str(exc).splitlines()[0]}"
            run.refused.append(f"record {folder / name} refused: {why}")
    finally:
        os.close(dfd)
    order = {"frontend": 0, "engine_core": 1, "worker": 2}
    run.processes.sort(key=lambda p: (order.get(p.get("role"), 9), p.get("pid", 0)))
    return run


def narrow(run: Optional[Run], sets: set[str]) -> Optional[Run]:
    """The run with only the patches of the named sets (process-level errors and warnings kept)."""
    if run is None:
        return None
    procs = [{**p, "patches": [r for r in p.get("patches", []) if r.get("patch_set") in sets]} for p in run.processes]
    return Run(run.run_id, procs, list(run.warnings), list(run.refused), list(run.storage))

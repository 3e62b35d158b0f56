"""Per-user start-up caches: what every vLLM process would otherwise recompute the same way.

Why: vLLM loads the plugin in every process (front end, EngineCore, each worker), and
each used to re-read and re-validate every patch YAML and manifest (~45 ms of YAML and
pydantic), re-parse upstream sources for live fingerprints (~5-20 ms) and re-map every
installed distribution's files to find a dependency's folders (~150 ms where a target
carries a torch decorator). All three depend only on files on disk, so they are kept
in `$VLLM_PATCHKIT_CACHE_DIR` (default `~/.cache/vllm-patchkit/startup`).

This module is the store: the folder, the entry format and its verification, and what the cache did in this
process. What an entry depends on is stamped by `cache_stamps`; the patch-set models come back from an
entry's JSON through `cache_models`.

An entry is data, never code: JSON only (no pickle: whoever could write a pickle would run code in every
vLLM process). Each file is one header line, `{"format": 2, "sha256": <digest of the body>, "bytes": n}`,
then the JSON body; the body holds the entry's key and the stamp of every input it depends on, so the one
digest covers the content and its inputs. It is verified on every read: an entry whose body does not match
its digest (edited by hand, torn, truncated) is discarded with a warning and rebuilt, and so is one whose
inputs changed (a stale entry; that one quietly). What the cache did in a process reaches its record
(`attach`): a note `cache: used ...` / `cache: rebuilt: <entry>: <why>`, and a process warning when an entry
was tampered with or not trusted, so `vllm-patchkit status --json` shows whether the cache was used.

The digest is no signature: it needs no secret, so whoever can write the folder as this user can compute it
again. What guards the folder is who may write it, as for the status directory (`files.ensure_dir`,
`files.trusted_folder`): it is created 0700; an entry is read only from a folder owned by this user that nobody
else can write, and only when the file itself is a regular file (never followed through a symlink, never a
FIFO: opened `O_NOFOLLOW | O_NONBLOCK`, checked on the open descriptor) owned by this user and not
group/world-writable, of at most `MAX_BYTES`. Writers write a temp file and `os.replace` it (concurrent
processes: the last one wins, a reader never sees a torn file). `VLLM_PATCHKIT_CACHE_DIR=off` turns every
cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Optional

from vllm_patchkit.upstream.files import ensure_dir, trusted_folder, uid

log = logging.getLogger("vllm.patchkit")

CACHE_DIR_ENV = "VLLM_PATCHKIT_CACHE_DIR"
FORMAT = 5  # bump when what an entry holds changes shape (1: pickled patch sets, unframed JSON; 2: no env inputs; 3: no reach;
            # 4: fingerprints without their return shape)
MAX_BYTES = 16 << 20  # an entry larger than this is not read (the patch sets of this repository: ~70 kB)

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

# Why an entry was not used, by kind: these two are worth a warning (someone or something changed the entry
# itself, or put one there this process must not trust); a stale, absent or older-format entry is routine.
TAMPERED, UNTRUSTED, STALE, UNREADABLE = "tampered", "untrusted", "stale", "unreadable"


def cache_dir() -> Optional[Path]:
    """$VLLM_PATCHKIT_CACHE_DIR ("off": no cache), else $XDG_CACHE_HOME or ~/.cache, + vllm-patchkit/startup."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return None if env.lower() in ("off", "0", "none") else Path(env)
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    except RuntimeError:  # no home directory (an arbitrary uid in a container)
        return None
    return Path(base) / "vllm-patchkit" / "startup"


# -- what the cache did, for the process record ---------------------------------------------------------------
_sink: Any = None  # the ProcessRecord of this process's loader (`attach`)
_pending: list[tuple[str, bool]] = []  # (note, warn) said before a record was attached
_logged: set[str] = set()


def attach(record: Any) -> None:
    """Send what the caches do in this process to `record` (its `notes`; its `warnings` too for a tampered or
    untrusted entry), starting with what they did before it existed (reading the patch sets)."""
    global _sink
    _sink = record
    while _pending:
        _put(*_pending.pop(0))


def report(note: str, warn: bool = False) -> None:
    """One thing the cache did (`cache: used ...`, `cache: rebuilt: ...`): logged, and kept in the record."""
    if note not in _logged:  # a folder not trusted is met by the reader and the writer: said once
        _logged.add(note)
        (log.warning if warn else log.info)("vllm-patchkit: %s", note)
    if _sink is None:
        _pending.append((note, warn))
        del _pending[:-32]  # a tool that never attaches a record keeps only the last few
    else:
        _put(note, warn)


def _put(note: str, warn: bool) -> None:
    try:
        if note not in _sink.notes:
            _sink.notes.append(note)
        if warn and note not in _sink.warnings:
            _sink.warnings.append(note)
    except Exception:  # a record of another shape: the log line is what remains
        pass


def rebuilt(name: str, why: str, kind: str) -> None:
    """Say that entry `name` was not used and is computed again, and why."""
    report(f"cache: rebuilt: {name}: {why}", warn=kind in (TAMPERED, UNTRUSTED))


# -- the folder and its entries ---------------------------------------------------------------------------------
def _folder() -> Optional[Path]:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        ensure_dir(folder)
    except OSError:
        return None
    warnings: list[str] = []
    if not trusted_folder(folder, warnings):
        for w in warnings:
            report(f"cache: not used: {w}", warn=True)
        return None
    return folder


def read_entry(name: str) -> tuple[Any, Optional[tuple[str, str]]]:
    """(the body of entry `name`, None), or (None, (kind, why)) when it cannot be used; (None, None) when there
    is none (or the cache is off). `kind` is TAMPERED, UNTRUSTED, STALE or UNREADABLE."""
    folder = _folder()
    if folder is None:
        return None, None
    path = folder / name
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # ELOOP: a symlink
        if os.path.islink(path):
            return None, (UNTRUSTED, f"a symlink (to {os.readlink(path)}), not a file this process wrote")
        return None, (UNREADABLE, f"cannot be opened: {exc.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, (UNTRUSTED, "not a regular file")
        if uid() is not None and st.st_uid != uid():
            return None, (UNTRUSTED, f"owned by uid {st.st_uid}, not {uid()}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, (UNTRUSTED, f"group/world-writable (mode {stat.S_IMODE(st.st_mode):o})")
        if st.st_size > MAX_BYTES:
            return None, (UNTRUSTED, f"{st.st_size} bytes, more than an entry may hold ({MAX_BYTES})")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        return None, (UNREADABLE, f"cannot be read: {exc.strerror}")
    finally:
        os.close(fd)
    head, nl, body = data.partition(b"\n")
    try:
        header = json.loads(head)
        fmt = header.get("format") if isinstance(header, dict) else None
    except ValueError:
        fmt = header = None
    if fmt != FORMAT:
        return None, (STALE, f"written by another version of the framework (format {fmt!r}, this one reads {FORMAT})")
    if not nl or header.get("bytes") != len(body) or header.get("sha256") != hashlib.sha256(body).hexdigest():
        return None, (TAMPERED, "its content does not match the digest it was written with (edited or corrupt)")
    try:
        return json.loads(body), None
    except ValueError as exc:  # a matching digest over text that is no JSON: written so by hand
        return None, (TAMPERED, f"not JSON: {exc}")


def read(name: str) -> Any:
    """The body of entry `name`, or None when absent, untrusted, tampered with or unreadable (said once, via
    `rebuilt`: the caller computes it again and writes it)."""
    value, why = read_entry(name)
    if why is not None:
        rebuilt(name, why[1], why[0])
    return value


def write(name: str, value: Any) -> bool:
    """Replace the entry atomically (temp file + os.replace, mode 0600), framed with its digest; False when it
    could not (a cache that cannot be written is no error: the next process recomputes)."""
    folder = _folder()
    if folder is None:
        return False
    try:
        body = json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        log.debug("vllm-patchkit: cache %s not written: %s", name, exc)
        return False
    head = json.dumps({"format": FORMAT, "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}).encode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(head + b"\n" + body)
        os.replace(tmp, folder / name)
        return True
    except Exception as exc:
        log.debug("vllm-patchkit: cache %s not written: %s", name, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False

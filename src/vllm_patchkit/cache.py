"""Per-user start-up caches: what every vLLM process would otherwise recompute the same way.

Why: vLLM loads the plugin in every process (front end, EngineCore, each worker), and
each used to re-read and re-validate every patch YAML and manifest (~45 ms of YAML and
pydantic), re-parse upstream sources for live fingerprints (~5-20 ms) and re-map every
installed distribution's files to find a dependency's folders (~150 ms where a target
carries a torch decorator). All three depend only on files on disk, so they are kept
in `$VLLM_PATCHKIT_CACHE_DIR` (default `~/.cache/vllm-patchkit/startup`), keyed by the
stat of every file they depend on (and, for the installation, every distribution's
dist-info), so any change recomputes.

Trust, as for the status directory (`record.ensure_dir`, `status._trusted`): the folder is
created 0700; an entry is read only from a folder owned by this user that nobody else can
write, only when the file itself is this user's and not group/world-writable. Writers
write a temp file and `os.replace` it (concurrent processes: the last one wins, a reader
never sees a torn file). Anything unreadable, corrupt or of another key is ignored and
rewritten. `VLLM_PATCHKIT_CACHE_DIR=off` turns every cache off.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional

log = logging.getLogger("vllm.patchkit")

CACHE_DIR_ENV = "VLLM_PATCHKIT_CACHE_DIR"
FORMAT = 1  # bump when what an entry holds changes shape


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


def _folder() -> Optional[Path]:
    from .record import ensure_dir
    from .status import _trusted

    folder = cache_dir()
    if folder is None:
        return None
    try:
        ensure_dir(folder)
    except OSError:
        return None
    warnings: list[str] = []
    if not _trusted(folder, warnings):
        for w in warnings:
            log.warning("vllm-patchkit: cache not used: %s", w)
        return None
    return folder


def _trusted_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    return not hasattr(os, "getuid") or st.st_uid == os.getuid()


def read(name: str, *, binary: bool = False) -> Any:
    """The entry `name` (JSON, or pickle when `binary`), or None when absent, untrusted or unreadable."""
    folder = _folder()
    if folder is None:
        return None
    path = folder / name
    if not _trusted_file(path):
        return None
    try:
        if binary:
            with open(path, "rb") as fh:
                return pickle.load(fh)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except Exception:  # corrupt, truncated by a full disk, or of an older shape: recomputed and rewritten
        return None


def write(name: str, value: Any, *, binary: bool = False) -> bool:
    """Replace the entry atomically (temp file + os.replace, mode 0600); False when it could not."""
    folder = _folder()
    if folder is None:
        return False
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            if binary:
                pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                json.dump(value, fh)
        os.replace(tmp, folder / name)
        return True
    except Exception as exc:  # a cache that cannot be written is no error: the next process recomputes
        log.debug("vllm-patchkit: cache %s not written: %s", name, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


# -- keys -----------------------------------------------------------------------------------------
def file_stamp(paths: Iterable[Path | str]) -> list:
    """[path, size, mtime_ns] of each file (None for one that is missing)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append([str(p), st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([str(p), None, None])
    return out


def folder_stamp(folders: Iterable[Path | str]) -> list:
    """Every file directly in each folder as [path, size, mtime_ns], and every subfolder as [path, "dir"] (a
    `manifests/` folder appearing in a patch folder counts), sorted; hidden entries and __pycache__ left out."""
    out = []
    for folder in folders:
        try:
            with os.scandir(folder) as it:
                entries = [e for e in it if not e.name.startswith(".") and e.name != "__pycache__"]
        except OSError:
            out.append([str(folder), None, None])
            continue
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir():
                out.append([e.path, "dir"])
            else:
                st = e.stat()
                out.append([e.path, st.st_size, st.st_mtime_ns])
    return out


_INSTALLATION: Optional[list] = None


def installation_stamp() -> list:
    """What is installed: every dist-info / egg-info / .pth entry (name, mtime_ns) on sys.path, with the
    interpreter. An install, upgrade, uninstall or reinstall of any distribution changes it; it costs a
    directory listing per sys.path entry (well under 1 ms), not a read of every distribution's metadata."""
    global _INSTALLATION
    if _INSTALLATION is None:
        out: list = [sys.version, sys.prefix, FORMAT]
        for entry in sys.path:
            try:
                with os.scandir(entry or ".") as it:
                    found = sorted((e.name, e.stat().st_mtime_ns) for e in it
                                   if e.name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")))
            except OSError:
                continue
            if found:  # entries without distributions (a script's folder, one a package appends) change nothing
                out.append([entry, found])
        _INSTALLATION = out
    return _INSTALLATION


def code_stamp() -> list:
    """The framework's own validating code: a changed schema or loader must not reuse what an older one validated."""
    here = Path(__file__).resolve().parent
    return file_stamp(here / n for n in ("schema.py", "declare.py", "manifest.py", "patchsets.py", "cache.py",
                                         "fingerprint.py"))

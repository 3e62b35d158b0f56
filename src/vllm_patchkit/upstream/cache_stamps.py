"""Stamps: what a start-up cache entry depends on, written into the entry and compared on every read.

Why apart from the store (`cache`): an entry is only as good as the proof that its inputs are unchanged. A
stamp lists each input by stat (size, mtime, inode) and, for the small ones, by content digest: the patch
YAMLs and manifests, the installation (what `sys.path` holds), the framework's own code. A reader computes
the stamps again and compares them with the entry's; `first_difference` says in words which input changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from vllm_patchkit.upstream.cache import FORMAT

HASH_LIMIT = 1 << 20  # inputs up to this size are stamped with their content digest too, larger ones by stat only


def _file_digest(path: str, size: int) -> Optional[str]:
    if size > HASH_LIMIT:
        return None
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read(HASH_LIMIT + 1)).hexdigest()[:32]
    except OSError:
        return None


def file_stamp(paths: Iterable[Path | str], *, digest: Callable[[str], bool] = lambda p: True) -> list:
    """[path, size, mtime_ns, inode, content digest or None] of each file ([path, None] for one that is
    missing); the digest for the files `digest` accepts that are at most HASH_LIMIT bytes."""
    out = []
    for p in paths:
        p = str(p)
        try:
            st = os.stat(p)
        except OSError:
            out.append([p, None])
            continue
        out.append([p, st.st_size, st.st_mtime_ns, st.st_ino,
                    _file_digest(p, st.st_size) if digest(p) else None])
    return out


def folder_stamp(folders: Iterable[Path | str], *, digest: Callable[[str], bool] = lambda p: False) -> list:
    """Every file directly in each folder as `file_stamp` gives it, and every subfolder as [path, "dir"] (a
    `manifests/` folder appearing in a patch folder counts), sorted; hidden entries and __pycache__ left out."""
    out = []
    for folder in folders:
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not e.name.startswith(".") and e.name != "__pycache__"),
                                 key=lambda e: e.name)
        except OSError:
            out.append([str(folder), None])
            continue
        for e in entries:
            if e.is_dir():
                out.append([e.path, "dir"])
            else:
                out += file_stamp([e.path], digest=digest)
    return out


def env_stamp(names: Iterable[str]) -> list:
    """[`env NAME`, digest of its value or None when unset] of each variable, sorted: a changed, set or unset
    variable changes the stamp; the values themselves are not written into the entry (one may be a secret)."""
    out = []
    for name in sorted(set(names)):
        value = os.environ.get(name)
        out.append([f"env {name}", None if value is None else hashlib.sha256(value.encode(
            "utf-8", "surrogateescape")).hexdigest()[:16]])
    return out


_FRAMEWORK = "vllm_patchkit-"


def framework_version() -> str:
    """This framework's installed version, read from its dist-info's name in the installation stamp's listing (no
    metadata read: ~0.8 ms); from `importlib.metadata` when the listing has none (a `setup.py develop` egg-link)."""
    for entry in installation_stamp()[3:]:
        for found in entry[3]:
            name = found[0]
            if name.startswith(_FRAMEWORK) and name.endswith((".dist-info", ".egg-info")):
                return name[len(_FRAMEWORK):].rsplit(".", 1)[0].split("-py", 1)[0]
    try:
        from importlib import metadata

        return metadata.version("vllm-patchkit")
    except Exception:
        return "unknown"


def first_difference(old: Any, new: Any) -> str:
    """The first input that differs between two stamps, in words (for the note saying why an entry was rebuilt)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if old.get(k) != new.get(k):
                return first_difference(old.get(k), new.get(k))
    if isinstance(old, list) and isinstance(new, list):
        by_old = {r[0]: r for r in old if isinstance(r, list) and r and isinstance(r[0], str)}
        by_new = {r[0]: r for r in new if isinstance(r, list) and r and isinstance(r[0], str)}
        if by_old and by_new:
            for p in sorted(set(by_old) | set(by_new)):
                if p not in by_old:
                    return f"{p} added"
                if p not in by_new:
                    return f"{p} removed"
                if by_old[p] != by_new[p]:
                    return f"{p} changed"
        for a, b in zip(old, new):
            if a != b:
                return first_difference(a, b)
    return "an input changed"


_INSTALLATION: Optional[list] = None


def installation_stamp() -> list:
    """What is installed: for every sys.path entry that holds distributions, the folder's own (mtime_ns, inode),
    every dist-info / egg-info / egg-link in it by (name, inode), every .pth by (name, size, mtime_ns), with the
    interpreter and this cache's format. Installing, upgrading, uninstalling or reinstalling a distribution adds,
    removes or renames a folder there, which changes the folder's mtime and the names (a dist-info folder made
    anew also has another inode); the framework's version is in its own dist-info's name. It costs a listing
    and a few stats per entry (the names and inodes come with the listing), not a stat or a read of every
    distribution's metadata (~1 ms more on a slow disk for vLLM's ~160 distributions); the distributions that
    contribute patch sets are stamped file by file, content included (`PatchSetSource.inputs`)."""
    global _INSTALLATION
    if _INSTALLATION is None:
        out: list = [sys.version, sys.prefix, FORMAT]
        stamped: list[str] = []
        for entry in sys.path:
            real = os.path.abspath(entry or ".")
            if any(real.startswith(s + os.sep) for s in stamped):
                # a folder inside one already stamped, which a package appended once imported (setuptools'
                # _vendor): its distributions come and go with that package, and a process that has not
                # imported it yet must find the same entry
                continue
            try:
                st = os.stat(real)
                found = []
                with os.scandir(real) as it:
                    for e in it:
                        if e.name.endswith((".dist-info", ".egg-info", ".egg-link")):
                            found.append((e.name, e.inode()))
                        elif e.name.endswith(".pth"):
                            pst = e.stat()
                            found.append((e.name, pst.st_size, pst.st_mtime_ns))
            except OSError:
                continue
            if found:  # entries without distributions (a script's folder, one a package appends) change nothing
                out.append([entry, st.st_mtime_ns, st.st_ino, sorted(found)])
                stamped.append(real)
        _INSTALLATION = out
    return _INSTALLATION


def code_stamp() -> list:
    """The framework's own validating code: a changed schema or loader must not reuse what an older one validated.
    Every module of the layers a start-up runs (declaration, upstream, runtime), found by listing them: a module
    that moves or splits stays covered."""
    package = Path(__file__).resolve().parents[1]
    files = sorted(f for layer in ("declaration", "upstream", "runtime") for f in (package / layer).glob("*.py"))
    return file_stamp(files, digest=lambda p: False)


def digest_of(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str, separators=(",", ":")).encode()).hexdigest()[:16]

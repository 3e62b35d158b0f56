"""The per-user folders the plugin writes and reads (status records, start-up cache): created 0700, read only
when this user owns them and nobody else can write them. One rule for both, so a hostile folder is refused alike."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional


def uid() -> Optional[int]:
    return os.getuid() if hasattr(os, "getuid") else None


def ensure_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def trusted_folder(path: Path, warnings: list[str]) -> bool:
    """A folder: only one this user owns and nobody else can write. A symlink to such a folder is followed
    (its target is what is checked: owner and mode of the real folder). Anything else: lstat only."""
    try:
        st = path.lstat()
    except OSError:
        return False
    real = path
    if stat.S_ISLNK(st.st_mode):
        try:
            real = Path(os.path.realpath(path))
            st = real.stat()
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            warnings.append(f"ignored {path}: a symlink to {real}, which is not a folder")
            return False
    shown = path if real == path else f"{path} (a symlink to {real})"
    if uid() is not None and st.st_uid != uid():
        warnings.append(f"ignored {shown}: owned by uid {st.st_uid}, not {uid()}")
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        warnings.append(f"ignored {shown}: group/world-writable directory")
        return False
    return True

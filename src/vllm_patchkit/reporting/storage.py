"""The status folder's file system when it is full: why a newer run's records, or a running process's newest
state, may be missing, said by `status` instead of showing an older state as the newest.

Why: a process that cannot write its record leaves the last one it wrote (or none) in place, and a run whose
first process could not even make its folder leaves the previous run as the latest. One `statvfs` per read
tells this reader what no record can.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

#: Below this many free bytes a record (tens of kB for a big set) may not fit: the folder counts as full.
MIN_FREE_BYTES = 64 * 1024


def full(base: Path) -> Optional[str]:
    """Why records cannot be written under `base` now (its file system is full), or None."""
    probe = Path(base)
    for _ in range(64):  # the nearest existing folder: the status folder itself may not exist yet
        if probe.exists() or probe.parent == probe:
            break
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserved blocks
    free = blocks * st.f_frsize
    no_inodes = st.f_files > 0 and st.f_ffree == 0
    if free >= MIN_FREE_BYTES and not no_inodes:
        return None
    what = "no free inodes" if no_inodes else f"{free} bytes free"
    return (f"the status folder {base} is on a full file system ({what}): processes cannot write their "
            "records there, so a running process's newest state, or a newer run's records, may be missing "
            "(free space there: each process retries at every flush)")

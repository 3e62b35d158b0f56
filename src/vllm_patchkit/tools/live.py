"""`--live`: read the installed vLLM by import, in a child process whose death is a finding.

`check` and `pin` read every release statically (`releases.installed_static`). Importing a target is
what the loader does inside vLLM, and some modules cannot be imported by a plain Python process at all:
`vllm.platforms.rocm` imports `vllm._C`, which on a CPU without AVX-512 is an illegal instruction and, in a
process that already loaded vLLM's CPU ops, an abort (`Only a single TORCH_LIBRARY can be used to register
the namespace _C`). No exception reaches Python, so the import cannot be tried in the checking process:
`--live` runs the verb again in a child that notes each module before importing it, and a child that dies
by a signal is reported with that module's name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD_ENV = "VLLM_PATCHKIT_LIVE_CHILD"
PROGRESS_ENV = "VLLM_PATCHKIT_LIVE_PROGRESS"


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def note_import(module: str) -> None:
    """Written before the child imports `module`: if the import kills it, the parent names the module."""
    path = os.environ.get(PROGRESS_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(module)


def run_in_child(verb: str, argv: list[str]) -> int:
    """Run `vllm-patchkit <argv>` with `--live` in a child; its exit code, or 1 with a message if it died."""
    fd, progress = tempfile.mkstemp(prefix="vllm-patchkit-live-")
    os.close(fd)
    try:
        env = {**os.environ, CHILD_ENV: "1", PROGRESS_ENV: progress}
        proc = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", *argv], env=env)
        if proc.returncode >= 0:
            return proc.returncode
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        module = Path(progress).read_text(encoding="utf-8").strip() or "(before any target was imported)"
        print(f"vllm-patchkit {verb} --live: the process reading the installed vLLM died by {name} while "
              f"importing {module}. That module cannot be imported here (a module of another platform, e.g. "
              f"vllm.platforms.rocm, loads native code this machine cannot run); read it statically instead: "
              f"run `vllm-patchkit {verb}` without --live", file=sys.stderr)
        return 1
    finally:
        os.unlink(progress)

"""Another vLLM release's Python sources, run here: the pure-Python parts of a wheel this machine cannot install.

vLLM 0.33.0 exists only as the CUDA wheel. Its compiled kernels cannot run on this CPU, but its
configuration and KV-cache planning are plain Python. `sources(version)` unpacks the wheel's
non-binary files once into the per-user cache; `run(version, script)` runs a script with those
sources first on `sys.path` (and `VLLM_TARGET_DEVICE=cpu`, so vLLM's platform detection picks the
CPU platform of the installed torch). What this exercises is vLLM's own code of that release; what
it cannot exercise (kernels, a model's forward, a serve) the tests that use it do not claim.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-patchkit" / "sources"
BINARY = (".so", ".cubin", ".fatbin")


def sources(version: str) -> Optional[Path]:
    """The folder holding `vllm/` of that release (unpacked once, atomically); None without the wheel."""
    from vllm_patchkit.tools.releases import cached_wheel

    wheel = cached_wheel(version)
    if wheel is None:
        return None
    dest = CACHE / f"vllm-{version}-{wheel.stat().st_size}"
    if (dest / "vllm" / "__init__.py").is_file():
        return dest
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".vllm-{version}-", dir=CACHE))
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and not name.endswith(BINARY) and not name.endswith("/"):
                z.extract(name, tmp)
    try:
        tmp.rename(dest)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def sources_or_skip(version: str) -> Path:
    found = sources(version)
    if found is None:
        pytest.skip(f"no vLLM {version} wheel in the wheel cache (scripts/fetch_wheels.sh fetches it)")
    return found


def run(version: str, script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python script args` with vLLM `version`'s sources importable as `vllm` (before the installed one)."""
    src = sources_or_skip(version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]), "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_PLUGINS": ""}
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def probe_json(version: str, script: Path) -> dict:
    """Run a probe script under `version`'s sources and return the JSON it printed on its `PROBE-JSON ` line."""
    import json

    done = run(version, script)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE-JSON ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[0].partition(" ")[2])

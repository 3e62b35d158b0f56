"""docs/adopting.md's shell block (scan, --json, --write, pin --dry-run, pin) run as written on flash-head 0.1.10,
with the downloaded wheel taken from the plugin cache (no second download) and `$WORK` a temporary folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.tools.scan.recall import fetch

DOC = Path(__file__).resolve().parents[2] / "docs" / "adopting.md"


def _block() -> str:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"<!-- tests/scan/test_adopting.py runs this block -->\n```bash\n(.*?)```", text, re.S)
    assert m, "docs/adopting.md lost its tested block"
    return m.group(1)


def test_adopting_walkthrough(tmp_path):
    wheel, why = fetch("flash-head", "0.1.10")
    if wheel is None:
        pytest.skip(why)
    shutil.copy(wheel, tmp_path / wheel.name)  # what `pip download` would put there
    block = _block().replace("pip download --no-deps flash-head==0.1.10 -d \"$WORK\"\n", "")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "WORK": str(tmp_path), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True, text=True, env=env,
                         timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sites = json.loads((tmp_path / "sites.json").read_text())
    assert sites["counts"].get("wrap") == 6
    folder = tmp_path / "drafts" / "flash_head_patchkit"
    assert len(list(folder.glob("*.yaml"))) == 6
    manifests = list((folder / "manifests").glob("vllm-*.yaml"))
    assert len(manifests) == 1
    assert len(yaml.safe_load(manifests[0].read_text())["patches"]) == 6
    assert "pin --dry-run" in out.stdout and "wrote" in out.stdout

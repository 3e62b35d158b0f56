"""Shared helpers of the scan tests: the installed vLLM read statically, a fixture plugin written to tmp_path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vllm_patchkit.tools.scan.upstream import Upstream


@pytest.fixture(scope="session")
def upstream() -> Upstream:
    up = Upstream.open()
    if up.release is None:
        pytest.skip("no installed vLLM tree to read statically")
    return up


def write_plugin(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def review_and_pin(folder: Path, python_path: Path):
    """The review's own edits to every draft in `folder` (the marker gone; why, upstream, retire_when written),
    then `vllm-patchkit pin` of them in a child with `python_path` (the drafts' stubs) importable."""
    import os
    import subprocess
    import sys

    import yaml

    for path in folder.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        del doc["draft"]
        doc.update(why="needed", upstream="none: plugin behaviour", retire_when={"manual": "when vLLM does it"})
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "pin", "--patch-dir", str(folder),
                           "--manifest-dir", str(folder / "manifests")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(python_path)}, timeout=600)

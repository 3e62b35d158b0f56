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

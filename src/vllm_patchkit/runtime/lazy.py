"""Run a callback right after a module executes, instead of importing it early.

Why: resolving a patch target imports its module. In a process that imports that
module later (or never), importing it at plugin load costs hundreds of modules and
up to a second, and loads code vLLM would not load there. A target whose module is
not imported yet is patched from this hook instead, the moment vLLM imports it.

How: one `sys.meta_path` finder, first in the list, that answers only for the
module names it watches. It asks the finders after it for the real spec and wraps
that spec's loader, so the callback runs inside `exec_module`, right after the
module's code ran and before the importer gets the module back (an importer doing
`from m import f` then gets the patched `f`). Once the module executed, the original
loader is put back on the module (`__loader__`, `__spec__.loader`), so the module
looks exactly as if imported without the hook. An exception from the callback fails
that import (importlib removes the module from `sys.modules`): that is how a
required patch fails closed at this point. Only importlib's own machinery is used
(no wrapt at run time). The per-module import lock serialises one module's
execution; the watch table has its own lock, and a callback is taken out of it
before it runs, so it runs once per watch.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

Callback = Callable[[Any], None]


class _Loader:
    """A spec's loader, with `callbacks` run right after `exec_module` (every other attribute delegated)."""

    def __init__(self, loader: Any, name: str, hook: "ImportHook"):
        self._vpk_loader, self._vpk_name, self._vpk_hook = loader, name, hook

    def __getattr__(self, attr: str) -> Any:  # get_source, get_filename, is_package, ... : the real loader's
        if attr.startswith("_vpk_"):  # not set yet (a copy being made): no recursion through ourselves
            raise AttributeError(attr)
        return getattr(self._vpk_loader, attr)

    def create_module(self, spec):
        return self._vpk_loader.create_module(spec)

    def exec_module(self, module) -> None:
        real = self._vpk_loader
        real.exec_module(module)
        # from here on the module is what an import without the hook gives
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = real
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = real
        self._vpk_hook._executed(self._vpk_name, sys.modules.get(self._vpk_name, module))


class ImportHook:
    """Watch module names; call each watcher's callback once, right after that module executed."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._watch: dict[str, list[tuple[object, Callback]]] = {}
        self._sticky: dict[str, list[tuple[object, Callback]]] = {}  # run on every (re-)import: fail closed

    # -- API -----------------------------------------------------------------------------------
    def watch(self, module: str, owner: object, callback: Callback) -> None:
        """Run `callback(module_object)` once when `module` has been imported (it is not imported yet)."""
        with self._lock:
            self._watch.setdefault(module, []).append((owner, callback))
            self._ensure_installed()

    def keep_failing(self, module: str, owner: object, callback: Callback) -> None:
        """Run `callback` again on every later import of `module` (a required patch that failed there:
        a caller that catches the ImportError and imports again must not get the module unpatched)."""
        with self._lock:
            self._sticky.setdefault(module, []).append((owner, callback))
            self._ensure_installed()

    def forget(self, owner: object) -> int:
        """Drop every watch of `owner` (unpatch); returns how many were dropped."""
        dropped = 0
        with self._lock:
            for table in (self._watch, self._sticky):
                for module in list(table):
                    kept = [(o, cb) for o, cb in table[module] if o is not owner]
                    dropped += len(table[module]) - len(kept)
                    if kept:
                        table[module] = kept
                    else:
                        del table[module]
            self._remove_if_idle()
        return dropped

    # -- the finder protocol -------------------------------------------------------------------
    def find_spec(self, name: str, path=None, target=None):
        if name not in self._watch and name not in self._sticky:  # the common case: one dict lookup
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # not found, a namespace package or a legacy loader: imported as usual, unwatched
        spec.loader = _Loader(spec.loader, name, self)
        return spec

    def invalidate_caches(self) -> None:
        return None

    # -- internals -----------------------------------------------------------------------------
    def _executed(self, name: str, module: Any) -> None:
        with self._lock:
            due = self._watch.pop(name, []) + list(self._sticky.get(name, []))
            self._remove_if_idle()
        first_error = None
        for _, callback in due:
            try:
                callback(module)
            except BaseException as exc:  # every watcher runs; the first error fails the import
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error

    def _ensure_installed(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def _remove_if_idle(self) -> None:
        if not self._watch and not self._sticky and self in sys.meta_path:
            sys.meta_path.remove(self)


HOOK = ImportHook()  # the process's one hook (several loaders share it; each forgets its own watches)

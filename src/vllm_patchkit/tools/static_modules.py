"""One release's modules, each parsed once: the source (a wheel read in place, or a folder), its version, and the
table of what each module and class body binds (`static_tables.py`). What `StaticRelease` follows names through;
parsing is the cost of a static reading, so it is done lazily, once per module, with the cyclic collector paused."""

from __future__ import annotations

import ast
import gc
from contextlib import contextmanager
from typing import Iterator, Optional

from vllm_patchkit.upstream.static_lazy import LazyExports, lazy_exports
from vllm_patchkit.upstream.static_source import Source, declared_version, module_name
from vllm_patchkit.upstream.static_tables import FUNCS, ModuleTable, Scope, class_scope, parse_module


@contextmanager
def gc_paused():
    """No cyclic garbage collection while a module is parsed. A syntax tree is a few hundred thousand objects
    with no cycles (reference counting frees them), but allocating it triggers full collections that walk every
    tree parsed before: with the collector on, a check of ATOM's 97 patches against one wheel spent 0.9 of its
    1.3 s of CPU in them (0.2 s with it paused; benchmarks/static_check.py --corpus atom)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class ReleaseModules:
    """One release's source and its modules, parsed once per instance."""

    def __init__(self, source: Source, version: Optional[str] = None):
        self.source = source
        self._modules: dict[str, Optional[ModuleTable]] = {}
        self._class_scopes: dict[int, Scope] = {}
        self._lazy: dict[str, LazyExports] = {}
        self._version = version

    @property
    def label(self) -> str:
        return self.source.label

    def version(self, package: str = "vllm") -> Optional[str]:
        """The release version: given, else `<package>/_version.py` or `version.py`, else the wheel name."""
        if self._version:
            return self._version
        self._version = declared_version(self.source, package) or self.source.version_hint()
        return self._version

    # -- modules
    def module(self, name: str) -> Optional[ModuleTable]:
        """The table of module `name` (None if the release has no such module), parsed once."""
        if name not in self._modules:  # a file that does not parse raises SyntaxError, every time
            rel = name.replace(".", "/")
            found = ((path, self.source.read(path)) for path in (f"{rel}.py", f"{rel}/__init__.py"))
            path, raw = next(((p, r) for p, r in found if r is not None), (None, None))
            with gc_paused():
                self._modules[name] = parse_module(name, path, raw) if raw is not None else None
        return self._modules[name]

    def lazy(self, name: str) -> LazyExports:
        """The names module `name` serves through its `__getattr__` from a table (`static_lazy.py`), read once."""
        if name not in self._lazy:
            mod = self.module(name)
            self._lazy[name] = lazy_exports(mod.scope, mod.package) if mod is not None else {}
        return self._lazy[name]

    def _class_scope(self, node: ast.ClassDef, package: str) -> Scope:
        scope = self._class_scopes.get(id(node))
        if scope is None:
            scope = self._class_scopes[id(node)] = class_scope(node, package)
        return scope

    def iter_defs(self, top: str = "vllm") -> Iterator[str]:
        """Every module-level function, class and method spec in the release (for benchmarks)."""
        for rel in self.source.python_files(top):
            name = module_name(rel)
            try:
                mod = self.module(name)
            except SyntaxError:
                continue
            if mod is None:
                continue
            for n, b in mod.scope.names.items():
                if isinstance(b, FUNCS):
                    yield f"{name}:{n}"
                elif isinstance(b, ast.ClassDef):
                    yield f"{name}:{n}"
                    for m, mb in self._class_scope(b, mod.package).names.items():
                        if isinstance(mb, FUNCS):
                            yield f"{name}:{n}.{m}"


"""Where a name the release does not define any more went: the other places in the release that define the same
class-and-member (or function) name, nearest package first. A missing target names them (`Missing.moved_to`),
so that `check` can compare the pin with the definition at its new home."""

from __future__ import annotations

import ast
from typing import Callable, Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.static_source import Source, module_name
from vllm_patchkit.upstream.static_tables import FUNCS, ModuleTable, Scope


class MovedSearch:
    """The search over one release: each file's text is read once, each answer kept."""

    def __init__(self, source: Source, module: Callable[[str], Optional[ModuleTable]],
                 class_scope: Callable[[ast.ClassDef, str], Scope]):
        self.source = source
        self.module = module  # the release's module table by name, parsed once (`ReleaseModules.module`)
        self.class_scope = class_scope
        self._texts: dict[str, bytes] = {}  # file -> text, read once
        self._found: dict[tuple[str, int], list[str]] = {}

    def find(self, spec: str, limit: int = 5) -> list[str]:
        """Other places in the release that define the same class-and-member (or function) name.

        Searched nearest first: the target's own package, then each parent up to the
        top-level package, stopping at the first level with a hit. A text search picks
        candidate files (each file's text is read once); only those are parsed.
        """
        if (spec, limit) in self._found:
            return self._found[(spec, limit)]
        module, qualname = Target.parse(spec)
        parts = qualname.split(".")
        leaf = parts[-1]
        cls = parts[-2] if len(parts) > 1 else None
        needles = (f"def {cls or leaf}".encode(), f"class {cls or leaf}".encode())
        found: list[str] = []
        self._found[(spec, limit)] = found
        package = module.split(".")
        for depth in range(len(package) - 1, 0, -1):
            for rel in self.source.python_files("/".join(package[:depth])):
                raw = self._texts.get(rel)
                if raw is None:
                    raw = self._texts[rel] = self.source.read(rel) or b""
                if not any(n in raw for n in needles):
                    continue
                name = module_name(rel)
                mod = self.module(name)
                hit = self._defined_here(mod, cls, leaf) if mod is not None else None
                if hit and f"{name}:{hit}" != spec and f"{name}:{hit}" not in found:
                    found.append(f"{name}:{hit}")
            if found:
                break
        del found[limit:]
        return found

    def _defined_here(self, mod: ModuleTable, cls: Optional[str], leaf: str) -> Optional[str]:
        """`cls.leaf` (or `leaf`) if the module itself defines it (imports do not count)."""
        if cls is None:
            b = mod.scope.names.get(leaf)
            return leaf if isinstance(b, FUNCS + (ast.ClassDef,)) else None
        b = mod.scope.names.get(cls)
        if not isinstance(b, ast.ClassDef):
            return None
        scope = self.class_scope(b, mod.package)
        return f"{cls}.{leaf}" if leaf in scope.names else None

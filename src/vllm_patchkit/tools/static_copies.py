"""Static, by-value copies: which modules of a release hold a function by value (`from m import f`).

A patch installed at `m:f` never reaches a module that did `from m import f` before it ran: that module
calls the original (the brief's "copies held elsewhere": `vllm.v1.engine.core` imports
`get_kv_cache_configs` by value). The loader finds such copies in the processes it runs in
(`verify.stale_copies`, over `sys.modules`); this finds them in a release's source, for `check` and `pin`,
so both answer the same question the same way, before anything runs. It finds a superset of the loader's:
every module of the release, imported in a given process or not.

One pass per release builds an index of every `from X import name [as alias]` statement (a regular
expression over the files' text; each file read once), keyed by the imported name; each candidate is then
confirmed by resolving it with the static reader (`StaticRelease.resolve`), which follows re-exports and
knows which statements bind a module's names (a function-local import binds none).
"""

from __future__ import annotations

import re
from typing import Optional

from vllm_patchkit.declaration.names import Target

_FROM_IMPORT = re.compile(rb"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE)
_NAME = re.compile(r"^\s*([A-Za-z_]\w*)(?:\s+as\s+([A-Za-z_]\w*))?\s*$")


class ImportIndex:
    """The release's `from X import name [as alias]` statements, found by name: files are read once (kept by
    the release) and searched only for the names asked about, so the cost grows with the names, not the release."""

    def __init__(self, release, top: str = "vllm") -> None:
        self.release = release
        self.top = top  # the top-level package searched (the target's)
        self._texts: Optional[list[tuple[str, bytes]]] = None
        self._all: Optional[list[tuple[str, bytes]]] = None
        self._by_name: dict[str, list[tuple[str, str, str, bool]]] = {}

    def _files(self) -> list[tuple[str, bytes]]:
        if self._texts is None:
            self._texts = [(mod, raw) for mod, raw in self.texts() if b"import" in raw]
        return self._texts

    def texts(self) -> list[tuple[str, bytes]]:
        """(module, text) of every module of the package, read once (the call-site reader shares them)."""
        if self._all is None:
            from vllm_patchkit.upstream.static_source import module_name

            src = self.release.source
            self._all = [(module_name(rel), raw) for rel in src.python_files(self.top) if (raw := src.read(rel))]
        return self._all

    def candidates(self, name: str) -> list[tuple[str, str, str, bool]]:
        """(importing module, bound name, module imported from (absolute), indented?) for each import of `name`."""
        if name not in self._by_name:
            from vllm_patchkit.upstream.static_tables import absolute

            needle = name.encode()
            out = []
            for mod, raw in self._files():
                if needle not in raw:
                    continue
                package = mod if raw is not None and self._is_package(mod) else mod.rpartition(".")[0]
                for m in _FROM_IMPORT.finditer(raw):
                    if needle not in m.group(2):
                        continue
                    names = m.group(2).decode("utf-8", "replace").strip().strip("()").replace("\\\n", " ")
                    level = len(m.group(1)) - len(m.group(1).lstrip(b"."))
                    frm = absolute(m.group(1).decode().lstrip(".") or None, level, package)
                    indented = raw[m.start():m.start() + 1] in (b" ", b"\t")
                    for part in names.replace("\n", " ").split(","):
                        nm = _NAME.match(part)
                        if nm and nm.group(1) == name:
                            out.append((mod, nm.group(2) or name, frm, indented))
            self._by_name[name] = out
        return self._by_name[name]

    def _is_package(self, mod: str) -> bool:
        return self.release.source.read(mod.replace(".", "/") + "/__init__.py") is not None


def holders(release, spec: str) -> list[str]:
    """Every `module:name` of the release other than `spec` that holds the function `spec` names by value
    (sorted). Only module-level functions are copied this way; anything else gives []."""
    from vllm_patchkit.upstream.missing import Missing

    place = Target.parse(spec)
    if place.is_member:
        return []
    target = release.resolve(spec)
    if isinstance(target, Missing) or target.kind not in ("function",):
        return []
    top = place.module.split(".")[0]
    indexes = release.__dict__.setdefault("_import_indexes", {})
    index = indexes.get(top) or indexes.setdefault(top, ImportIndex(release, top))
    leaf = target.qualname.rpartition(".")[2]
    found = set()
    for mod, bound, frm, indented in index.candidates(leaf):
        where = f"{mod}:{bound}"
        if where in (spec, target.where):
            continue
        try:
            # a top-level statement binds the name: what it imports decides (the imported module is parsed,
            # usually the target's own, already read); an indented one may be local to a function: the
            # importing module's table decides
            d = release.resolve(where if indented else f"{frm}:{leaf}")
        except (SyntaxError, RecursionError, ValueError):
            continue
        if not isinstance(d, Missing) and d.where == target.where:
            found.add(where)
    return sorted(found)


def demanded_holders(release, spec: str, stage: str = "import") -> list[str]:
    """The holders of `spec` a patch there must list in `copies`: for an import-stage patch only those that may
    run before the plugins load (`upstream/import_order.py`: a later importer binds the patched object), for a
    config-stage one every holder. What `check` reports as `copy_undeclared` when one is not listed."""
    from vllm_patchkit.upstream.import_order import order_of

    found = holders(release, spec)
    if stage != "import":
        return found
    order = order_of(release)
    return [h for h in found if order.may_run_before_plugins(Target.parse(h).module)]

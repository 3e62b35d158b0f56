"""The per-file context every pass of the file scan shares: which file and module it is, the scopes the walk is
in, and the sites found so far.

The passes (`references.py` names, `value_sets.py` loops, `call_hints.py` calls, `assignments.py` and `calls.py`
the site recognisers, `sites.py` the walk) are objects of their own, each given this context and the passes it
asks; none holds another's data. What they share is here, and only here: the walk's position (`scopes`, `qual`,
`loops`), how the file's functions are called as the last hint pass learned (`call_bindings`), and the sites."""

from __future__ import annotations

import ast
from typing import Any, Callable, Optional

from vllm_patchkit.tools.scan.model import Site
from vllm_patchkit.tools.scan.syntax import is_vllm


class FileContext:
    """One plugin file as the passes read it. `module` is the file's module name; `plugin_tops` the plugin's
    top-level packages; `release` what the release says about types (an `upstream.Upstream`, or None: names
    only)."""

    def __init__(self, path: str, module: str, plugin_tops: set[str], is_package: bool = False,
                 release: Any = None):
        self.path = path
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.plugin_tops = plugin_tops
        # what the release says about types (an `upstream.Upstream`, or None: names only): the module a
        # try/except import falls back to, the class of `obj.attr`, of `f(...)`, of an overridden method's params
        self.release = release if release is not None and getattr(release, "release", None) is not None else None
        # where the walk is: one binding table per scope (References.collect), the qualified name, and the
        # literal names of the loops it is in (`for NAME in ("a", "b"): setattr(X, NAME, ...)`)
        self.scopes: list[dict[str, Any]] = []
        self.qual: list[str] = []
        self.loops: list[dict[str, list[str]]] = []
        # how each function of the file is called (one {param: object} per distinct call), as the last hint pass
        # learned (call_hints.py); read by the names pass for the attributes a plugin object's `__init__` stores
        self.call_bindings: dict[int, list[dict[str, tuple]]] = {}
        self.sites: list[Site] = []
        self.seen_sites: set[tuple] = set()
        self.errors: list[tuple[int, str]] = []  # (line, error) of statements the walk gave up on
        self.facts_classes: list = []  # (qualname, node, bases) of every class of the file

    def new_pass(self) -> None:
        """The walk reads the file again from the top: what a pass finds is that pass's."""
        self.sites, self.errors, self.scopes, self.facts_classes = [], [], [], []
        self.seen_sites = set()

    def add(self, mechanism: str, node: ast.AST, dotted: Optional[str] = None, what: str = "", **facts) -> Site:
        """Record a site (every recogniser's one way in): one site per place however often the place is read."""
        site = Site(mechanism, self.path, getattr(node, "lineno", 0), dotted, what=what, facts=facts)
        # a statement read once per value of a loop or per call of its function gives its site once per value
        # that changes it: the same place found again is the same site
        key = (mechanism, site.line, getattr(node, "col_offset", 0), dotted, what)
        if key in self.seen_sites:
            return site
        self.seen_sites.add(key)
        self.sites.append(site)
        return site

    # -- the scopes
    def lookup(self, name: str, upto: Optional[int] = None) -> Any:
        scopes = self.scopes if upto is None else self.scopes[:upto + 1]
        for i in range(len(scopes) - 1, -1, -1):
            if name in scopes[i]:
                return scopes[i][name], i
        return None, -1

    def in_scope(self, level: int, fn: Callable[[], Any]) -> Any:
        """`fn()` read with the scopes down to `level` only (where a name was bound)."""
        saved = self.scopes
        self.scopes = self.scopes[: level + 1]
        try:
            return fn()
        finally:
            self.scopes = saved

    def qualname(self, name: str) -> str:
        inner = ".".join([*self.qual, name])
        return f"{self.module}:{inner}"

    def kind_of(self, dotted: str) -> str:
        if is_vllm(dotted):
            return "vllm"
        return "plugin" if dotted.split(".")[0] in self.plugin_tops else "ext"

    def release_call(self, what: str, *args) -> Any:
        """Ask the release (`param_types`, `attr_type`, `return_type`, ...); None without one or on its error."""
        if self.release is None:
            return None
        try:
            return getattr(self.release, what)(*args)
        except (Exception, RecursionError):
            return None


__all__ = ["FileContext"]

"""Static: a target's fingerprint read from a wheel or a source tree, without importing vLLM.

`StaticRelease(open_source(path)).lookup("vllm.v1.engine.core:get_kv_cache_configs")`
parses only the modules the name passes through (each once; a parsed module is
cached), follows `from x import y` and `import x.y as z` to the definition, and
ends in `fingerprint.from_def` — the same code the live path ends in, so a
static and a live fingerprint of the same source compare equal.

What it reads: module-level functions and classes, methods (also private and
dunder ones, e.g. a dataclass's `__post_init__`), static and class methods,
properties (kind "attribute", as `fingerprint.raw_kind` sees them), class
attributes and module constants, nested classes, names imported by value from
another module of the release, and simple aliases (`x = y`).

One concept per module: `static_source.py` (the files of a wheel read in place, or
of a folder), `static_tables.py` (what each statement of a module or class body
binds, in execution order), `static_decorators.py` (the kind and the `__wrapped__`
layers a decorated def has live), `static_modules.py` (the release's modules, each
parsed once), `static_moved.py` (where a missing name went), and this one (following
names across modules and bases to a definition).

Traps, documented where they live (wrapt's habit):

- **Decorator layers** (`Fingerprint.wrappers`) are a best guess, the decorator
  is not run: the rules are in `static_decorators.py`.
- **Code that runs at import** is not run: a name set in a loop, by `setattr`,
  by `globals()`, through a module `__getattr__` that does not read a table
  of names (`static_lazy.py` reads those: `vllm.LLM` is `vllm.entrypoints.llm:LLM`),
  or by a star import of a module outside the release is not found. A lazy
  export is followed on the way to a member (`vllm:LLM.generate`, as Python's
  `vllm.LLM` does) and when imported, but is no target itself (`vllm:LLM`:
  nothing in `vllm` holds it to patch; the loader's `targets.resolve` agrees). `if TYPE_CHECKING:` blocks are
  skipped; for other `if`/`try` blocks the first branch wins over `else`/`except`
  (`static_tables.py`).
- **Generated methods** (a dataclass's `__init__`) have no source: not found.
- **Objects from outside the release** (a name imported from torch) are reported
  as unreadable, not guessed.
- **Inherited attributes**: a class that has a name only through a base is
  `Missing(inherited_from="module:Base.name")` (the base found first, depth
  first over `bases` as written; live, the MRO decides).

Why not griffe (issue 12 item 5; measured with `benchmarks/static_reader.py`, griffe 2.4.1, on
this project's shared 2-CPU machine, each reader in its own process). griffe was declared as a
dependency to build this reader on its loader; it is not built on it, and griffe is no longer a
dependency, because:

- **It loads the whole package, always.** `GriffeLoader.load("vllm")` visits every module of vLLM
  (2,705 / 2,802 / 3,154 modules in the 0.31.0 / 0.32.0 / 0.33.0 wheels); with `submodules=False`
  it loads only `vllm/__init__.py`, and `load("vllm.v1.engine.core", submodules=False)` fails
  (`KeyError: 'v1'`): there is no public way to load only the modules a lookup passes through.
  The 21 pinned places need 13 modules. Looking them up with source digests on 0.33.0: this
  reader 0.26 s and 69 MB peak RSS, griffe 39.3 s (37.8 s of it the load) and 390 MB: 150x.
  With every def of their modules too (625 / 638 / 663 places on 0.31.0 / 0.32.0 / 0.33.0):
  this reader 1.11 / 0.69 / 0.40 s and 110 / 112 / 71 MB, griffe 30.2 / 23.5 / 26.7 s and
  361 / 372 / 404 MB (27x / 34x / 67x). Per module griffe is not the cost: `griffe.visit` of
  10 of those modules (1 MB of source, 0.33.0) takes 0.34 s against 0.27 s for `ast.parse` plus
  the tables here; but a lazy loader on `griffe.visit` is a module finder, an on-demand loader and an
  alias resolver written here (or griffe's private `_load_submodule`), which is what griffe was to bring.
- **It cannot read a wheel.** Its finder and loader take file-system paths (a wheel on
  `search_paths` gives `ModuleNotFoundError: vllm`): the wheel's 3,231 `vllm/*.py` (57 MB) must
  be extracted first, 1-2.5 s. This reader decompresses only the files it parses.
- **Its model of a module is the documentation's, not the interpreter's**, so the project's rules
  would all still be written here, on top of it. On the synthetic package of
  `tests/contracts/test_static_reader.py`: `parse` bound by `try: from json import loads as parse`
  / `except ImportError: def parse(s)` is, for griffe, the fallback `def parse(s)` (the handler
  is visited last and overwrites the member), where the interpreter (and this reader) has
  `json.loads`; `public = _impl` and a class's `run = step` are griffe `Attribute`s with a value
  expression, not aliases (griffe gives kind "attribute"; live they are the function `(a, b=None)`
  and the method `step`). Its parameters render as `fingerprint.render_arguments` does (defaults
  too: `1e3`, `0x10`, `"a" "b"`, `2**10` give the same text); but griffe keeps no syntax tree, so
  the source digest, the decorator rules (does it call `functools.wraps`? which nested function
  does it return?) and the kind rules all reparse the definition from the lines griffe kept. With
  those rules on top (the benchmark's `GriffeReader`), griffe's answers equal this reader's on
  every vLLM place above, on all three releases (none is one of the cases just named): correctness
  is reachable with work; the time and memory of the whole-package load are not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import msgspec

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream import source_fingerprint as fp
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.static_decorators import decorated, kind_of
from vllm_patchkit.upstream.static_source import Source, open_source
from vllm_patchkit.upstream.static_tables import Binding, Import, ModuleRef, Scope, Value, dotted
from vllm_patchkit.tools.static_modules import ReleaseModules
from vllm_patchkit.tools.static_moved import MovedSearch


def literal_digest(node: ast.AST) -> Optional[str]:
    """The value digest of a constant written as a literal (as `fingerprint.value_digest` of the live
    value); None when the source does not spell a literal (a call, an expression, a property)."""
    return fp.literal_digest(node)


# -- results ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Definition:
    """Where a target is defined, and how it looks there."""

    module: str
    qualname: str
    node: ast.AST
    kind: str
    wrappers: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.module}:{self.qualname}"

    def fingerprint(self, with_digest: bool = False) -> Fingerprint:
        if isinstance(self.node, ast.Lambda):
            return Fingerprint(kind=self.kind, signature=fp.render_arguments(self.node.args))
        if self.kind == "attribute":
            return Fingerprint(kind="attribute", value_digest=literal_digest(self.node))
        f = fp.from_def(self.node, self.kind, with_digest)
        return msgspec.structs.replace(f, wrappers=list(self.wrappers)) if self.wrappers else f


# -- the release --------------------------------------------------------------------------------
class StaticRelease(ReleaseModules):
    """One release's source, read without importing it: names followed to their definitions."""

    def __init__(self, source: Source, version: Optional[str] = None):
        super().__init__(source, version)
        self._moved = MovedSearch(source, self.module, self._class_scope)

    @classmethod
    def open(cls, path: Union[str, Path], version: Optional[str] = None) -> "StaticRelease":
        return cls(open_source(path), version)

    # -- name resolution
    def _lookup(self, module: str, name: str, seen: frozenset = frozenset()) -> Union[tuple, Missing]:
        """What `module.name` is: ("def", module, qualname, node) / ("module", name) / ("value", ...)."""
        key = (module, name)
        if key in seen:
            return Missing(f"{module}:{name}", f"import cycle through {module}:{name}")
        seen = seen | {key}
        mod = self.module(module)
        if mod is None:
            return Missing(f"{module}:{name}", f"module {module!r} is not in this release")
        b = mod.scope.names.get(name)
        if b is None:
            for star in mod.scope.star:
                if self.module(star) is not None:
                    r = self._lookup(star, name, seen)
                    if not isinstance(r, Missing):
                        return r
            lazy = self.lazy(module).get(name)
            if lazy is not None:  # served by the module's `__getattr__` from its table (static_lazy.py)
                return self._lazy_export(module, name, lazy, seen)
            if self.module(f"{module}.{name}") is not None:
                return ("module", f"{module}.{name}")
            return Missing(f"{module}:{name}", f"module {module!r} has no attribute {name!r}")
        return self._follow(module, name, b, mod.scope, mod.package, seen)

    def _served_lazily(self, module: str, name: str) -> Optional[str]:
        """`module:name` names a lazy export (no binding of its own): where it is defined, else None."""
        mod = self.module(module)
        if mod is None or name in mod.scope.names or name not in self.lazy(module):
            return None
        r = self._lookup(module, name)
        if isinstance(r, Missing) or r[0] not in ("def", "value"):
            return None
        return f"{r[1]}:{r[2]}"

    def _lazy_export(self, module: str, name: str, lazy: tuple[str, Optional[str]], seen: frozenset):
        target, attr = lazy
        if self.module(target) is None:
            return Missing(f"{module}:{name}", f"{module!r} exports {name!r} lazily from {target!r}, which is not in "
                                               "this release")
        if attr is None:
            return ("module", target)
        r = self._lookup(target, attr, seen)
        if isinstance(r, Missing):
            return Missing(f"{module}:{name}", f"{module!r} exports {name!r} lazily from {target}:{attr}: {r.reason}")
        return r

    def _follow(self, module: str, name: str, b: Binding, scope: Scope, package: str, seen: frozenset,
                owner: str = ""):
        qual = f"{owner}.{name}" if owner else name
        if isinstance(b, ast.AST) and not isinstance(b, ast.expr):
            return ("def", module, qual, b)
        if isinstance(b, ModuleRef):
            return ("module", b.module) if self.module(b.module) is not None else (
                "external", f"{b.module}")
        if isinstance(b, Import):
            if self.module(b.module) is None:
                if self.module(f"{b.module}.{b.name}") is not None:
                    return ("module", f"{b.module}.{b.name}")
                top_in_release = self.source.read(b.module.split(".")[0] + "/__init__.py") is not None
                if top_in_release:
                    return Missing(f"{module}:{qual}", f"imports {b.name!r} from {b.module!r}, which is not in this release")
                return ("external", f"{b.module}:{b.name}")
            r = self._lookup(b.module, b.name, seen)
            if isinstance(r, Missing) and self.module(f"{b.module}.{b.name}") is not None:
                return ("module", f"{b.module}.{b.name}")
            return r
        if isinstance(b, Value):
            node = b.node
            if isinstance(node, ast.Name):
                inner = scope.names.get(node.id)
                if inner is not None and node.id != name:
                    return self._follow(module, node.id, inner, scope, package, seen, owner)
                if owner:  # a class body falls back to its module's names
                    return self._lookup(module, node.id, seen)
            if isinstance(node, ast.Attribute):
                name_path = dotted(node)
                if name_path:
                    r = self._dotted_in(module, name_path, seen)
                    if r is not None and not isinstance(r, Missing):
                        return r
            return ("value", module, qual, node)
        return Missing(f"{module}:{qual}", "unresolvable binding")

    def _dotted_in(self, module: str, name_path: str, seen: frozenset = frozenset()):
        head, *rest = name_path.split(".")
        r = self._lookup(module, head, seen)
        for part in rest:
            if isinstance(r, Missing):
                return r
            r = self._member(r, part, seen)
        return r

    def _member(self, owner, name: str, seen: frozenset = frozenset()):
        if owner[0] == "module":
            return self._lookup(owner[1], name, seen)
        if owner[0] == "def" and isinstance(owner[3], ast.ClassDef):
            _, module, qual, node = owner
            mod = self.module(module)
            scope = self._class_scope(node, mod.package if mod else module)
            b = scope.names.get(name)
            if b is None:
                definer = self._inherited_from(module, node, name, depth=0)
                if definer:
                    return Missing(f"{module}:{qual}.{name}", f"{name!r} is inherited from {definer}, "
                                   f"not defined on {qual}", (f"{definer}.{name}",), inherited_from=f"{definer}.{name}")
                return Missing(f"{module}:{qual}.{name}", f"{module}:{qual} has no attribute {name!r}")
            return self._follow(module, name, b, scope, mod.package if mod else module, seen, owner=qual)
        if owner[0] == "external":
            return ("external", f"{owner[1]}.{name}")
        what = owner[2] if len(owner) > 2 else owner[1]
        return Missing(f"{what}.{name}", f"{what} is not a class or module")

    def _inherited_from(self, module: str, node: ast.ClassDef, name: str, depth: int) -> Optional[str]:
        if depth > 20:
            return None
        for base in node.bases:
            name_path = dotted(base)
            if not name_path:
                continue
            r = self._dotted_in(module, name_path)
            if isinstance(r, Missing) or r[0] != "def" or not isinstance(r[3], ast.ClassDef):
                continue
            mod = self.module(r[1])
            scope = self._class_scope(r[3], mod.package if mod else r[1])
            if name in scope.names:
                return f"{r[1]}:{r[2]}"
            deeper = self._inherited_from(r[1], r[3], name, depth + 1)
            if deeper:
                return deeper
        return None

    # -- the public questions
    def resolve(self, spec: str) -> Union[Definition, Missing]:
        """The definition `module:Qualname` names in this release, or why there is none."""
        try:
            module, qualname = Target.parse(spec)
        except ValueError as exc:
            return Missing(spec, str(exc))
        parts = qualname.split(".")
        if self.module(module) is None:
            return Missing(spec, f"module {module!r} is not in this release")
        r: Any = ("module", module)
        owner_is_class = False
        for i, part in enumerate(parts):
            owner_is_class = r[0] == "def" and isinstance(r[3], ast.ClassDef)
            if i == len(parts) - 1 and r[0] == "module":
                served = self._served_lazily(r[1], part)
                if served:  # nothing in the module holds it: patching it there would change nothing
                    return Missing(spec, f"{r[1]!r} serves {part!r} lazily (its __getattr__) from {served}: no "
                                         f"binding in {r[1]} to patch; name the definition", (served,))
            r = self._member(r, part)
            if isinstance(r, Missing):  # inherited: only the attribute the spec names (not a class on the way)
                return Missing(spec, r.reason, r.moved_to,
                               inherited_from=r.inherited_from if i == len(parts) - 1 else None)
        if r[0] == "external":
            return Missing(spec, f"defined outside the release ({r[1]}); check it live", unreadable=True)
        if r[0] == "module":
            return Missing(spec, f"{spec} is a module, not an attribute")
        _, mod, qual, node = r
        if r[0] == "value":
            if isinstance(node, ast.Lambda):
                return Definition(mod, qual, node, "method" if owner_is_class else "function")
            return Definition(mod, qual, node if node is not None else ast.Constant(None), "attribute")
        effective, layers = decorated(mod, qual, node, self._dotted_in)
        return Definition(mod, qual, effective, kind_of(node, owner_is_class), layers)

    def lookup(self, spec: str, with_digest: bool = False) -> Union[Fingerprint, Missing]:
        """Fingerprint of the target as this release defines it, or Missing (with likely new homes)."""
        d = self.resolve(spec)
        if isinstance(d, Missing):
            if d.unreadable:
                return d
            if d.inherited_from:  # still reachable on the class, through a base: not moved
                return d
            return Missing(d.spec, d.reason, tuple(dict.fromkeys([*d.moved_to, *self.find_moved(spec)])))
        return d.fingerprint(with_digest)

    # -- attributes of each object
    def instance_attribute(self, spec: str) -> Union[Fingerprint, Missing]:
        """`module:Class.attr` as an attribute each object of the class gets from its methods (`self.attr = ...`):
        kind `instance_attribute` (`fingerprint.instance_attribute`, the rule the loader reads live too), or
        Missing saying why not. Bases are read in MRO order (C3, as Python computes it), bases outside the
        release left out (live, the loader leaves them out too)."""
        place = Target.parse(spec)
        module, cls_qual, attr = place.module, place.owner, place.attr
        if not cls_qual:
            return Missing(spec, f"{spec} does not name an attribute of a class (module:Class.attr)")
        d = self.resolve(f"{module}:{cls_qual}")
        if isinstance(d, Missing):
            return Missing(spec, d.reason, unreadable=d.unreadable)
        if not isinstance(d.node, ast.ClassDef):
            return Missing(spec, f"{module}:{cls_qual} is not a class ({d.kind})")
        got = fp.instance_attribute(self._mro(d.module, d.qualname, d.node), attr, f"{module}:{cls_qual}")
        if isinstance(got, Fingerprint):
            return got
        return Missing(spec, got[0], unreadable=got[1])

    def _mro(self, module: str, qual: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class and its bases in the release as Python's C3 linearisation orders them (depth first over the
        bases as written when the bases admit no C3 order)."""
        memo: dict[str, list[tuple[str, ast.ClassDef]]] = {}

        def bases(mod: str, n: ast.ClassDef) -> list[tuple[str, str, ast.ClassDef]]:
            out = []
            for b in n.bases:
                r = self._dotted_in(mod, dotted(b)) if dotted(b) else None
                if r is not None and not isinstance(r, Missing) and r[0] == "def" and isinstance(r[3], ast.ClassDef):
                    out.append((r[1], r[2], r[3]))
            return out

        def linear(mod: str, q: str, n: ast.ClassDef, depth: int = 0) -> list[tuple[str, ast.ClassDef]]:
            key = f"{mod}:{q}"
            if key in memo:
                return memo[key]
            if depth > 30:
                return [(key, n)]
            parents = bases(mod, n)
            seqs = [list(linear(m, bq, bn, depth + 1)) for m, bq, bn in parents] + [
                [(f"{m}:{bq}", bn) for m, bq, bn in parents]]
            out = [(key, n)]
            while any(seqs):
                head = next((s[0] for s in seqs if s and not any(s[0][0] in (x for x, _ in t[1:]) for t in seqs)),
                            None)
                if head is None:  # no C3 order (Python would refuse the class): depth first, each class once
                    rest = [c for s in seqs for c in s]
                    out += [c for i, c in enumerate(rest) if c[0] not in {x for x, _ in out + rest[:i]}]
                    break
                out.append(head)
                seqs = [s[1:] if s and s[0][0] == head[0] else s for s in seqs]
            memo[key] = out
            return out

        return linear(module, qual, node)

    # -- where did it go?
    def find_moved(self, spec: str, limit: int = 5) -> list[str]:
        """Other places in the release that define the same class-and-member (or function) name
        (`MovedSearch.find`: nearest package first)."""
        return self._moved.find(spec, limit)


__all__ = ["Definition", "StaticRelease", "literal_digest"]

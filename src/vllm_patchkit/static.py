"""Static: a target's fingerprint read from a wheel or a source tree, without importing vLLM.

Size (~690 lines): a hand-written reader of Python sources (imports, re-exports, decorators,
inheritance, by-value copies). Issue 12 asks to rebuild it on griffe's loader with this
project's rules as an extension; until then it stays one module, tested against live imports
(tests/contracts/test_static_reader.py: static == live on a synthetic tree and a wheel).

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

Traps, documented where they live (wrapt's habit):

- **Decorator layers** (`Fingerprint.wrappers`) are a best guess: live, a layer
  is anything with `__wrapped__`, and statically the decorator is not run. The
  rules, applied bottom-up: a decorator known not to wrap (`NOT_WRAPPING`:
  staticmethod, property, abstractmethod, overload, pydantic validators, ...)
  adds nothing; `functools.cache`/`lru_cache` add `functools._lru_cache_wrapper`;
  a decorator defined in the release adds a layer named `<module>.<qualname>` of
  the function (what a `functools.wraps` layer reports live) if its code calls
  `wraps`/`update_wrapper` or sets `__wrapped__`; if it always returns a nested
  function without them, that nested function is what live sees (its signature
  and digest are read instead); otherwise it is taken to return the function
  unchanged. A decorator from outside the release (torch, ...) counts as one
  layer. vLLM decorators that wrap only in some environments are listed in
  `KNOWN_DECORATORS` with their usual behaviour (`@instrument` wraps when
  OpenTelemetry is importable; `@with_gpu_sync_check` only in a debug mode): in
  another environment the live layers differ from the pin. Class decorators that
  replace methods (vLLM's `@support_torch_compile` rewrites `__init__`) are not seen.
- **Code that runs at import** is not run: a name set in a loop, by `setattr`,
  by `globals()`, through a module `__getattr__`, or by a star import of a
  module outside the release is not found. `if TYPE_CHECKING:` blocks are
  skipped; for other `if`/`try` blocks the first branch wins over `else`/`except`.
- **Generated methods** (a dataclass's `__init__`) have no source: not found.
- **Objects from outside the release** (a name imported from torch) are reported
  as unreadable, not guessed.
- **Inherited attributes**: a class that has a name only through a base is
  `Missing(inherited_from="module:Base.name")` (the base found first, depth
  first over `bases` as written; live, the MRO decides).
"""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from . import fingerprint as fp
from .schema import Fingerprint

# Decorators that leave no `__wrapped__` layer (matched on the last dotted name).
NOT_WRAPPING = frozenset({
    "staticmethod", "classmethod", "property", "cached_property", "abstractmethod", "abstractproperty",
    "overload", "override", "final", "setter", "getter", "deleter", "no_type_check", "runtime_checkable",
    "dataclass", "total_ordering", "unique", "unused", "ignore", "export",
    "model_validator", "field_validator", "validator", "root_validator", "field_serializer", "model_serializer",
})
# Decorators whose layer is an object, not a function: live names the object's type.
OBJECT_LAYERS = {"lru_cache": "functools._lru_cache_wrapper", "cache": "functools._lru_cache_wrapper"}
# vLLM's decorators that wrap only in some environments: do they in a standard deployment?
KNOWN_DECORATORS = {
    "vllm.tracing:instrument": True,  # wraps when OpenTelemetry is importable (a dependency of vLLM)
    "vllm.utils.gpu_sync_debug:with_gpu_sync_check": False,  # wraps only in vLLM's GPU-sync debug mode
}
ATTRIBUTE_DECORATORS = frozenset({"property", "cached_property", "setter", "getter", "deleter", "abstractproperty"})

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _sets_wrapped(node: ast.AST) -> bool:
    """Does this decorator (or decorator factory, or class) leave `__wrapped__` on what it returns?"""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            name = (_dotted(n.func) or "").rpartition(".")[2]
            if name in ("wraps", "update_wrapper"):
                return True
        elif isinstance(n, ast.Attribute) and n.attr == "__wrapped__" and isinstance(n.ctx, ast.Store):
            return True
    return False


def _returned_nested_def(fn: ast.AST) -> Optional[ast.AST]:
    """The nested function a plain decorator always returns (None if it may return anything else)."""
    nested = {st.name: st for st in fn.body if isinstance(st, FUNCS)}
    returns: list[ast.Return] = []
    stack = list(fn.body)
    while stack:
        st = stack.pop()
        if isinstance(st, ast.Return):
            returns.append(st)
        elif not isinstance(st, (*FUNCS, ast.ClassDef)):
            stack.extend(c for c in ast.iter_child_nodes(st) if isinstance(c, ast.stmt))
    names = {r.value.id if isinstance(r.value, ast.Name) else None for r in returns}
    if len(names) == 1:
        name = names.pop()
        return nested.get(name) if name else None
    return None


# -- sources ------------------------------------------------------------------------------------
class Source:
    """Files of a release: relative POSIX paths under the root that holds the top-level packages."""

    label: str

    def read(self, rel: str) -> Optional[bytes]:
        raise NotImplementedError

    def python_files(self, top: str) -> list[str]:
        raise NotImplementedError

    def root(self) -> Any:
        """A pathlib-like root (`/`, `.read_text()`, `.is_file()`) handed to retirement probes."""
        raise NotImplementedError

    def version_hint(self) -> Optional[str]:
        return None


class DirSource(Source):
    """An unpacked source tree or an installed site-packages folder."""

    def __init__(self, root: Path):
        self._root = Path(root)
        self.label = str(self._root)

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return (self._root / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def python_files(self, top: str) -> list[str]:
        base = self._root / top
        return sorted(p.relative_to(self._root).as_posix() for p in base.rglob("*.py")) if base.is_dir() else []

    def root(self) -> Path:
        return self._root


class WheelSource(Source):
    """A wheel (or any zip) read in place: members are decompressed one at a time, on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.label = str(self.path)
        self._zip = zipfile.ZipFile(self.path)
        self._names = set(self._zip.namelist())

    def read(self, rel: str) -> Optional[bytes]:
        return self._zip.read(rel) if rel in self._names else None

    def python_files(self, top: str) -> list[str]:
        prefix = top.rstrip("/") + "/"
        return sorted(n for n in self._names if n.startswith(prefix) and n.endswith(".py"))

    def root(self) -> zipfile.Path:
        return zipfile.Path(self._zip)

    def version_hint(self) -> Optional[str]:
        parts = self.path.name.split("-")
        return parts[1] if self.path.suffix == ".whl" and len(parts) > 2 else None

    def close(self) -> None:
        self._zip.close()


def open_source(path: Union[str, Path]) -> Source:
    """A wheel/zip file or a directory (the folder that holds `vllm/`, or `vllm/` itself)."""
    p = Path(path)
    if p.is_file():
        if not zipfile.is_zipfile(p):
            raise ValueError(f"{p}: not a wheel or zip file")
        return WheelSource(p)
    if p.is_dir():
        if (p / "__init__.py").is_file() and not (p / p.name / "__init__.py").is_file():
            return DirSource(p.parent)  # given the package folder itself
        return DirSource(p)
    raise FileNotFoundError(f"{p}: no such wheel or source folder")


def _literal_digest(node: ast.AST) -> Optional[str]:
    """The value digest of a constant written as a literal (as `fingerprint.value_digest` of the live
    value); None when the source does not spell a literal (a call, an expression, a property)."""
    if not isinstance(node, ast.expr):
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return fp.value_digest(value)


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
            return Fingerprint(kind="attribute", value_digest=_literal_digest(self.node))
        f = fp.from_def(self.node, self.kind, with_digest)
        return f.model_copy(update={"wrappers": list(self.wrappers)}) if self.wrappers else f


@dataclass(frozen=True)
class Missing:
    """A target that is not there: why, and where a definition of the same name now lives."""

    spec: str
    reason: str
    moved_to: tuple[str, ...] = ()
    unreadable: bool = False  # found, but defined outside the release (cannot be read statically)
    # the class still has the attribute, but only through a base: the base's definition (`module:Base.attr`)
    inherited_from: Optional[str] = None


# -- module tables ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Import:
    module: str
    name: str


@dataclass(frozen=True)
class _ModuleRef:
    module: str


@dataclass(frozen=True)
class _Value:
    node: Optional[ast.expr]  # None: bound by something we do not evaluate (tuple unpacking, ...)


Binding = Union[ast.AST, _Import, _ModuleRef, _Value]


@dataclass
class _Scope:
    names: dict[str, Binding] = field(default_factory=dict)
    star: list[str] = field(default_factory=list)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: Optional[str], level: int, package: str) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, module] if module else base)


def _bind(stmts: list[ast.stmt], scope: _Scope, package: str) -> None:
    """Record what each statement binds, in execution order (a later binding wins)."""
    for st in stmts:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.names[st.name] = st
        elif isinstance(st, ast.Import):
            for a in st.names:
                if a.asname:
                    scope.names[a.asname] = _ModuleRef(a.name)
                else:
                    top = a.name.split(".")[0]
                    scope.names[top] = _ModuleRef(top)
        elif isinstance(st, ast.ImportFrom):
            mod = _absolute(st.module, st.level, package)
            for a in st.names:
                if a.name == "*":
                    scope.star.append(mod)
                else:
                    scope.names[a.asname or a.name] = _Import(mod, a.name)
        elif isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    scope.names[t.id] = _Value(st.value)
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for e in t.elts:
                        if isinstance(e, ast.Name):
                            scope.names[e.id] = _Value(None)
        elif isinstance(st, ast.AnnAssign) and st.value is not None and isinstance(st.target, ast.Name):
            scope.names[st.target.id] = _Value(st.value)
        elif isinstance(st, ast.If):
            if _is_type_checking(st.test):
                _bind(st.orelse, scope, package)
            else:
                _bind(st.orelse, scope, package)
                _bind(st.body, scope, package)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            for h in st.handlers:
                _bind(h.body, scope, package)
            _bind(st.body, scope, package)
            _bind(st.orelse, scope, package)
            _bind(st.finalbody, scope, package)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _bind(st.body, scope, package)
        elif isinstance(st, ast.Delete):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    scope.names.pop(t.id, None)


@dataclass
class _Module:
    name: str
    path: str
    package: str  # the package relative imports start from
    scope: _Scope


@dataclass(frozen=True)
class _Owner:
    """A resolved owner on the way down a qualname: a module, or a class defined in a module."""

    module: str
    qualname: str = ""  # "" for the module itself
    node: Optional[ast.ClassDef] = None


def _dotted(expr: ast.expr) -> Optional[str]:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr}" if head else None
    return None


# -- the release --------------------------------------------------------------------------------
class StaticRelease:
    """One release's source, read without importing it. Parsed modules are cached per instance."""

    def __init__(self, source: Source, version: Optional[str] = None):
        self.source = source
        self._modules: dict[str, Optional[_Module]] = {}
        self._class_scopes: dict[int, _Scope] = {}
        self._texts: dict[str, bytes] = {}  # file -> text, read once (for find_moved)
        self._moved: dict[tuple[str, int], list[str]] = {}
        self._version = version

    @classmethod
    def open(cls, path: Union[str, Path], version: Optional[str] = None) -> "StaticRelease":
        return cls(open_source(path), version)

    @property
    def label(self) -> str:
        return self.source.label

    def version(self, package: str = "vllm") -> Optional[str]:
        """The release version: given, else `<package>/_version.py` or `version.py`, else the wheel name."""
        if self._version:
            return self._version
        for rel in (f"{package}/_version.py", f"{package}/version.py"):
            raw = self.source.read(rel)
            if raw is None:
                continue
            for node in ast.parse(raw).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                    if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                        self._version = node.value.value
                        return self._version
        self._version = self.source.version_hint()
        return self._version

    # -- modules
    def module(self, name: str) -> Optional[_Module]:
        if name in self._modules:
            return self._modules[name]
        rel = name.replace(".", "/")
        mod = None
        for path, is_pkg in ((f"{rel}.py", False), (f"{rel}/__init__.py", True)):
            raw = self.source.read(path)
            if raw is None:
                continue
            tree = ast.parse(raw, filename=path)
            scope = _Scope()
            package = name if is_pkg else name.rpartition(".")[0]
            _bind(tree.body, scope, package)
            mod = _Module(name, path, package, scope)
            break
        self._modules[name] = mod
        return mod

    def _class_scope(self, node: ast.ClassDef, package: str) -> _Scope:
        scope = self._class_scopes.get(id(node))
        if scope is None:
            scope = _Scope()
            _bind(node.body, scope, package)
            self._class_scopes[id(node)] = scope
        return scope

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
            if self.module(f"{module}.{name}") is not None:
                return ("module", f"{module}.{name}")
            return Missing(f"{module}:{name}", f"module {module!r} has no attribute {name!r}")
        return self._follow(module, name, b, mod.scope, mod.package, seen)

    def _follow(self, module: str, name: str, b: Binding, scope: _Scope, package: str, seen: frozenset,
                owner: str = ""):
        qual = f"{owner}.{name}" if owner else name
        if isinstance(b, ast.AST) and not isinstance(b, ast.expr):
            return ("def", module, qual, b)
        if isinstance(b, _ModuleRef):
            return ("module", b.module) if self.module(b.module) is not None else (
                "external", f"{b.module}")
        if isinstance(b, _Import):
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
        if isinstance(b, _Value):
            node = b.node
            if isinstance(node, ast.Name):
                inner = scope.names.get(node.id)
                if inner is not None and node.id != name:
                    return self._follow(module, node.id, inner, scope, package, seen, owner)
                if owner:  # a class body falls back to its module's names
                    return self._lookup(module, node.id, seen)
            if isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if dotted:
                    r = self._dotted_in(module, dotted, seen)
                    if r is not None and not isinstance(r, Missing):
                        return r
            return ("value", module, qual, node)
        return Missing(f"{module}:{qual}", "unresolvable binding")

    def _dotted_in(self, module: str, dotted: str, seen: frozenset):
        head, *rest = dotted.split(".")
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
            dotted = _dotted(base)
            if not dotted:
                continue
            r = self._dotted_in(module, dotted, frozenset())
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
        module, _, qualname = spec.partition(":")
        parts = qualname.split(".")
        if self.module(module) is None:
            return Missing(spec, f"module {module!r} is not in this release")
        r: Any = ("module", module)
        owner_is_class = False
        for i, part in enumerate(parts):
            owner_is_class = r[0] == "def" and isinstance(r[3], ast.ClassDef)
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
        effective, layers = self._decorated(mod, qual, node)
        return Definition(mod, qual, effective, self._kind(node, owner_is_class), layers)

    @staticmethod
    def _kind(node: ast.AST, owner_is_class: bool) -> str:
        """As `fingerprint.raw_kind` will see the object in the class or module `__dict__`."""
        if isinstance(node, ast.ClassDef):
            return "class"
        if not owner_is_class:
            return "function"
        for d in node.decorator_list:  # outermost first; decorators that return their argument are skipped
            last = (_dotted(d.func if isinstance(d, ast.Call) else d) or "").rpartition(".")[2]
            if last in ("staticmethod", "classmethod"):
                return last
            if last in ATTRIBUTE_DECORATORS:
                return "attribute"
            if last in ("field_validator", "validator", "root_validator"):
                return "classmethod"  # pydantic makes these class methods
            if last == "model_validator":
                mode = next((k.value for k in getattr(d, "keywords", []) if k.arg == "mode"), None)
                after = isinstance(mode, ast.Constant) and mode.value == "after"
                return "method" if after else "classmethod"
            if last not in NOT_WRAPPING:
                break
        return "method"

    def _decorated(self, module: str, qual: str, node: ast.AST) -> tuple[ast.AST, tuple[str, ...]]:
        """What `inspect.unwrap` reaches under the decorators, and the `__wrapped__` layers above it.

        Decorators are applied bottom-up, as Python does: one that leaves a layer
        adds its name; one that returns a nested function without `functools.wraps`
        replaces the function (live sees that nested function, and no layer below it).
        """
        if not isinstance(node, FUNCS):
            return node, ()
        bottom, bottom_name, layers = node, f"{module}.{qual}", []
        for dec in reversed(node.decorator_list):
            how = self._decorator(module, dec)
            if how[0] == "layer":
                layers.insert(0, how[1] or bottom_name)
            elif how[0] == "replace":
                bottom, bottom_name, layers = how[2], how[1], []
        return bottom, tuple(layers)

    def _decorator(self, module: str, dec: ast.expr) -> tuple:
        """("none",) | ("layer", name or None for the function's own name) | ("replace", name, nested def)."""
        dotted = _dotted(dec.func if isinstance(dec, ast.Call) else dec)
        last = (dotted or "").rpartition(".")[2]
        if last in NOT_WRAPPING:
            return ("none",)
        if last in OBJECT_LAYERS:
            return ("layer", OBJECT_LAYERS[last])
        r = self._dotted_in(module, dotted, frozenset()) if dotted else None
        if r is None or isinstance(r, Missing) or r[0] != "def":
            return ("layer", None)  # outside the release: assume a functools.wraps layer
        where = f"{r[1]}:{r[2]}"
        if where in KNOWN_DECORATORS:
            return ("layer", None) if KNOWN_DECORATORS[where] else ("none",)
        fn = r[3]
        if isinstance(fn, ast.ClassDef):
            return ("layer", f"{r[1]}.{r[2]}") if _sets_wrapped(fn) else ("layer", None)
        if _sets_wrapped(fn):
            return ("layer", None)
        if not isinstance(dec, ast.Call):
            nested = _returned_nested_def(fn)
            if nested is not None:
                return ("replace", f"{r[1]}.{r[2]}.<locals>.{nested.name}", nested)
        return ("none",)  # returns the function itself (a registration) or nothing we can read

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

    # -- where did it go?
    def find_moved(self, spec: str, limit: int = 5) -> list[str]:
        """Other places in the release that define the same class-and-member (or function) name.

        Searched nearest first: the target's own package, then each parent up to the
        top-level package, stopping at the first level with a hit. A text search picks
        candidate files (each file's text is read once); only those are parsed.
        """
        if (spec, limit) in self._moved:
            return self._moved[(spec, limit)]
        module, _, qualname = spec.partition(":")
        parts = qualname.split(".")
        leaf = parts[-1]
        cls = parts[-2] if len(parts) > 1 else None
        needles = (f"def {cls or leaf}".encode(), f"class {cls or leaf}".encode())
        found: list[str] = []
        self._moved[(spec, limit)] = found
        package = module.split(".")
        for depth in range(len(package) - 1, 0, -1):
            for rel in self.source.python_files("/".join(package[:depth])):
                raw = self._texts.get(rel)
                if raw is None:
                    raw = self._texts[rel] = self.source.read(rel) or b""
                if not any(n in raw for n in needles):
                    continue
                name = rel[:-3].replace("/", ".")
                name = name[: -len(".__init__")] if name.endswith(".__init__") else name
                mod = self.module(name)
                hit = self._defined_here(mod, cls, leaf) if mod is not None else None
                if hit and f"{name}:{hit}" != spec and f"{name}:{hit}" not in found:
                    found.append(f"{name}:{hit}")
            if found:
                break
        del found[limit:]
        return found

    def _defined_here(self, mod: _Module, cls: Optional[str], leaf: str) -> Optional[str]:
        """`cls.leaf` (or `leaf`) if the module itself defines it (imports do not count)."""
        if cls is None:
            b = mod.scope.names.get(leaf)
            return leaf if isinstance(b, FUNCS + (ast.ClassDef,)) else None
        b = mod.scope.names.get(cls)
        if not isinstance(b, ast.ClassDef):
            return None
        scope = self._class_scope(b, mod.package)
        return f"{cls}.{leaf}" if leaf in scope.names else None

    def iter_defs(self, top: str = "vllm") -> Iterator[str]:
        """Every module-level function, class and method spec in the release (for benchmarks)."""
        for rel in self.source.python_files(top):
            name = rel[:-3].replace("/", ".")
            name = name[: -len(".__init__")] if name.endswith(".__init__") else name
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


__all__ = ["Definition", "DirSource", "Missing", "Source", "StaticRelease", "WheelSource", "open_source"]

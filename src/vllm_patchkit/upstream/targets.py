"""Resolve `module:Qualname` to the place that holds an object, and get or set it there.

Class attributes are read from the owning class's own `__dict__`: `getattr`
would hand back a bound method or an inherited function, and setting that
back would patch the wrong class.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Optional

from msgspec import Struct

from vllm_patchkit.declaration.names import Target

MISSING = object()


class TargetError(LookupError):
    """The target cannot be reached: module not importable, attribute gone, or inherited."""


class Place(Struct, frozen=True):
    """Where an object lives: an owner (module or class) and an attribute name."""

    spec: str
    owner: Any
    attr: str

    @property
    def owner_is_class(self) -> bool:
        return isinstance(self.owner, type)

    def get_raw(self) -> Any:
        """What the owner (a module or a class) holds itself under the name, never an inherited value."""
        return self.owner.__dict__.get(self.attr, MISSING)

    def set_raw(self, value: Any) -> None:
        if value is MISSING:
            if self.attr in self.owner.__dict__:
                delattr(self.owner, self.attr)
            return
        setattr(self.owner, self.attr, value)


class InheritedPlace(Place, frozen=True):
    """A method a class has only through a base (`instances: true` patches objects, whose attribute lookup
    goes through the MRO): read where the MRO finds it, never written here."""

    definer: str = ""  # module:Base.attr, where the MRO finds it

    def get_raw(self) -> Any:
        for klass in self.owner.__mro__:
            if self.attr in klass.__dict__:
                return klass.__dict__[self.attr]
        return MISSING

    def set_raw(self, value: Any) -> None:
        raise TypeError(f"{self.spec} is inherited from {self.definer}: an instances patch never writes it")


def resolve_through_mro(spec: str) -> Optional[InheritedPlace]:
    """`module:Class.attr` that the class has only through a base, as an InheritedPlace; else None."""
    module_name, parts = split(spec)
    owner: Any = sys.modules.get(module_name)
    for part in parts[:-1]:
        owner = getattr(owner, "__dict__", {}).get(part, MISSING)
        if owner is MISSING:
            return None
    attr = parts[-1]
    if not isinstance(owner, type) or attr in owner.__dict__:
        return None
    definer = next((c for c in owner.__mro__[1:] if attr in c.__dict__), None)
    if definer is None:
        return None
    return InheritedPlace(spec, owner, attr, f"{definer.__module__}:{definer.__qualname__}.{attr}")


def split(spec: str) -> tuple[str, list[str]]:
    try:
        target = Target.parse(spec)
    except ValueError as exc:
        raise TargetError(str(exc)) from None
    return target.module, target.parts


def _lazy_export(owner: Any, name: str) -> Any:
    """A module's PEP 562 export (`vllm.LLM`, served by `vllm.__getattr__`) on the way to a member, as Python's
    attribute access finds it; MISSING if the owner is no such module or its `__getattr__` refuses the name. Only
    on the way: the export itself is held by no module attribute, so it is no place to patch (static.py agrees)."""
    if not isinstance(owner, types.ModuleType) or "__getattr__" not in owner.__dict__:
        return MISSING
    try:
        return owner.__dict__["__getattr__"](name)
    except AttributeError:
        return MISSING


def resolve(spec: str, *, import_module: bool = True) -> Place:
    """Find the place named by `spec`; raise TargetError saying what is missing."""
    module_name, parts = split(spec)
    if import_module:
        try:
            owner: Any = importlib.import_module(module_name)
        except Exception as exc:  # an upstream import error is data here
            raise TargetError(f"module {module_name!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    else:
        owner = sys.modules.get(module_name)
        if owner is None:
            raise TargetError(f"module {module_name!r} is not imported")
    for i, part in enumerate(parts[:-1]):
        nxt = owner.__dict__.get(part, MISSING) if hasattr(owner, "__dict__") else MISSING
        if nxt is MISSING:
            nxt = _lazy_export(owner, part)
        if nxt is MISSING:
            where = ".".join(parts[:i]) or module_name
            raise TargetError(f"{where!r} has no attribute {part!r} (target moved or removed)")
        owner = nxt
    attr = parts[-1]
    place = Place(spec, owner, attr)
    if place.get_raw() is MISSING:
        if isinstance(owner, type) and hasattr(owner, attr):
            definer = next((c for c in owner.__mro__ if attr in c.__dict__), None)
            name = f"{definer.__module__}:{definer.__qualname__}" if definer else "a base class"
            raise TargetError(f"{spec}: {attr!r} is inherited from {name}, not defined on {owner.__qualname__}")
        raise TargetError(f"{spec}: no attribute {attr!r} (target moved or removed)")
    return place


def load_object(spec: str) -> Any:
    """Import `module:name` and return the object (for implementations and probes)."""
    return resolve(spec).get_raw()


#: Names a module has when it runs as the program: `python -m pkg.mod` executes pkg.mod as `__main__`, and
#: multiprocessing's spawned children run it again as `__mp_main__`.
MAIN_ALIASES = ("__main__", "__mp_main__")


def main_aliases(specs) -> list[str]:
    """The same places in the program's own module, when that module is one the specs name.

    Why: `python -m vllm.entrypoints.openai.api_server` runs that module as `__main__`; a function it holds by
    value is then a copy at `__main__:name`, the declared copy under the name the program gave it. Patched and
    judged as the declared copy, not reported as an undeclared one."""
    out = []
    for alias in MAIN_ALIASES:
        name = getattr(getattr(sys.modules.get(alias), "__spec__", None), "name", None)
        if not name:
            continue
        for place in map(Target.parse, specs):
            if place.module == name and not place.is_member:
                out.append(f"{alias}:{place.qualname}")
    return out


def function_of(raw: Any) -> Any:
    """The function a class attribute holds (a property's getter, a static/classmethod's function)."""
    if isinstance(raw, property):
        return raw.fget
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

"""`instances: true`: a patch on each object vLLM builds of a class (the class's `__init__` is wrapped so every
new object gets the patched method, or the value, as its own attribute), for targets that objects override or
reassign per instance."""

from __future__ import annotations

import copy
import functools
import logging
import types
import weakref
from typing import Any, Callable

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.wrappers import MARK, build_callable
from vllm_patchkit.upstream.targets import MISSING, Place, function_of

log = logging.getLogger("vllm.patchkit")

def init_place(place: Place) -> Place:
    """The `__init__` of the class owning `place` (in its own __dict__, MISSING when inherited)."""
    module = Target.parse(place.spec).module
    return Place(f"{module}:{place.owner.__qualname__}.__init__", place.owner, "__init__")


def install_on_instances(patch: Patch, place: Place, impl: Any, count: bool, ctx: Any = None) -> Applied:
    """`instances: true`: wrap the class's __init__ so each new object gets the wrapped method as its own
    attribute; whatever override its class has is wrapped (one closure per class, shared by its objects)."""
    applied = Applied(patch, ctx=ctx)
    cls, method = place.owner, place.attr
    if ctx is not None:
        ctx.bind_target(function_of(place.get_raw()), True)
    where = init_place(place)
    raw_init = where.get_raw()
    upstream_init = cls.__init__  # through the MRO when the class has no own __init__
    made: dict[type, tuple[Any, Callable]] = {}  # class -> (the method as the class has it, the closure over it)
    objects = weakref.WeakSet() if cls.__weakrefoffset__ else None
    counter = applied.counter

    def patched_init(self, *args, **kwargs):
        upstream_init(self, *args, **kwargs)
        kind = type(self)
        raw = inspect_getattr_static(kind, method)
        hit = made.get(kind)
        if hit is None or hit[0] is not raw:  # first object of its class, or the class's method was re-bound
            # since (a class-level wrap applied later must be inside this object's closure, not bypassed)
            hit = made[kind] = (raw, build_callable(patch, function_of(raw), impl, counter, count, ctx, bound=True))
        fn = hit[1]
        self.__dict__[method] = types.MethodType(fn, self)
        if objects is not None:
            objects.add(self)

    _install_init(patch, applied, where, raw_init, patched_init, upstream_init, objects)
    return applied


class ObjectsSet:
    """The objects an instances `set` gave its value, weakly held, each with what it held before (as `len()` and
    iteration of `Applied.instances`); an object that is collected drops out."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # id -> (weak reference, the previous value or MISSING, the value given)
        self._held: dict[int, tuple[Any, Any, Any]] = {}

    def add(self, obj: Any, previous: Any, given: Any) -> None:
        key, held = id(obj), self._held

        def gone(_ref, key=key, held=held):
            held.pop(key, None)

        held[key] = (weakref.ref(obj, gone), previous, given)

    def items(self) -> list[tuple[Any, Any, Any]]:
        return [(obj, prev, given) for ref, prev, given in list(self._held.values()) if (obj := ref()) is not None]

    def __iter__(self):
        return iter([obj for obj, _, _ in self.items()])

    def __len__(self) -> int:
        return len(self._held)


def _held_value(obj: Any, attr: str) -> Any:
    """What the object itself holds under `attr` (its __dict__, else a slot), MISSING when nothing."""
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        return d.get(attr, MISSING)
    return getattr(obj, attr, MISSING)


def install_value_on_instances(patch: Patch, place: Place, value: Any, count: bool) -> Applied:
    """`kind: set` + `instances: true`: wrap the class's `__init__` so that, after vLLM's own `__init__` (which
    assigns `self.attr`), each new object gets `value` as its attribute (a list, dict or set written in the YAML
    is copied for each object, so objects never share one mutable value; an object from `value_from` is the same
    for all). Counted: objects set.

    `unpatch` puts back `__init__`; each object made meanwhile that still holds exactly the value set here gets
    back what vLLM's `__init__` gave it (an object whose attribute vLLM or anybody changed since keeps that value:
    it is theirs now)."""
    applied = Applied(patch)
    cls, attr = place.owner, place.attr
    where = init_place(place)
    raw_init = where.get_raw()
    upstream_init = cls.__init__  # through the MRO when the class has no own __init__
    objects = ObjectsSet() if cls.__weakrefoffset__ else None
    counter = applied.counter
    copied = patch.value_from is None and isinstance(value, (list, dict, set))

    def patched_init(self, *args, **kwargs):
        upstream_init(self, *args, **kwargs)
        previous = _held_value(self, attr)
        given = copy.deepcopy(value) if copied else value
        setattr(self, attr, given)
        if count:
            counter.calls += 1
        if objects is not None:
            objects.add(self, previous, given)

    def restore() -> None:
        for obj, previous, given in (objects.items() if objects is not None else ()):
            if _held_value(obj, attr) is not given:
                continue  # changed since by vLLM or anybody: theirs now
            if previous is MISSING:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
            else:
                setattr(obj, attr, previous)

    _install_init(patch, applied, where, raw_init, patched_init, upstream_init, objects)
    applied.restore = restore
    return applied


def marked_in(init: Any, key: str) -> bool:
    """Does this `__init__` (or any `__wrapped__` layer under it) carry the mark of patch `key`?"""
    seen = set()
    while init is not None and id(init) not in seen:
        seen.add(id(init))
        if getattr(init, MARK, None) == key:
            return True
        init = getattr(init, "__wrapped__", None)
    return False


def _install_init(patch: Patch, applied: "Applied", where: Place, raw_init: Any, patched_init: Callable,
                  upstream_init: Callable, objects: Any) -> None:
    """Put a patched `__init__` in place (marked as this patch's, reaching upstream's through `__wrapped__`) and
    remember what unpatch restores."""
    functools.update_wrapper(patched_init, upstream_init)
    patched_init.__wrapped__ = upstream_init
    setattr(patched_init, MARK, patch.key)
    where.set_raw(patched_init)
    applied.places.append((where, raw_init))
    applied.instances = objects if objects is not None else ()
    applied.installed, applied.original = patched_init, upstream_init


def inspect_getattr_static(cls: type, name: str) -> Any:
    """The method as the class (or a base) defines it, without binding it."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    raise AttributeError(f"{cls.__qualname__} has no attribute {name!r}")

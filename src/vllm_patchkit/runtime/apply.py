"""Apply: install a verified patch at its target (and every declared copy), and undo it.

Wrappers are plain closures, not proxies: they cost a counter increment and
one call, they hand vLLM's arguments on untouched, and they carry
`__wrapped__` (so `inspect.unwrap` reaches upstream) and `__vllm_patchkit__`
(so we recognise our own layer and never stack a second copy of it).

A `wrap` implementation is called `impl(wrapped, instance, args, kwargs[, ctx])`
(wrapt's vocabulary). Which closure stands at the target — a method's (the
instance split off and the original bound to it) or a function's, with the
context or without, counted or not — is decided once here, at install time.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from vllm_patchkit.declaration.schema import Kind, Patch
from vllm_patchkit.upstream.targets import MISSING, Place, TargetError, function_of, main_aliases, resolve

log = logging.getLogger("vllm.patchkit")

MARK = "__vllm_patchkit__"


class Counter:
    """Per-patch call count; a slot attribute so the hot path is one add."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


def _counted_passthrough(original: Callable, counter: Counter) -> Callable:
    def patched(*args, **kwargs):
        counter.calls += 1
        return original(*args, **kwargs)

    return patched


def _passthrough(original: Callable) -> Callable:
    def patched(*args, **kwargs):
        return original(*args, **kwargs)

    return patched


def _method_wrap(original: Callable, impl: Callable, counter: Counter, ctx: Any, count: bool) -> Callable:
    """A method, classmethod or property getter: args[0] of the raw call is the instance (or the class).

    `wrapped` is the original bound to it: a new bound method per call (wrapt's contract; caching one would keep
    the last instance alive). For a plain function it is made by the function's own `__get__`, taken once here:
    an identical bound method to `MethodType(original, instance)`'s, 5-7 ns cheaper per call than calling the
    type (benchmarks/README.md); a None instance raises TypeError with either.
    """
    if type(original) is types.FunctionType:
        get = original.__get__
    else:  # another callable (a C function, a partial, a callable object): bind it as a method the generic way
        get = functools.partial(types.MethodType, original)
    if ctx is not None and count:
        def patched(instance, /, *args, **kwargs):
            counter.calls += 1
            return impl(get(instance), instance, args, kwargs, ctx)
    elif ctx is not None:
        def patched(instance, /, *args, **kwargs):
            return impl(get(instance), instance, args, kwargs, ctx)
    elif count:
        def patched(instance, /, *args, **kwargs):
            counter.calls += 1
            return impl(get(instance), instance, args, kwargs)
    else:
        def patched(instance, /, *args, **kwargs):
            return impl(get(instance), instance, args, kwargs)
    return patched


def _function_wrap(original: Callable, impl: Callable, counter: Counter, ctx: Any, count: bool) -> Callable:
    """A module function or staticmethod: no instance."""
    if ctx is not None and count:
        def patched(*args, **kwargs):
            counter.calls += 1
            return impl(original, None, args, kwargs, ctx)
    elif ctx is not None:
        def patched(*args, **kwargs):
            return impl(original, None, args, kwargs, ctx)
    elif count:
        def patched(*args, **kwargs):
            counter.calls += 1
            return impl(original, None, args, kwargs)
    else:
        def patched(*args, **kwargs):
            return impl(original, None, args, kwargs)
    return patched


def build_callable(patch: Patch, original: Callable, impl: Optional[Callable], counter: Counter, count: bool,
                   ctx: Any = None, bound: bool = False) -> Callable:
    """The function that will stand at the target.

    `bound`: vLLM passes the instance (or class) first (a method, classmethod, property getter, or an
    `instances: true` method); `ctx`: the patch's PatchContext, given to an implementation taking 5 parameters.
    """
    if patch.kind is Kind.replace:
        # a private layer even uncounted: the mark must never land on the implementation object itself
        fn = _counted_passthrough(impl, counter) if count else _passthrough(impl)
    elif impl is None:
        fn = _counted_passthrough(original, counter) if count else _passthrough(original)
    else:
        from vllm_patchkit.upstream.convention import wrap_takes_context

        shape = wrap_takes_context(impl)
        if shape is None:
            raise TypeError(f"implementation {patch.implementation} cannot be called as "
                            "impl(wrapped, instance, args, kwargs[, ctx])")
        if shape and ctx is None:
            from vllm_patchkit.runtime.context import PatchContext

            ctx = PatchContext.detached(patch)
        fn = (_method_wrap if bound else _function_wrap)(original, impl, counter, ctx if shape else None, count)
    functools.update_wrapper(fn, original)
    fn.__wrapped__ = original
    setattr(fn, MARK, patch.key)
    return fn


def rewrap_descriptor(raw: Any, fn: Callable) -> Any:
    """Keep staticmethod/classmethod-ness of a class attribute; a property stays a property (its getter wrapped)."""
    if isinstance(raw, property):
        return property(fn, raw.fset, raw.fdel, raw.__doc__)
    if isinstance(raw, staticmethod):
        return staticmethod(fn)
    if isinstance(raw, classmethod):
        return classmethod(fn)
    return fn


#: (id of the owner, attribute) -> the key of the `set` patch that wrote it in this process. A value carries no
#: mark, and vLLM may define the very value a patch sets (0.32.0's Step3p5ToolParser.structural_tag_model):
#: only this tells "set by an earlier loader here" from "upstream defines it now".
SET_BY: dict[tuple[int, str], str] = {}


def ours(raw: Any) -> Optional[str]:
    return getattr(function_of(raw), MARK, None)


@dataclass
class Applied:
    """What was changed, so unpatch() can put back the exact original objects."""

    patch: Patch
    places: list[tuple[Place, Any]] = field(default_factory=list)  # (place, original raw)
    env: Optional[tuple[str, Optional[str]]] = None  # (name, previous value)
    counter: Counter = field(default_factory=Counter)

    late_copies: list[str] = field(default_factory=list)  # declared copies not imported at install time
    instances: Any = None  # `instances: true`: the objects patched at construction (weakly held)
    installed: Any = None  # the function we installed
    original: Any = None
    ctx: Any = None  # the PatchContext its implementation is handed (a wrap with an implementation)
    restore: Optional[Callable[[], None]] = None  # run last by undo (an instances `set`: the objects made meanwhile)

    def undo(self) -> None:
        for place, original in reversed(self.places):
            place.set_raw(original)
            if SET_BY.get((id(place.owner), place.attr)) == self.patch.key:
                del SET_BY[(id(place.owner), place.attr)]
        method = self.patch.target.rpartition(".")[2] if self.patch.instances else None
        for obj in list(self.instances or ()) if self.patch.kind is not Kind.set else ():
            # objects made while patched: back to the class's method
            bound = obj.__dict__.get(method)
            if getattr(getattr(bound, "__func__", None), MARK, None) == self.patch.key:
                del obj.__dict__[method]
        from vllm_patchkit.upstream.targets import TargetError, resolve

        for spec in self.late_copies:  # imported after install: they took our wrapper by value
            try:
                place = resolve(spec, import_module=False)
            except TargetError:
                continue
            if place.get_raw() is self.installed:
                place.set_raw(self.original)
        if self.restore is not None:
            self.restore()
        if self.env is not None:
            name, previous = self.env
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


def init_place(place: Place) -> Place:
    """The `__init__` of the class owning `place` (in its own __dict__, MISSING when inherited)."""
    module = place.spec.partition(":")[0]
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


def install(patch: Patch, place: Place, copies: list[Place], impl: Any, count: bool, ctx: Any = None) -> Applied:
    """Install at the target and at every declared copy that holds the original.

    `ctx`: the PatchContext the loader made for this patch (a wrap with an implementation); a detached
    one when installed without a loader, so its counters are kept on it.
    """
    if ctx is None and patch.kind is Kind.wrap and impl is not None:
        from vllm_patchkit.runtime.context import PatchContext

        ctx = PatchContext.detached(patch)
    if patch.instances and patch.kind is Kind.set:
        return install_value_on_instances(patch, place, impl if patch.value_from is not None else patch.value, count)
    if patch.instances:
        return install_on_instances(patch, place, impl, count, ctx)
    applied = Applied(patch, ctx=ctx)
    raw = place.get_raw()
    if patch.kind is Kind.set:
        place.set_raw(impl if patch.value_from is not None else patch.value)
        applied.places.append((place, raw))
        SET_BY[(id(place.owner), place.attr)] = patch.key
        return applied
    original = function_of(raw)
    bound = place.owner_is_class and not isinstance(raw, staticmethod)
    if ctx is not None:
        ctx.bind_target(original, bound)
    fn = build_callable(patch, original, impl, applied.counter, count, ctx, bound)
    new_raw = rewrap_descriptor(raw, fn)
    place.set_raw(new_raw)
    applied.places.append((place, raw))
    applied.installed, applied.original = fn, original
    done = set()
    for copy in copies:
        held = copy.get_raw()
        done.add(copy.spec)
        if held is not MISSING and function_of(held) is original:
            copy.set_raw(fn)
            applied.places.append((copy, held))
    applied.late_copies = [c for c in patch.copies if c not in done]
    if not place.owner_is_class:  # a declared place in the module run as the program (`python -m ...`)
        for spec in main_aliases([patch.target, *patch.copies]):
            try:
                alias = resolve(spec, import_module=False)
            except TargetError:
                continue
            held = alias.get_raw()
            if held is not MISSING and function_of(held) is original:
                alias.set_raw(fn)
                applied.places.append((alias, held))
    return applied


def set_env_default(patch: Patch, applied: Applied) -> str:
    """Set the default when unset; an explicit value is always kept."""
    name, value = patch.env_default.name, patch.env_default.value
    current = os.environ.get(name)
    if current is None:
        os.environ[name] = value
        applied.env = (name, None)
        log.info("vllm-patchkit: %s set %s=%s (was unset)", patch.key, name, value)
        return f"set {name}={value} (was unset)"
    return f"kept explicit {name}={current}"

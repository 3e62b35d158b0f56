"""The closures a `wrap` or `replace` installs.

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

import functools
import logging
import types
from typing import Any, Callable, Optional

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.upstream.convention import wrap_takes_context
from vllm_patchkit.upstream.targets import function_of

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
    if traits(patch).call_shape == "replace":
        # a private layer even uncounted: the mark must never land on the implementation object itself
        fn = _counted_passthrough(impl, counter) if count else _passthrough(impl)
    elif impl is None:
        fn = _counted_passthrough(original, counter) if count else _passthrough(original)
    else:
        shape = wrap_takes_context(impl)
        if shape is None:
            raise TypeError(f"implementation {patch.implementation} cannot be called as "
                            "impl(wrapped, instance, args, kwargs[, ctx])")
        if shape and ctx is None:
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
def ours(raw: Any) -> Optional[str]:
    return getattr(function_of(raw), MARK, None)

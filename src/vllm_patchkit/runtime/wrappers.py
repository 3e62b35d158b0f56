"""The closures a `wrap` or `replace` installs.

Wrappers are plain closures, not proxies: they cost a counter increment and
one call (their `try` costs nothing until something raises: raised.py), they hand vLLM's arguments on untouched, and they carry
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
from vllm_patchkit.runtime.raised import codes_of, note, through
from vllm_patchkit.upstream.convention import wrap_takes_context
from vllm_patchkit.upstream.targets import function_of

log = logging.getLogger("vllm.patchkit")

MARK = "__vllm_patchkit__"


class Counter:
    """Per-patch counts; slot attributes so the hot path is one add. `raised`/`passed`/`kinds` are touched only
    when the installed function raises (raised.py)."""

    __slots__ = ("calls", "raised", "passed", "kinds")

    def __init__(self) -> None:
        self.calls = 0
        self.raised = 0  # exceptions the patch's own code raised
        self.passed = 0  # exceptions vLLM's original raised, passed through the wrapper
        self.kinds: dict = {}  # (type, first line, place, passed) -> what raised.note keeps of it


def _counted_passthrough(original: Callable, counter: Counter, codes: Optional[tuple], own: Optional[tuple]):
    def patched(*args, **kwargs):
        counter.calls += 1
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            note(counter, exc, codes, own)
            raise

    return patched


def _passthrough(original: Callable, counter: Counter, codes: Optional[tuple], own: Optional[tuple]) -> Callable:
    def patched(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            note(counter, exc, codes, own)
            raise

    return patched


def _method_wrap(original: Callable, impl: Callable, counter: Counter, ctx: Any, count: bool) -> Callable:
    """A method, classmethod or property getter: args[0] of the raw call is the instance (or the class).

    `wrapped` is the original bound to it: a new bound method per call (wrapt's contract; caching one would keep
    the last instance alive). For a plain function it is made by the function's own `__get__`, taken once here:
    an identical bound method to `MethodType(original, instance)`'s, 5-7 ns cheaper per call than calling the
    type (benchmarks/README.md); a None instance raises TypeError with either. An exception is counted by
    `raised.note`, on the exception path only: the patch's own, or the original's passing through.
    """
    original, codes = through(original)
    own = codes_of(impl)
    if type(original) is types.FunctionType:
        get = original.__get__
    else:  # another callable (a C function, a partial, a callable object): bind it as a method the generic way
        get = functools.partial(types.MethodType, original)
    if ctx is not None and count:
        def patched(instance, /, *args, **kwargs):
            counter.calls += 1
            try:
                return impl(get(instance), instance, args, kwargs, ctx)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    elif ctx is not None:
        def patched(instance, /, *args, **kwargs):
            try:
                return impl(get(instance), instance, args, kwargs, ctx)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    elif count:
        def patched(instance, /, *args, **kwargs):
            counter.calls += 1
            try:
                return impl(get(instance), instance, args, kwargs)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    else:
        def patched(instance, /, *args, **kwargs):
            try:
                return impl(get(instance), instance, args, kwargs)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    return patched


def _function_wrap(original: Callable, impl: Callable, counter: Counter, ctx: Any, count: bool) -> Callable:
    """A module function or staticmethod: no instance."""
    original, codes = through(original)
    own = codes_of(impl)
    if ctx is not None and count:
        def patched(*args, **kwargs):
            counter.calls += 1
            try:
                return impl(original, None, args, kwargs, ctx)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    elif ctx is not None:
        def patched(*args, **kwargs):
            try:
                return impl(original, None, args, kwargs, ctx)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    elif count:
        def patched(*args, **kwargs):
            counter.calls += 1
            try:
                return impl(original, None, args, kwargs)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    else:
        def patched(*args, **kwargs):
            try:
                return impl(original, None, args, kwargs)
            except Exception as exc:
                note(counter, exc, codes, own)
                raise
    return patched


def build_callable(patch: Patch, original: Callable, impl: Optional[Callable], counter: Counter, count: bool,
                   ctx: Any = None, bound: bool = False) -> Callable:
    """The function that will stand at the target.

    `bound`: vLLM passes the instance (or class) first (a method, classmethod, property getter, or an
    `instances: true` method); `ctx`: the patch's PatchContext, given to an implementation taking 5 parameters.
    """
    if traits(patch).stands_in:
        # a private layer even uncounted: the mark must never land on the implementation object itself
        # what it raises is its own: nothing of vLLM's is called through it
        fn = (_counted_passthrough if count else _passthrough)(impl, counter, (), codes_of(impl))
    elif impl is None:  # vLLM's own function behind a counted layer: whatever it raises passes through
        fn = (_counted_passthrough if count else _passthrough)(original, counter, None, None)
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

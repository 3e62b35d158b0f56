"""The per-call shape of a `wrap` with an implementation, installed by `apply.install` on plain targets.

`impl(wrapped, instance, args, kwargs[, ctx])`: for a method (also a classmethod, a property getter, a
call through the class) `wrapped` is a bound method of the original with `__self__` the instance (the class)
and `instance` is that object; for a module function or staticmethod `wrapped` is the original itself and
`instance` None. A method whose original is not a plain function is bound the generic way. The call is counted
before the implementation runs; `count_calls: false` counts nothing; the context is the same object every call.
(Regression for the closure builders' per-call work, issue 15.)
"""

from __future__ import annotations

import functools
import importlib
import types

import pytest

from vllm_patchkit.runtime import apply
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream.targets import resolve
from vllm_patchkit.declaration.validation import validate

from .helpers import patch_doc

TARGETS = """
    import functools

    def fn(x, y=None):
        return ("fn", x, y)

    def _plain(first, self, x):
        return ("partial", first, self, x)

    class Cls:
        def step(self, x, y=None):
            return ("step", self, x, y)

        @classmethod
        def make(cls, x):
            return ("make", cls, x)

        @staticmethod
        def helper(x):
            return ("helper", x)

        @property
        def size(self):
            return ("size", self)

        partial_step = functools.partial(_plain, "bound-first")
"""

IMPLS = """
    SEEN = []
    COUNTER = None

    def five(wrapped, instance, args, kwargs, ctx):
        SEEN.append((wrapped, instance, args, kwargs, ctx, COUNTER.calls if COUNTER else None))
        return wrapped(*args, **kwargs)

    def four(wrapped, instance, args, kwargs):
        SEEN.append((wrapped, instance, args, kwargs, None, COUNTER.calls if COUNTER else None))
        return wrapped(*args, **kwargs)
"""


@pytest.fixture
def env(impl_module):
    targets = importlib.import_module(impl_module(TARGETS))
    impls = importlib.import_module(impl_module(IMPLS))
    made = []

    def install(attr: str, fn: str = "five", count: bool = True) -> apply.Applied:
        spec = f"{targets.__name__}:{attr}"
        patch = validate(Patch, patch_doc(id="shape", kind="wrap", target=spec, processes=["frontend"],
                                               implementation=f"{impls.__name__}:{fn}", count_calls=count))
        a = apply.install(patch, resolve(spec), [], getattr(impls, fn), count)
        made.append(a)
        impls.COUNTER = a.counter
        return a

    yield targets, impls, install
    for a in reversed(made):
        a.undo()


def test_method_wrapped_is_the_original_bound_to_the_instance(env):
    targets, impls, install = env
    original = targets.Cls.__dict__["step"]
    a = install("Cls.step")
    o = targets.Cls()
    assert o.step(1, y=2) == ("step", o, 1, 2)
    assert targets.Cls.step(o, 3) == ("step", o, 3, None)  # through the class: the instance is still split off
    (w1, i1, args1, kw1, ctx1, n1), (w2, i2, args2, kw2, ctx2, n2) = impls.SEEN
    assert type(w1) is types.MethodType and w1.__self__ is o and w1.__func__ is original
    assert i1 is o and (args1, kw1) == ((1,), {"y": 2})
    assert w2.__self__ is o and i2 is o and (args2, kw2) == ((3,), {})
    assert w1 is not w2  # a fresh bound method per call: nothing keeps the instance alive between calls
    assert isinstance(ctx1, PatchContext) and ctx1 is ctx2 is a.ctx  # one context, made at install
    assert (n1, n2) == (1, 2) and a.counter.calls == 2  # counted before the implementation runs


def test_classmethod_property_and_staticmethod_shapes(env):
    targets, impls, install = env
    make, size, helper = (targets.Cls.__dict__[n] for n in ("make", "size", "helper"))
    install("Cls.make", fn="four")
    install("Cls.size")
    install("Cls.helper")
    assert isinstance(targets.Cls.__dict__["make"], classmethod)
    assert isinstance(targets.Cls.__dict__["size"], property)
    assert isinstance(targets.Cls.__dict__["helper"], staticmethod)

    class Sub(targets.Cls):
        pass

    o = Sub()
    assert Sub.make(1) == ("make", Sub, 1) and o.make(2) == ("make", Sub, 2)
    assert o.size == ("size", o)
    assert o.helper(5) == ("helper", 5) and targets.Cls.helper(6) == ("helper", 6)
    (w_make, i_make, *_), (w_make2, i_make2, *_), (w_size, i_size, *_), (w_h, i_h, *_), (w_h2, i_h2, *_) = impls.SEEN
    assert i_make is Sub and w_make.__self__ is Sub and w_make.__func__ is make.__func__
    assert i_make2 is Sub and w_make2.__self__ is Sub
    assert i_size is o and w_size.__self__ is o and w_size.__func__ is size.fget
    assert i_h is None and i_h2 is None and w_h is helper.__func__ and w_h2 is helper.__func__


def test_module_function_gets_the_original_unbound(env):
    targets, impls, install = env
    original = targets.fn
    install("fn")
    assert targets.fn(1, y=2) == ("fn", 1, 2)
    [(w, i, args, kwargs, ctx, n)] = impls.SEEN
    assert w is original and i is None and (args, kwargs) == ((1,), {"y": 2}) and n == 1


def test_a_method_whose_original_is_not_a_plain_function_is_bound_generically(env):
    targets, impls, install = env
    original = targets.Cls.__dict__["partial_step"]
    assert isinstance(original, functools.partial)
    install("Cls.partial_step")
    o = targets.Cls()
    assert o.partial_step(7) == ("partial", "bound-first", o, 7)  # as MethodType(partial, o): o passed after
    [(w, i, *_)] = impls.SEEN
    assert type(w) is types.MethodType and w.__self__ is o and w.__func__ is original and i is o


def test_count_calls_false_counts_nothing(env):
    targets, impls, install = env
    a = install("Cls.step", count=False)
    o = targets.Cls()
    for _ in range(3):
        o.step(1)
    assert a.counter.calls == 0 and len(impls.SEEN) == 3 and {s[1] for s in impls.SEEN} == {o}


def test_a_method_called_with_none_as_self_still_raises(env):
    targets, impls, install = env
    install("Cls.step")
    with pytest.raises(TypeError):  # no bound method of None: `wrapped` would silently drop the first argument
        targets.Cls.step(None, 1)
    assert impls.SEEN == []

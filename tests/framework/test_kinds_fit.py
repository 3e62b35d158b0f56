"""A `wrap`/`replace` fits only a function or method: other kinds of target are refused in verify.

Real vLLM targets where it has them (`Executor` carries a property, a cached_property,
a classmethod, a staticmethod and plain class attributes; `Executor` itself is a class);
a synthetic module for the rest (a callable object on a class).

staticmethod and classmethod are supported: apply.py re-wraps them as what they were.
The classmethod and staticmethod tests below pin that behaviour (it was already right);
the kind refusals and the convention check on a classmethod are new.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from .helpers import make_loader, patch_doc, pinned_entry

EX = "vllm.v1.executor.abstract"

pytestmark = pytest.mark.usefixtures("undo_every_loader")




@pytest.fixture
def executor():
    import vllm.v1.executor.abstract as ex

    saved = dict(ex.Executor.__dict__)
    yield ex
    for name in ("is_sleeping", "supported_tasks", "supports_async_scheduling", "get_class", "uses_ray"):
        if ex.Executor.__dict__.get(name) is not saved[name]:
            setattr(ex.Executor, name, saved[name])
    assert ex.__dict__["Executor"] is ex.Executor




def concrete(base):
    """An instantiable subclass (Executor is abstract), without running any __init__."""

    class Concrete(base):
        def _init_executor(self):
            pass

        def check_health(self):
            pass

        def collective_rpc(self, *args, **kwargs):
            pass

    return Concrete


def run(tmp_path, spec, kind="wrap", implementation=None, pin=True, count=True):
    doc = patch_doc(id="p", kind=kind, target=spec, processes=["frontend"], count_calls=count)
    if implementation:
        doc["implementation"] = implementation
    entry = pinned_entry("p@1", spec) if pin else {"patch": "p@1", "targets": {spec: {"kind": "attribute"}}}
    loader = make_loader(tmp_path, {"p": doc}, [entry])
    loader.run_import_stage()
    return loader, loader.records["p"]


# -- refused kinds ---------------------------------------------------------------------------------
def test_wrap_on_a_property_wraps_its_getter_and_it_still_reads_as_a_value(tmp_path, executor):
    """Issue 12: a real plugin patches properties. `wrap` wraps the getter, counted; the class keeps a
    property (a value on read, not a bound function); unpatch puts back the very same property object."""
    spec = f"{EX}:Executor.is_sleeping"
    before = executor.Executor.__dict__["is_sleeping"]
    loader, rec = run(tmp_path, spec)
    assert rec.state == "applied", rec
    now = executor.Executor.__dict__["is_sleeping"]
    assert isinstance(now, property) and now is not before and now.fget.__wrapped__ is before.fget
    inst = object.__new__(concrete(executor.Executor))
    inst.sleeping_tags = {"weights"}
    assert inst.is_sleeping is True  # still a value, through the wrapper
    inst.sleeping_tags = set()
    assert inst.is_sleeping is False
    loader.sync_calls()
    assert rec.calls == 2
    again = make_loader(tmp_path / "again", {"p": patch_doc(id="p", kind="wrap", target=spec, processes=["frontend"])},
                        [pinned_entry("p@1", spec)])
    again.run_import_stage()  # applying the same patch twice does not stack a second layer
    assert executor.Executor.__dict__["is_sleeping"] is now
    loader.unpatch()
    assert executor.Executor.__dict__["is_sleeping"] is before
    # the remedy the refusal names works: kind set puts a value in the property's place
    doc = patch_doc(id="s", kind="set", target=spec, value=False, processes=["frontend"])
    setter = make_loader(tmp_path / "set", {"s": doc}, [pinned_entry("s@1", spec)])
    setter.run_import_stage()
    assert setter.records["s"].state == "applied", setter.records["s"]
    assert executor.Executor.__dict__["is_sleeping"] is False and inst.is_sleeping is False
    setter.unpatch()
    assert executor.Executor.__dict__["is_sleeping"] is before


def test_replace_on_a_property_is_refused(tmp_path, executor, impl_module):
    mod = impl_module("def is_sleeping(self):\n    return True\n")
    spec = f"{EX}:Executor.is_sleeping"
    _, rec = run(tmp_path, spec, kind="replace", implementation=f"{mod}:is_sleeping")
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason.startswith(f"{spec} is a property; `replace` supports functions and methods only")
    assert "`wrap` wraps a property's getter and keeps it a property" in rec.reason


def test_wrap_on_a_cached_property_is_refused(tmp_path, executor):
    spec = f"{EX}:Executor.supported_tasks"
    _, rec = run(tmp_path, spec)
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason == (f"{spec} is a functools.cached_property descriptor, not a function; `wrap` supports "
                          "functions and methods only (declare kind: set, or wrap the function it holds)")
    assert rec.found == "functools.cached_property"


def test_wrap_on_a_class_is_refused_and_isinstance_still_works(tmp_path, executor):
    spec = f"{EX}:Executor"
    cls = executor.Executor
    _, rec = run(tmp_path, spec)
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason == (f"{spec} is a class; `wrap` supports functions and methods only (a function in its place "
                          "breaks isinstance, subclassing and its class attributes; wrap its __init__ or a method "
                          "instead)")
    assert executor.Executor is cls and isinstance(object.__new__(concrete(cls)), executor.Executor)


def test_wrap_on_a_non_callable_attribute_is_refused(tmp_path, executor):
    spec = f"{EX}:Executor.uses_ray"
    _, rec = run(tmp_path, spec)
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason == (f"{spec} is a non-callable bool value; `wrap` supports functions and methods only "
                          "(declare kind: set to change its value)")
    assert executor.Executor.__dict__["uses_ray"] is False


def test_wrap_on_a_module_constant_is_refused(tmp_path):
    import vllm.v1.engine.core as core

    spec = "vllm.v1.engine.core:HANDSHAKE_TIMEOUT_MINS"
    _, rec = run(tmp_path, spec)
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason.startswith(f"{spec} is a non-callable int value; `wrap` supports functions and methods only")
    assert core.HANDSHAKE_TIMEOUT_MINS == 5


def test_wrap_on_a_callable_object_held_by_a_class_is_refused(tmp_path, monkeypatch):
    """A functools.partial on a class is not bound (no self); a function in its place would be."""
    (tmp_path / "kinds_toy.py").write_text(textwrap.dedent("""
        import functools

        def scale(x, factor):
            return x * factor

        class Toy:
            double = functools.partial(scale, factor=2)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kinds_toy", raising=False)
    import kinds_toy

    spec = "kinds_toy:Toy.double"
    _, rec = run(tmp_path, spec)
    assert (rec.state, rec.code) == ("failed", "kind")
    assert rec.reason == (f"{spec} is a callable functools.partial object on a class; `wrap` supports functions and "
                          "methods only (a function in its place would be bound as a method and receive self; patch "
                          "the function it calls)")
    assert kinds_toy.Toy().double(3) == 6  # untouched
    sys.modules.pop("kinds_toy", None)


# -- supported: classmethod and staticmethod -------------------------------------------------------
def test_wrapped_classmethod_still_receives_cls_and_is_counted(tmp_path, executor, impl_module):
    mod = impl_module("""
        SEEN = []

        def supports_async_scheduling(wrapped, instance, args, kwargs):
            SEEN.append((instance, wrapped.__self__, args, kwargs))  # the class, and the original bound to it
            return ("wrapped", wrapped(*args, **kwargs))
    """)
    spec = f"{EX}:Executor.supports_async_scheduling"
    loader, rec = run(tmp_path, spec, implementation=f"{mod}:supports_async_scheduling")
    try:
        assert rec.state == "applied", rec
        raw = executor.Executor.__dict__["supports_async_scheduling"]
        assert isinstance(raw, classmethod)  # still a classmethod

        Sub = concrete(executor.Executor)
        assert executor.Executor.supports_async_scheduling() == ("wrapped", False)
        assert Sub.supports_async_scheduling() == ("wrapped", False)
        assert object.__new__(Sub).supports_async_scheduling() == ("wrapped", False)  # through an instance
        assert sys.modules[mod].SEEN == [(executor.Executor, executor.Executor, (), {}), (Sub, Sub, (), {}),
                                         (Sub, Sub, (), {})]
        loader.sync_calls()
        assert rec.calls == 3
    finally:
        loader.unpatch()
    assert not hasattr(executor.Executor.__dict__["supports_async_scheduling"].__func__, "__vllm_patchkit__")


def test_wrapped_staticmethod_gets_no_self_and_is_counted(tmp_path, executor, impl_module):
    mod = impl_module("""
        def get_class(wrapped, instance, args, kwargs):
            assert instance is None  # a staticmethod: no instance, the original unbound
            return ("chosen for", *args, *kwargs.values())
    """)
    spec = f"{EX}:Executor.get_class"
    loader, rec = run(tmp_path, spec, implementation=f"{mod}:get_class")
    try:
        assert rec.state == "applied", rec
        assert isinstance(executor.Executor.__dict__["get_class"], staticmethod)
        cfg = object()
        assert executor.Executor.get_class(cfg) == ("chosen for", cfg)
        assert object.__new__(concrete(executor.Executor)).get_class(cfg) == ("chosen for", cfg)  # no self inserted
        loader.sync_calls()
        assert rec.calls == 2
    finally:
        loader.unpatch()


def test_passthrough_on_a_classmethod_forwards_cls(tmp_path, executor):
    spec = f"{EX}:Executor.supports_async_scheduling"
    loader, rec = run(tmp_path, spec)
    try:
        assert rec.state == "applied", rec

        class Sub(executor.Executor):
            pass

        assert Sub.supports_async_scheduling() is False
        loader.sync_calls()
        assert rec.calls == 1
    finally:
        loader.unpatch()


def test_convention_on_a_classmethod_judges_the_wrap_shape(tmp_path, executor, impl_module):
    """A wrap of a classmethod gets the class as `instance` (never among args): the old
    `(original, cls)` form is refused by its shape; the 4-parameter form applies."""
    mod = impl_module("""
        def old_form(original, cls):
            return original(cls)

        def four(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)
    """)
    spec = f"{EX}:Executor.supports_async_scheduling"
    _, rec = run(tmp_path / "a", spec, implementation=f"{mod}:old_form")
    assert (rec.state, rec.code) == ("failed", "convention")
    assert rec.reason.startswith(f"implementation {mod}:old_form cannot be called as impl(wrapped, instance, args, "
                                 "kwargs)")
    loader, rec = run(tmp_path / "b", spec, implementation=f"{mod}:four")
    try:
        assert rec.state == "applied", rec
        assert executor.Executor.supports_async_scheduling() is False
    finally:
        loader.unpatch()

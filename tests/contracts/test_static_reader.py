"""The static reader on a synthetic package, checked against the same package imported live.

Every form the reader claims to handle is written once; each spec is then read
statically (from the folder, and from a zip of it) and live (by import), and the
fingerprints must be equal — the property the whole contract check relies on.
Among the forms: those griffe models differently from the interpreter (see "Why not griffe" in
`static.py`): `parse` bound in a try/except, `public = _impl`, a class's `run = step`.
"""

from __future__ import annotations

import sys
import zipfile

import pytest
import msgspec


from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.targets import resolve

from .helpers import write_tree

PKG = "pkstatic"
FILES = {
    f"{PKG}/deco.py": '''
        import functools

        def traced(fn):
            @functools.wraps(fn)
            def inner(*args, **kwargs):
                return fn(*args, **kwargs)
            return inner

        def traced_with(label):
            def deco(fn):
                @functools.wraps(fn)
                def inner(*args, **kwargs):
                    return fn(*args, **kwargs)
                return inner
            return deco

        def register(fn):
            fn.registered = True
            return fn

        def replacing(fn):
            def run_instead(self, *args):
                return fn(self, *args)
            return run_instead
        ''',
    f"{PKG}/core/utils.py": '''
        from functools import lru_cache
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from {pkg}.nowhere import Ghost

        LIMIT = 16
        NAMES: dict = {"a": 1}

        def get_configs(vllm_config, specs, available_memory, *, strict=False, **kw):
            """Docstring."""
            text = """
                a multi-line string inside the def
            """
            return text

        async def fetch(a, /, b, *rest, c=None):
            pass

        @lru_cache(maxsize=None)
        def cached(x):
            return x

        square = lambda x, y=2: x ** y

        try:
            from json import loads as parse
        except ImportError:
            def parse(s):
                return s

        def _impl(a, b=None):
            pass

        public = _impl
        '''.replace("{pkg}", PKG),
    f"{PKG}/core/__init__.py": '''
        from .utils import fetch as fetch_again
        ''',
    f"{PKG}/core/engine.py": '''
        from .utils import get_configs
        from {pkg}.core.utils import _impl as impl_alias
        from {pkg}.core import utils as u
        from {pkg}.core.utils import *
        '''.replace("{pkg}", PKG),
    f"{PKG}/runner.py": '''
        import dataclasses
        import functools
        from abc import ABC, abstractmethod

        from {pkg}.deco import register, replacing, traced, traced_with

        class Base(ABC):
            kind = "base"

            @abstractmethod
            def step(self, batch):
                ...

            def inherited(self, x):
                pass

        @dataclasses.dataclass
        class Config:
            size: int = 1
            name: str = "x"

            def __post_init__(self):
                """Validate.

                    (an indented line in a docstring)
                """
                self.size = max(self.size, 1)

        class Runner(Base):
            MAX = 8
            label: str = "r"

            def __init__(self, cfg, device=None):
                self.cfg = cfg
                """A bare string in a method body: dedenting the method's source would change it."""
                self.doc = """
                    indented text
                """

            def step(self, batch, *, force_uniform_decode=None):
                return batch

            @staticmethod
            def is_uniform(n, q=1):
                return n == q

            @classmethod
            def build(cls, cfg):
                return cls(cfg)

            @property
            def size(self):
                return 1

            @functools.cached_property
            def heavy(self):
                return 2

            @traced
            def traced_step(self, x):
                return x

            @traced_with("span")
            @traced
            def twice(self, x, y=0):
                return x

            @register
            def registered(self, x):
                return x

            @replacing
            def replaced(self, a, b):
                return a

            @functools.lru_cache
            def memo(self, key):
                return key

            run = step

            class Inner:
                def deep(self, z=(1, 2)):
                    pass
        '''.replace("{pkg}", PKG),
}

SPECS = [
    f"{PKG}.core.utils:LIMIT", f"{PKG}.core.utils:NAMES", f"{PKG}.core.utils:get_configs", f"{PKG}.core.utils:fetch",
    f"{PKG}.core.utils:cached", f"{PKG}.core.utils:square", f"{PKG}.core.utils:public", f"{PKG}.core.utils:_impl",
    f"{PKG}.core.engine:get_configs", f"{PKG}.core.engine:impl_alias", f"{PKG}.core.engine:fetch",
    f"{PKG}.core:fetch_again",  # a relative import in a package's __init__
    f"{PKG}.runner:Base", f"{PKG}.runner:Base.step", f"{PKG}.runner:Base.kind", f"{PKG}.runner:Config",
    f"{PKG}.runner:Config.__post_init__", f"{PKG}.runner:Runner.__init__", f"{PKG}.runner:Runner.step",
    f"{PKG}.runner:Runner.is_uniform", f"{PKG}.runner:Runner.build", f"{PKG}.runner:Runner.size",
    f"{PKG}.runner:Runner.heavy", f"{PKG}.runner:Runner.traced_step", f"{PKG}.runner:Runner.twice",
    f"{PKG}.runner:Runner.registered", f"{PKG}.runner:Runner.replaced", f"{PKG}.runner:Runner.memo",
    f"{PKG}.runner:Runner.MAX", f"{PKG}.runner:Runner.label", f"{PKG}.runner:Runner.run",
    f"{PKG}.runner:Runner.Inner.deep",
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = write_tree(tmp_path_factory.mktemp("static"), FILES)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def wheel(tree, tmp_path_factory):
    path = tmp_path_factory.mktemp("whl") / f"{PKG}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f in tree.rglob("*.py"):
            z.write(f, f.relative_to(tree).as_posix())
    return path


def live_fingerprint(spec: str):
    place = resolve(spec)
    raw = place.get_raw()
    f = fp.live(raw, place.owner_is_class, with_digest=True, with_value=True)  # constants: value digests too
    found = layers.wrapper_layers(raw)
    return msgspec.structs.replace(f, wrappers=found) if found else f


@pytest.mark.parametrize("spec", SPECS)
def test_static_equals_live(spec, tree, wheel):
    want = live_fingerprint(spec)
    from_dir = StaticRelease.open(tree).lookup(spec, with_digest=True)
    from_zip = StaticRelease.open(wheel).lookup(spec, with_digest=True)
    assert from_dir == want
    assert from_zip == want


def test_a_few_fingerprints_spelled_out(tree):
    rel = StaticRelease.open(tree)
    get = lambda s: rel.lookup(f"{PKG}.{s}")  # noqa: E731
    assert get("core.utils:get_configs").signature == "(vllm_config, specs, available_memory, *, strict=False, **kw)"
    assert get("core.utils:fetch").signature == "(a, /, b, *rest, c=None)"
    assert get("runner:Runner.is_uniform").kind == "staticmethod"
    assert get("runner:Runner.build").kind == "classmethod"
    assert get("runner:Runner.size").kind == "attribute"
    assert get("runner:Runner.twice").wrappers == [f"{PKG}.runner.Runner.twice"] * 2
    assert get("runner:Runner.memo").wrappers == ["functools._lru_cache_wrapper"]
    assert get("runner:Runner.registered").wrappers == []
    assert get("runner:Runner.replaced").signature == "(self, *args)"  # what live sees: the nested function
    assert rel.resolve(f"{PKG}.core.engine:get_configs").where == f"{PKG}.core.utils:get_configs"
    assert rel.resolve(f"{PKG}.core.engine:impl_alias").where == f"{PKG}.core.utils:_impl"


def test_what_cannot_be_found(tree):
    rel = StaticRelease.open(tree)
    inherited = rel.lookup(f"{PKG}.runner:Runner.inherited")
    assert isinstance(inherited, Missing)
    assert inherited.reason == f"'inherited' is inherited from {PKG}.runner:Base, not defined on Runner"
    assert inherited.moved_to == (f"{PKG}.runner:Base.inherited",)
    ghost = rel.lookup(f"{PKG}.core.utils:Ghost")  # only imported under TYPE_CHECKING
    assert isinstance(ghost, Missing) and "has no attribute 'Ghost'" in ghost.reason
    outside = rel.lookup(f"{PKG}.core.utils:parse")  # the try branch wins: json.loads
    assert isinstance(outside, Missing) and outside.unreadable and "json:loads" in outside.reason
    assert isinstance(rel.lookup(f"{PKG}.core:utils"), Missing)  # a module is not an attribute
    assert isinstance(rel.lookup(f"{PKG}.runner:Runner.MAX.real"), Missing)


def test_inherited_is_read_alike_statically_and_live(tree):
    """An attribute the class has only through a base: both readers say inherited, from the same definition."""
    from vllm_patchkit.tools.releases import LiveRelease
    from vllm_patchkit.upstream.installed import installed_root

    if installed_root() is None:
        pytest.skip("vLLM is not installed")
    spec = f"{PKG}.runner:Runner.inherited"
    static, live = StaticRelease.open(tree).lookup(spec), LiveRelease().lookup(spec)
    assert isinstance(static, Missing) and isinstance(live, Missing)
    assert static.inherited_from == live.inherited_from == f"{PKG}.runner:Base.inherited"
    assert static.moved_to == live.moved_to == (f"{PKG}.runner:Base.inherited",)
    # a class on the way that is inherited is not "the attribute is inherited"
    nested = StaticRelease.open(tree).lookup(f"{PKG}.runner:Runner.kind.real")
    assert isinstance(nested, Missing) and nested.inherited_from is None


def test_modules_are_parsed_once(tree):
    rel = StaticRelease.open(tree)
    rel.lookup(f"{PKG}.runner:Runner.step")
    first = rel.module(f"{PKG}.runner")
    for spec in SPECS:
        rel.lookup(spec)
    assert rel.module(f"{PKG}.runner") is first

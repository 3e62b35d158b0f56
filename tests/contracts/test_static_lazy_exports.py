"""Lazy exports (PEP 562): a package's `__getattr__` serving names from a module-level table, read statically.

`from vllm import LLM, SamplingParams, ModelRegistry` works: vllm/__init__.py binds none of them, its
`__getattr__` reads `MODULE_ATTRS` ("LLM": ".entrypoints.llm:LLM", ...). The static reader (and so `reach`, `check`,
`scan`) called them missing. Checked on a synthetic package imported live (every form the reader claims), and on the
real installed 0.31.0 tree against `import vllm`.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules
from vllm_patchkit.tools.reach_plugin.uses import BROKEN, OK, read
from vllm_patchkit.tools.releases import installed_version, open_release
from vllm_patchkit.tools.scan.sources import open_plugin
from vllm_patchkit.tools.static import Definition, StaticRelease
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.targets import TargetError, resolve

from .helpers import write_tree

PKG = "pklazy"
FILES = {
    f"{PKG}/__init__.py": '''
        import importlib
        import typing

        _EXPORTS = {
            "Engine": ".engine.core:Engine",
            "start": ".engine.core:start",
            "Alias": "pklazy.engine.core:Engine",
            "Gone": ".engine.core:NoSuchThing",
            "Nowhere": ".no_such_module:Thing",
        }
        _BY_NAME = {"Helper": "pklazy.helpers"}
        _NOT_A_TABLE = {"Other": 3}

        if typing.TYPE_CHECKING:
            from pklazy.engine.core import Engine
        else:
            def __getattr__(name):
                if name in _EXPORTS:
                    module, attr = _EXPORTS[name].split(":")
                    return getattr(importlib.import_module(module, __package__), attr)
                if name in _BY_NAME:
                    return getattr(importlib.import_module(_BY_NAME[name]), name)
                if name in _NOT_A_TABLE:
                    return _NOT_A_TABLE[name]
                raise AttributeError(name)
        ''',
    f"{PKG}/engine/core.py": '''
        class Engine:
            def step(self, budget, *, eager=False):
                return budget

        def start(engine, steps=1):
            return engine
        ''',
    f"{PKG}/helpers.py": '''
        class Helper:
            def help(self):
                return None
        ''',
    f"{PKG}/computed/__init__.py": '''
        def __getattr__(name):
            if name == "Engine":
                from pklazy.engine.core import Engine
                return Engine
            raise AttributeError(name)
        ''',
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = write_tree(tmp_path_factory.mktemp("lazy"), {k: v for k, v in FILES.items()})
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
            del sys.modules[name]


def _live_where(obj) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


@pytest.mark.parametrize("spec", ["pklazy:Engine.step", "pklazy:Alias.step", "pklazy:Helper.help"])
def test_a_member_through_a_lazy_export_is_the_definition_python_reaches(tree, spec):
    release = StaticRelease.open(tree)
    d = release.resolve(spec)
    assert isinstance(d, Definition), d
    module, _, qual = spec.partition(":")
    head, _, member = qual.partition(".")
    live = getattr(getattr(importlib.import_module(module), head), member)
    assert d.where == _live_where(live)
    assert resolve(spec).owner is getattr(importlib.import_module(module), head)  # the loader reaches it too


@pytest.mark.parametrize("name", ["Engine", "start", "Alias", "Helper"])
def test_an_imported_lazy_export_is_found_where_python_finds_it(tree, name):
    release = StaticRelease.open(tree)
    got = release._lookup(PKG, name)
    assert not isinstance(got, Missing), got
    live = getattr(importlib.import_module(PKG), name)  # `from pklazy import <name>` works
    assert f"{got[1]}:{got[2]}" == _live_where(live)


def test_what_python_refuses_stays_missing_with_the_reason(tree):
    release = StaticRelease.open(tree)
    pkg = importlib.import_module(PKG)
    for name, said in (("Gone", "NoSuchThing"), ("Nowhere", "pklazy.no_such_module")):
        got = release._lookup(PKG, name)
        assert isinstance(got, Missing) and "lazily" in got.reason and said in got.reason, got
        with pytest.raises((AttributeError, ImportError)):
            getattr(pkg, name)
    assert isinstance(release._lookup(PKG, "Other"), Missing)  # a table of non-strings: not read as exports
    assert isinstance(release._lookup(f"{PKG}.computed", "Engine"), Missing)  # no table: not guessed (trap)


def test_a_lazy_export_itself_is_no_target_statically_nor_live(tree):
    """Nothing in the package holds it: a patch of `pklazy:Engine` would change nothing. Both readers say so."""
    release = StaticRelease.open(tree)
    got = release.resolve("pklazy:Engine")
    assert isinstance(got, Missing) and got.moved_to == ("pklazy.engine.core:Engine",), got
    with pytest.raises(TargetError):
        resolve("pklazy:Engine")


# -- the real vLLM 0.31.0 -----------------------------------------------------------------------------------------
real = pytest.mark.skipif(installed_version() != "0.31.0", reason="written against the installed vLLM 0.31.0")
NAMES = {"LLM": "vllm.entrypoints.llm:LLM", "SamplingParams": "vllm.sampling_params:SamplingParams",
         "ModelRegistry": "vllm.model_executor.models.registry:ModelRegistry"}


@real
def test_vllm_top_level_exports_on_the_installed_tree():
    release = open_release("0.31.0").release
    for name, where in NAMES.items():
        got = release._lookup("vllm", name)
        assert not isinstance(got, Missing), got
        assert f"{got[1]}:{got[2]}" == where
    d = release.resolve("vllm:SamplingParams.clone")
    import vllm
    import vllm.sampling_params

    assert vllm.SamplingParams is vllm.sampling_params.SamplingParams  # what `__getattr__` serves, live
    assert isinstance(d, Definition) and d.where == _live_where(vllm.SamplingParams.clone)
    assert resolve("vllm:SamplingParams.clone").owner is vllm.sampling_params.SamplingParams


@real
def test_reach_of_a_plugin_importing_from_vllm_top_level(tmp_path):
    """`from vllm import LLM, SamplingParams, ModelRegistry` was BROKEN ('vLLM has no LLM in vllm')."""
    write_tree(tmp_path, {"toplevel/__init__.py": '''
        from vllm import LLM, ModelRegistry, SamplingParams

        def run():
            ModelRegistry.register_model("MyArch", "toplevel.model:MyModel")
            return LLM(model="m").generate(["a"], SamplingParams(temperature=0.0))
        '''})
    plugin = PluginModules(open_plugin(str(tmp_path)))
    reach = read(plugin, open_release("0.31.0").release)
    imports = [u for u in reach.uses if u.kind == "import"]
    assert len(imports) == 3 and all(u.state == OK for u in imports), imports
    assert not [u for u in reach.uses if u.state == BROKEN], reach.uses
    calls = {u.key for u in reach.uses if u.kind == "call" and u.state == OK}
    assert {"vllm.entrypoints.llm:LLM", "vllm.sampling_params:SamplingParams"} <= calls, calls

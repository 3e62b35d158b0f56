"""Registrations the scan missed (issue 31: recall >= 90 % per plugin), each a construct of a real tuning plugin,
written here in our own words against the installed vLLM read statically:

- raif-vllm imports vLLM's parser classes inside a helper and binds them with `A, B = helper()` (so the module
  imports without vLLM), then registers its parsers with `@B.register_module("name")`: the names are the i-th of
  what the helper returns;
- vllm-canon registers a torch op with `direct_register_custom_op(...)`: a vLLM function named for registering
  (`register` a word of its name), not only `register_*`;
- a registration written as a decorator is one site, at the decorator's line (it was also counted as a call).
"""

from __future__ import annotations

from vllm_patchkit.tools.scan import scan

from .conftest import write_plugin

PLUGIN = '''
def _classes():
    from vllm.reasoning import ReasoningParser, ReasoningParserManager
    return ReasoningParser, ReasoningParserManager


try:
    _Parser, _Manager = _classes()
except ImportError:
    _Parser = None

if _Parser is not None:
    @_Manager.register_module("myplug")
    class MyParser(_Parser):
        pass


def register():
    from vllm.utils.torch_utils import direct_register_custom_op
    direct_register_custom_op("myplug_op", lambda x: x)
'''


def _line(text: str) -> int:
    return next(i for i, ln in enumerate(PLUGIN.splitlines(), 1) if text in ln)


def _sites(tmp_path, upstream):
    write_plugin(tmp_path / "src", {"myplug/__init__.py": PLUGIN})
    return [s for s in scan(str(tmp_path / "src"), upstream=upstream).sites if s.mechanism == "registry"]


def test_names_a_helper_returns_as_a_tuple_are_followed(tmp_path, upstream):
    sites = _sites(tmp_path, upstream)
    parser = [s for s in sites if "register_module" in (s.target or s.dotted or "")]
    assert len(parser) == 1, [(s.line, s.what) for s in sites]  # one registration, one site
    assert parser[0].line == _line("@_Manager.register_module")  # the decorator's line


def test_a_vllm_function_named_for_registering_is_a_registration(tmp_path, upstream):
    sites = _sites(tmp_path, upstream)
    assert [s.line for s in sites if "direct_register_custom_op" in (s.target or s.dotted or "")] == [
        _line('direct_register_custom_op("myplug_op"')]


def test_unregistering_is_no_registration():
    from vllm_patchkit.tools.scan.calls import _registers

    assert _registers("vllm.utils.torch_utils.direct_register_custom_op", "direct_register_custom_op")
    assert _registers("vllm.model_executor.model_loader.register_model_loader", "register_model_loader")
    assert not _registers("vllm.x.unregister_thing", "unregister_thing")
    assert not _registers("vllm.x.SomeClass.registered", "registered")

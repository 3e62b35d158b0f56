"""A TypedDict built by keyword: reach binds the call against the keys its class statement makes required, as Python
says of the live class (`__required_keys__` / `__optional_keys__`): a `NotRequired[...]` key, a `total=False`
class's own keys (unless `Required[...]`), an inherited key as its base declared it, a qualifier under `Annotated`.

Found on the registry run (issue 31, arctic-inference 0.3.0): `TokensPrompt(prompt_token_ids=...)` against vLLM
0.31.0's `vllm.inputs.llm:TokensPrompt`, whose other keys are all `NotRequired`, was called BROKEN ("missing a
required argument: 'multi_modal_data'"): reach read every key as required.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

from vllm_patchkit.tools.reach_plugin.signatures import callable_signature, misfit, to_signature
from vllm_patchkit.tools.reach_plugin.walk import CallShape
from vllm_patchkit.tools.releases import installed_version
from vllm_patchkit.tools.static import StaticRelease

from .helpers import write_tree

SOURCE = '''
    from typing import Annotated, NotRequired, Required, TypedDict


    class Options(TypedDict):
        data: NotRequired[dict]
        salt: NotRequired[str]


    class Tokens(Options):
        ids: list
        prompt: NotRequired[str]


    class Partial(TypedDict, total=False):
        a: int
        b: Required[str]
        c: Annotated[Required[int], "kept"]


    class Whole(Partial):
        d: int
        e: Annotated[NotRequired[int], "meta"]


    class PartialAgain(Tokens, total=False):
        f: int
        g: Required[int]
    '''

NAMES = ["Options", "Tokens", "Partial", "Whole", "PartialAgain"]


def _keys(sig_text: str) -> tuple[set, set]:
    params = [p for p in to_signature(sig_text).parameters.values()]
    return ({p.name for p in params if p.default is inspect.Parameter.empty},
            {p.name for p in params if p.default is not inspect.Parameter.empty})


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """The stand-in read as a release (under `vllm/`: reach follows a base inside vLLM only) and run by Python
    under another name."""
    root = write_tree(tmp_path_factory.mktemp("td"), {"vllm/pktd/prompts.py": SOURCE})
    spec = importlib.util.spec_from_file_location("pktd_prompts", root / "vllm" / "pktd" / "prompts.py")
    live = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(live)
    return StaticRelease.open(root), live


@pytest.mark.parametrize("name", NAMES)
def test_required_and_optional_keys_are_those_python_makes(stand_in, name):
    release, live = stand_in
    got = callable_signature(release, f"vllm.pktd.prompts:{name}", "class")
    assert got is not None
    required, optional = _keys(got[0])
    cls = getattr(live, name)
    assert (required, optional) == (set(cls.__required_keys__), set(cls.__optional_keys__)), got[0]


def test_a_call_without_the_optional_keys_binds_and_one_without_a_required_key_does_not(stand_in):
    release, _ = stand_in
    sig, bound = callable_signature(release, "vllm.pktd.prompts:Tokens", "class")
    assert misfit(sig, bound, CallShape(0, ("ids",), False, False)) is None
    assert "ids" in misfit(sig, bound, CallShape(0, ("prompt",), False, False))


def test_a_quoted_qualifier_reads_as_the_unquoted_one(tmp_path):
    """PEP 655: the qualifier is the annotation's, quoted or not (Python 3.11's runtime does not evaluate a quoted
    one at class creation; the type checkers, and the keys the class declares, do)."""
    root = write_tree(tmp_path, {"pkq/p.py": '''
        from typing import NotRequired, TypedDict


        class Q(TypedDict):
            a: int
            b: "NotRequired[int]"
        '''})
    sig, _ = callable_signature(StaticRelease.open(root), "pkq.p:Q", "class")
    assert _keys(sig) == ({"a"}, {"b"})


@pytest.mark.skipif(installed_version() != "0.31.0", reason="vLLM 0.31.0's TokensPrompt")
def test_vllm_tokens_prompt_by_its_token_ids_binds():
    from vllm_patchkit.tools.releases import installed_root
    from vllm_patchkit.upstream.static_source import DirSource

    release = StaticRelease(DirSource(installed_root()))
    sig, bound = callable_signature(release, "vllm.inputs.llm:TokensPrompt", "class")
    assert misfit(sig, bound, CallShape(0, ("prompt_token_ids",), False, False)) is None
    live = importlib.import_module("vllm.inputs.llm").TokensPrompt
    assert _keys(sig) == (set(live.__required_keys__), set(live.__optional_keys__))

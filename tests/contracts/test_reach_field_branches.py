"""A fielded class whose fields are annotated inside an `if` of its body: the constructor reach binds a call against
is the one the class statement makes (the branch that runs), as Python's own `inspect.signature` of it says.

Found on the corpus (tuning plugin vllm-hi 0.1.0): vLLM 0.34.0's `EngineCoreRequest` annotates `prompt_token_ids`
under `if TYPE_CHECKING: ... else: ...`; reach read the body's top level only and called vllm-hi's
`EngineCoreRequest(prompt_token_ids=...)` a TypeError ("parameter 'prompt_token_ids' removed").
"""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

from vllm_patchkit.tools.reach_plugin.signatures import callable_signature, to_signature
from vllm_patchkit.tools.releases import ReleaseError, open_release
from vllm_patchkit.tools.static import StaticRelease

from .helpers import write_tree

SOURCE = '''
    import dataclasses
    from typing import TYPE_CHECKING

    FAST = True


    @dataclasses.dataclass
    class Request:
        request_id: str
        if TYPE_CHECKING:
            prompt_token_ids: list
        else:
            prompt_token_ids: object
        if FAST:
            budget: int = 1
        else:
            legacy: int = 0
        priority: int = 0
    '''


def test_fields_under_an_if_are_the_constructor_python_makes(tmp_path):
    root = write_tree(tmp_path, {"pkbranch/req.py": SOURCE})
    got = callable_signature(StaticRelease.open(root), "pkbranch.req:Request", "class")
    assert got is not None
    sys.path.insert(0, str(root))
    try:
        live = inspect.signature(importlib.import_module("pkbranch.req").Request)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("pkbranch.req", None), sys.modules.pop("pkbranch", None)
    assert list(to_signature(got[0]).parameters) == list(live.parameters) == [
        "request_id", "prompt_token_ids", "budget", "priority"]


def test_engine_core_request_on_0_34_0_takes_prompt_token_ids():
    try:
        release = open_release("0.34.0").release
    except ReleaseError as exc:
        pytest.skip(f"vLLM 0.34.0 cannot be read here ({exc})")
    sig, _ = callable_signature(release, "vllm.v1.engine:EngineCoreRequest", "class")
    assert list(to_signature(sig).parameters)[:3] == ["request_id", "prompt_token_ids", "mm_features"], sig

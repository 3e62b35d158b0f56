"""Kind `set` with `value_from`: a class attribute set to an importable object (issue 12: a real plugin
sets vLLM class attributes to its own classes). Verified, applied, recorded and undone like any patch,
on a real vLLM class."""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.errors import PatchSetErrors

from .helpers import make_loader, patch_doc, pinned_entry, write_module

@pytest.fixture
def attr_target():
    """A plain class attribute of a real vLLM class (pinned as kind `attribute`)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler.patchkit_test_policy = "fifo"
    yield Scheduler, "vllm.v1.core.sched.scheduler:Scheduler.patchkit_test_policy"
    del Scheduler.patchkit_test_policy


def test_value_from_installs_the_object_records_it_and_undoes(tmp_path, attr_target, monkeypatch):
    cls, spec = attr_target
    write_module(tmp_path, "patchkit_policy_mod", "class MyPolicy:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = patch_doc(id="obj", kind="set", target=spec, value_from="patchkit_policy_mod:MyPolicy", processes=["frontend"])
    loader = make_loader(tmp_path, {"obj": doc}, [pinned_entry("obj@1", spec)])
    loader.run_import_stage()
    import patchkit_policy_mod

    assert loader.records["obj"].state == "applied"
    assert cls.patchkit_test_policy is patchkit_policy_mod.MyPolicy
    loader.unpatch()
    assert cls.patchkit_test_policy == "fifo"


def test_value_from_that_does_not_import_fails_before_anything_is_set(tmp_path, attr_target):
    cls, spec = attr_target
    doc = patch_doc(id="obj", kind="set", target=spec, value_from="patchkit_no_such_mod:Thing", processes=["frontend"])
    with pytest.raises(PatchSetErrors, match="value_from: module 'patchkit_no_such_mod' not found"):
        make_loader(tmp_path, {"obj": doc}, [pinned_entry("obj@1", spec)])
    assert cls.patchkit_test_policy == "fifo"


@pytest.mark.parametrize("extra, words", [({"value": 3}, "not both"), ({"kind": "wrap"}, "only for kinds set, register")])
def test_value_from_declaration_errors(tmp_path, extra, words):
    from vllm_patchkit.declaration.declare import load_patch_set
    from .helpers import write_patch

    doc = patch_doc(**{"id": "obj", "kind": "set", "target": "m:C.x", "value_from": "m:Obj",
                       "processes": ["frontend"], **extra})
    write_patch(tmp_path / "p", "obj", doc)
    with pytest.raises(PatchSetErrors, match=words):
        load_patch_set([tmp_path / "p"])

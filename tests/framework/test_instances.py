"""`instances: true`: a method patched on the objects vLLM creates at run time (issue 12: a real plugin
patches methods of its connector's and KV-cache manager's objects). On vLLM's real BlockPool."""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.errors import PatchSetErrors

from .helpers import make_loader, patch_doc, pinned_entry, write_module

pytestmark = pytest.mark.usefixtures("undo_every_loader")

TARGET = "vllm.v1.core.block_pool:BlockPool.get_new_blocks"


def _loader(tmp_path, **extra):
    doc = patch_doc(id="inst", kind="wrap", target=TARGET, instances=True, processes=["engine_core"], **extra)
    loader = make_loader(tmp_path, {"inst": doc}, [pinned_entry("inst@1", TARGET)], role="engine_core")
    loader.run_import_stage()
    return loader


def test_objects_made_while_patched_get_the_counted_method_and_lose_it_on_unpatch(tmp_path):
    from vllm.v1.core.block_pool import BlockPool

    before_init, before_method = BlockPool.__dict__.get("__init__"), BlockPool.__dict__["get_new_blocks"]
    loader = _loader(tmp_path)
    rec = loader.records["inst"]
    assert rec.state == "applied", rec
    assert BlockPool.__dict__["get_new_blocks"] is before_method  # the class itself is untouched
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=16)
    blocks = pool.get_new_blocks(3)  # vLLM's real method, through the wrapper
    assert len(blocks) == 3 and pool.get_num_free_blocks() == 16 - 1 - 3  # minus the null block
    pool.get_new_blocks(num_blocks=2)  # a keyword call reaches it the same way
    loader.sync_calls()
    assert rec.calls == 2 and rec.detail["objects"] == 1
    loader.unpatch()
    assert BlockPool.__dict__.get("__init__") is before_init
    assert "get_new_blocks" not in pool.__dict__  # the object falls back to the class's method
    pool.get_new_blocks(1)
    loader.sync_calls()
    assert rec.calls == 2


def test_a_subclass_override_is_wrapped_too(tmp_path):
    """Unlike a class-level patch (which an override shadows), the object's own method is wrapped."""
    from vllm.v1.core.block_pool import BlockPool

    class MyPool(BlockPool):
        def get_new_blocks(self, num_blocks):
            return super().get_new_blocks(num_blocks)[:1]

    loader = _loader(tmp_path)
    pool = MyPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16)
    assert len(pool.get_new_blocks(2)) == 1  # the override ran, through our layer
    loader.sync_calls()
    assert loader.records["inst"].calls == 1


def test_with_an_implementation_and_twice_applied_does_not_stack(tmp_path, monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    write_module(tmp_path, "patchkit_inst_impl", "seen = []\n"
                 "def wrap(wrapped, instance, args, kwargs):\n"
                 "    assert wrapped.__self__ is instance\n"
                 "    seen.append(args or tuple(kwargs.values()))\n"
                 "    return wrapped(*args, **kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loader = _loader(tmp_path, implementation="patchkit_inst_impl:wrap")
    again = _loader(tmp_path / "again", implementation="patchkit_inst_impl:wrap")
    assert again.records["inst"].detail.get("already")
    import patchkit_inst_impl

    BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16).get_new_blocks(2)
    assert patchkit_inst_impl.seen == [(2,)]  # one layer, not two
    loader.unpatch()


def test_instances_is_only_for_a_method_wrap_or_an_attribute_of_each_object(tmp_path):
    """A `set` of an attribute of each object is declarable (tests/framework/test_instance_attributes.py); a module
    attribute has no objects, and a replace is not per object."""
    from vllm_patchkit.declaration.declare import load_patch_set

    from .helpers import write_patch

    for doc in (dict(kind="set", target="m:x", value=1), dict(kind="replace", target="m:C.f", implementation="m:g")):
        write_patch(tmp_path / "p", "x", patch_doc(id="x", instances=True, processes=["frontend"], **doc))
        with pytest.raises(PatchSetErrors, match="'instances: true' is for kind wrap of a method"):
            load_patch_set([tmp_path / "p"])


@pytest.mark.parametrize("order", ["instances_first", "class_first"])
def test_a_class_level_wrap_and_an_instances_patch_on_one_class_both_count_in_either_order(tmp_path, order):
    """Issue 20: with the instances patch applied first and one object built, a class-level wrap applied next was
    bypassed for every object built afterwards (the per-class closure cached the method as it was), while its
    record said applied with 0 calls. Either order now: each call on a new object counts in both records."""
    from vllm.v1.core.block_pool import BlockPool

    def class_wrap():
        doc = patch_doc(id="cls", kind="wrap", target=TARGET, processes=["engine_core"])
        loader = make_loader(tmp_path / "cls", {"cls": doc}, [pinned_entry("cls@1", TARGET)], role="engine_core")
        loader.run_import_stage()
        return loader

    if order == "instances_first":
        inst = _loader(tmp_path / "inst")
        BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16)  # an object before the class wrap
        cls = class_wrap()
    else:
        cls = class_wrap()
        inst = _loader(tmp_path / "inst")
    assert cls.records["cls"].state == inst.records["inst"].state == "applied"
    BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16).get_new_blocks(2)
    cls.sync_calls(), inst.sync_calls()
    assert (inst.records["inst"].calls, cls.records["cls"].calls) == (1, 1)
    inst.unpatch(), cls.unpatch()


def test_an_instances_patch_on_a_method_the_class_inherits(tmp_path):
    """Issue 20 (ATOM patches HybridKVCacheCoordinator.cache_blocks on its object; vLLM 0.32 moved the method
    to the base KVCacheCoordinator): objects look methods up through the MRO, so the loader applies (pinned as
    the MRO finds it, like `check` and `pin`) and counts calls on objects of the class."""
    from vllm.v1.core.block_pool import BlockPool

    write_module(tmp_path, "patchkit_subpool", "from vllm.v1.core.block_pool import BlockPool\n"
                                                     "class SubPool(BlockPool):\n    pass\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        import patchkit_subpool

        spec = "patchkit_subpool:SubPool.get_new_blocks"
        doc = patch_doc(id="sub", kind="wrap", target=spec, instances=True, processes=["engine_core"])
        entry = pinned_entry("sub@1", TARGET)
        entry["targets"] = {spec: entry["targets"][TARGET]}  # pinned as the MRO finds it: BlockPool's
        loader = make_loader(tmp_path / "l", {"sub": doc}, [entry], role="engine_core")
        loader.run_import_stage()
        rec = loader.records["sub"]
        assert rec.state == "applied", rec
        patchkit_subpool.SubPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16).get_new_blocks(1)
        BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16).get_new_blocks(1)  # not a SubPool
        loader.sync_calls()
        assert rec.calls == 1
        loader.unpatch()
        assert "__init__" not in patchkit_subpool.SubPool.__dict__
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("patchkit_subpool", None)

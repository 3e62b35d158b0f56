"""`kind: set` + `instances: true`: a plain attribute that vLLM's own `__init__` assigns on each object it
creates at run time (`self.x = ...`), overridden on every new object (issue 20 item 6). On vLLM 0.31.0's real
classes: BlockPool.enable_caching (ROCm/ATOM flips it on the pools it marks: tests/corpus/atom, atom-027),
HarmonyParser's per-object counters, the CPU model runner's cascade switch (assigned in its __init__, and in its
base's).

What is pinned is read from the class's source, by one rule (`fingerprint.instance_attribute`) that `check`/`pin`
apply to the release's files and the loader to the imported class's source: the attribute exists when a method
of the class (or of a base in vLLM) assigns `self.attr`, and its value digest is that of the literal `__init__`
assigns, when it assigns one."""

from __future__ import annotations

import pytest

from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import source_fingerprint
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import installed_static, open_release
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.runtime.verify import verify
from vllm_patchkit.tools.manifest_files import dump_fingerprint
from vllm_patchkit.declaration.validation import validate

from .helpers import make_loader, patch_doc, write_module

pytestmark = pytest.mark.usefixtures("undo_every_loader")

ENABLE_CACHING = "vllm.v1.core.block_pool:BlockPool.enable_caching"


def _doc(pid: str, target: str, **extra) -> dict:
    return patch_doc(id=pid, kind="set", target=target, instances=True, processes=["engine_core"], **extra)


def _pins(doc: dict, release=None) -> dict:
    """What `vllm-patchkit pin` writes for the declaration: the release read statically (the installed 0.31.0)."""
    patch = validate(Patch, doc)
    found, broken = examine(release or installed_static(), patch, None)
    assert not broken, [b.explain() for b in broken]
    return {s: dump_fingerprint(f) for s, f in found.items()}


def _loader(tmp_path, doc: dict, pins: dict = None):
    pins = pins if pins is not None else _pins(doc)
    loader = make_loader(tmp_path, {doc["id"]: doc}, [{"patch": f"{doc['id']}@1", "targets": pins}],
                         role="engine_core")
    loader.run_import_stage()
    return loader


def _pool(enable_caching: bool = True):
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(num_gpu_blocks=8, enable_caching=enable_caching, hash_block_size=16)


def test_the_pin_is_the_assignment_in_the_class_source_read_alike_statically_and_live():
    from vllm.parser.harmony import HarmonyParser
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    static = installed_static().release
    cases = [(BlockPool, "enable_caching", None),  # `self.enable_caching = enable_caching`: not a literal
             (HarmonyParser, "_next_tool_call_index", source_fingerprint.value_digest(0)),  # `self._next_tool_call_index = 0`
             (HarmonyParser, "model_tokenizer", None),  # assigned in the base's __init__ (Parser)
             (CPUModelRunner, "cascade_attn_enabled", source_fingerprint.value_digest(False))]  # its own __init__ wins over the base's
    for cls, attr, digest in cases:
        spec = f"{cls.__module__}:{cls.__qualname__}.{attr}"
        live = fp.live_instance_attribute(cls, attr)
        assert live == static.instance_attribute(spec) == Fingerprint(kind="instance_attribute", value_digest=digest)
    gone = fp.live_instance_attribute(BlockPool, "num_hash_lookahead_tokens")  # assigned from vLLM 0.33.0 on
    assert gone == (static.instance_attribute("vllm.v1.core.block_pool:BlockPool.num_hash_lookahead_tokens").reason,
                    False)
    assert gone[0].startswith("no method of vllm.v1.core.block_pool:BlockPool or of its bases in the vllm package "
                              "assigns self.num_hash_lookahead_tokens")


def test_each_new_object_gets_the_value_after_vllm_init_and_unpatch_gives_upstreams_back(tmp_path):
    from vllm.v1.core.block_pool import BlockPool

    before_init = BlockPool.__dict__["__init__"]
    assert _pins(_doc("no-cache", ENABLE_CACHING, value=False)) == {ENABLE_CACHING: {"kind": "instance_attribute"}}
    loader = _loader(tmp_path, _doc("no-cache", ENABLE_CACHING, value=False))
    rec = loader.records["no-cache"]
    assert rec.state == "applied", rec
    assert rec.detail["places"] == ["vllm.v1.core.block_pool:BlockPool.__init__"]
    assert "enable_caching" not in BlockPool.__dict__  # the class is untouched: objects get it
    a, b = _pool(), _pool()
    assert a.enable_caching is False and b.enable_caching is False  # vLLM's __init__ assigned True, then ours
    b.enable_caching = "changed since"  # by vLLM or anybody after construction: theirs from now on
    loader.sync_calls()
    assert rec.calls == 2 and rec.detail["objects"] == 2  # counted: objects set
    loader.unpatch()
    assert BlockPool.__dict__["__init__"] is before_init
    assert a.enable_caching is True  # still ours at unpatch: back to what vLLM's __init__ gave it
    assert b.enable_caching == "changed since"  # changed since: kept
    assert _pool().enable_caching is True
    loader.sync_calls()
    assert rec.calls == 2


def test_a_subclass_whose_init_calls_up_gets_it_too_and_value_from_sets_an_object(tmp_path, monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    write_module(tmp_path, "patchkit_ia_values", "class Marker:\n    pass\nMARK = Marker()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import patchkit_ia_values

    class SubPool(BlockPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.extra = 1

    loader = _loader(tmp_path, _doc("mark", ENABLE_CACHING, value_from="patchkit_ia_values:MARK"))
    assert loader.records["mark"].state == "applied", loader.records["mark"]
    sub = SubPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    assert sub.enable_caching is patchkit_ia_values.MARK and sub.extra == 1
    loader.unpatch()
    assert sub.enable_caching is True


def test_applied_twice_in_one_process_does_not_stack(tmp_path):
    loader = _loader(tmp_path, _doc("no-cache", ENABLE_CACHING, value=False))
    again = _loader(tmp_path / "again", _doc("no-cache", ENABLE_CACHING, value=False))
    assert again.records["no-cache"].detail.get("already")
    _pool()
    loader.sync_calls()
    assert loader.records["no-cache"].calls == 1  # one layer, one object set


def test_an_attribute_the_release_does_not_assign_is_refused_at_start_up_in_checks_words(tmp_path):
    """vLLM 0.33.0's BlockPool.__init__ assigns self.num_hash_lookahead_tokens; 0.31.0's does not. Pinned on the
    0.33.0 wheel and run on 0.31.0, the loader refuses with the words `check` uses for 0.31.0 against that pin
    (the same as for an attribute vLLM stops assigning: tests/contracts/test_set_kinds_check.py)."""
    spec = "vllm.v1.core.block_pool:BlockPool.num_hash_lookahead_tokens"
    doc = _doc("lookahead", spec, value=0)
    try:
        release_33 = open_release("0.33.0")
    except Exception as exc:  # noqa: BLE001 (no wheel here)
        pytest.skip(f"vLLM 0.33.0 wheel not at hand: {exc}")
    pins = _pins(doc, release_33)
    assert pins == {spec: {"kind": "instance_attribute"}}  # `self.num_hash_lookahead_tokens = num_hash_...`
    patch = validate(Patch, doc)
    _, said = examine(installed_static(), patch, {s: Fingerprint(**f) for s, f in pins.items()})
    [b] = said
    assert b.kind.value == "target_removed" and b.breaking
    loader = _loader(tmp_path, doc, pins)
    rec = loader.records["lookahead"]
    assert rec.state == "failed" and rec.code == "target", rec
    assert rec.reason == b.detail  # one reading, one verdict, one text


def test_a_changed_literal_is_a_fingerprint_failure_with_checks_words(tmp_path):
    """HarmonyParser's __init__ assigns `self._next_tool_call_index = 0`; a pin holding another value (as if
    upstream changed the literal) fails start-up with the words `check` prints for it."""
    spec = "vllm.parser.harmony:HarmonyParser._next_tool_call_index"
    doc = patch_doc(id="idx", kind="set", target=spec, instances=True, value=5, processes=["frontend"])
    other = source_fingerprint.value_digest(1)
    pins = {spec: {"kind": "instance_attribute", "value_digest": other}}
    patch = validate(Patch, doc)
    _, said = examine(installed_static(), patch, {spec: Fingerprint(**pins[spec])})
    [b] = said
    assert b.kind.value == "value_changed" and b.breaking
    v = verify(patch, validate(ManifestEntry, {"patch": patch.key, "targets": pins}))
    assert isinstance(v, Finding) and v.code == "fingerprint"
    assert v.reason == f"{b.explain()} ({b.verdict()})"


def test_objects_that_cannot_take_the_attribute_are_refused_before_anything_is_installed(tmp_path, monkeypatch):
    write_module(tmp_path, "patchkit_ia_shapes", """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class Frozen:
            a: int = 0

            def reset(self):
                self.b = 1

        class Slotted:
            __slots__ = ("a",)

            def __init__(self):
                self.a = 1
                self.c = 2
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    for target, words in (("patchkit_ia_shapes:Frozen.b", "frozen dataclass"),
                          ("patchkit_ia_shapes:Slotted.c", "no __dict__ and no slot 'c'")):
        patch = validate(Patch, _doc("shape", target, value=3))
        v = verify(patch, ManifestEntry(patch=patch.key, targets={target: Fingerprint(kind="instance_attribute")}))
        assert isinstance(v, Finding) and v.code == "kind" and words in v.reason, v


def test_declaration_errors():
    for doc, words in ((dict(kind="set", target="m:x", instances=True, value=1),
                        "'instances: true' is for kind wrap of a method (target module:Class.method) or kind set"),
                       (dict(kind="set", target="m:C.x", instances=True, inherited_from="m:B.x", value=1),
                        "give 'instances: true' (an attribute of each object) or 'inherited_from'")):
        with pytest.raises(Exception, match=words.replace("(", r"\(").replace(")", r"\)")):
            validate(Patch, patch_doc(id="x", processes=["frontend"], **doc))


def test_a_mutable_literal_is_copied_for_each_object(tmp_path):
    """`value: [..]` must not become one list shared by every pool (a mutation through one would show in all)."""
    loader = _loader(tmp_path, _doc("lists", ENABLE_CACHING, value=[1, 2]))
    a, b = _pool(), _pool()
    assert a.enable_caching == [1, 2] and a.enable_caching is not b.enable_caching
    a.enable_caching.append(3)
    assert b.enable_caching == [1, 2]
    loader.unpatch()
    assert a.enable_caching is True and b.enable_caching is True  # still the lists the patch gave: given back

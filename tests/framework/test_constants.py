"""Pinned constants: a digest of a simple literal's value, so a changed value is found, not only a removal.

`Fingerprint.value_digest` is computed by `fingerprint.live(..., with_value=True)` for a
non-callable attribute holding an int, float, str, bytes, bool, None, or a tuple /
frozenset / dict of those; verify compares it for the target (`kind: set`) and for
`uses` whenever the pin has one. An absent digest (every manifest written before it
existed) is not judged.
Real vLLM constants: `vllm.v1.engine.core:HANDSHAKE_TIMEOUT_MINS`,
`vllm.v1.core.kv_cache_utils:DEFAULT_NONE_HASH_SEED`, `Executor.uses_ray`.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

import pytest

from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import source_fingerprint
from vllm_patchkit.declaration.pins import Fingerprint, Manifest
from vllm_patchkit.declaration.validation import validate

from .helpers import make_loader, patch_doc, pinned_entry

TIMEOUT = "vllm.v1.engine.core:HANDSHAKE_TIMEOUT_MINS"
SEED = "vllm.v1.core.kv_cache_utils:DEFAULT_NONE_HASH_SEED"
USES_RAY = "vllm.v1.executor.abstract:Executor.uses_ray"
POOL = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"

pytestmark = pytest.mark.usefixtures("undo_every_loader")




@pytest.fixture
def core():
    import vllm.v1.engine.core as core

    saved = core.HANDSHAKE_TIMEOUT_MINS
    yield core
    core.HANDSHAKE_TIMEOUT_MINS = saved


@pytest.fixture
def kvu():
    import vllm.v1.core.kv_cache_utils as kvu

    saved = (kvu.DEFAULT_NONE_HASH_SEED, kvu._pool_bytes_per_block)
    yield kvu
    kvu.DEFAULT_NONE_HASH_SEED, kvu._pool_bytes_per_block = saved


def pinned_with_value(key: str, *specs: str) -> dict:
    """A manifest entry as pinned from this vLLM, with the value digest of every constant."""
    from vllm_patchkit.upstream.targets import resolve

    entry = pinned_entry(key, *specs)
    for spec in specs:
        place = resolve(spec)
        digest = fp.live(place.get_raw(), place.owner_is_class, with_value=True).value_digest
        if digest is not None:
            entry["targets"][spec]["value_digest"] = digest
    return entry


# -- the digest ------------------------------------------------------------------------------------
def test_value_digest_of_simple_literals():
    d = source_fingerprint.value_digest
    assert d(5) == d(5) and d(5).startswith("sha256:")
    assert len({d(1), d(True), d(1.0), d("1"), d(b"1"), d(None), d((1,)), d(frozenset({1}))}) == 8  # types count
    assert d(0.0) != d(-0.0)
    assert d({"a": 1, "b": (2, 3)}) == d({"b": (2, 3), "a": 1})  # dict order does not matter
    assert d(frozenset({"x", "y"})) == d(frozenset({"y", "x"}))
    assert d((1, 2)) != d((2, 1))  # tuple order does
    assert d(("a", ("b", None, {"k": frozenset({1.5})}))) is not None


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("value", [[1, 2], {1, 2}, object(), Color.RED, (1, [2]), {"a": [1]}, lambda: 0])
def test_other_values_are_not_digested(value):
    assert source_fingerprint.value_digest(value) is None


def test_live_fingerprint_of_a_real_constant_has_its_digest():
    import vllm.v1.engine.core as core

    from vllm_patchkit.upstream.targets import resolve

    f = fp.live(resolve(TIMEOUT).get_raw(), False, with_value=True)
    assert (f.kind, f.value_digest) == ("attribute", source_fingerprint.value_digest(5)) and core.HANDSHAKE_TIMEOUT_MINS == 5
    assert fp.live(resolve(TIMEOUT).get_raw(), False).value_digest is None  # opt-in, as the source digest
    pool = resolve(POOL)
    assert fp.live(pool.get_raw(), False, with_value=True).value_digest is None  # functions: no value digest
    place = resolve(USES_RAY)
    assert fp.live(place.get_raw(), True, with_value=True).value_digest == source_fingerprint.value_digest(False)


def test_pin_writes_the_digest_and_manifests_without_it_still_load():
    from vllm_patchkit.tools.manifest_files import dump_fingerprint as _dump_fingerprint

    assert _dump_fingerprint(Fingerprint(kind="attribute", value_digest=source_fingerprint.value_digest(5))) == {
        "kind": "attribute", "value_digest": source_fingerprint.value_digest(5)}
    assert _dump_fingerprint(Fingerprint(kind="attribute")) == {"kind": "attribute"}
    old = validate(Manifest, {"vllm": "0.31.0", "generated_by": "t", "patches": [
        {"patch": "p@1", "targets": {TIMEOUT: {"kind": "attribute"}}}]})
    assert old.patches[0].targets[TIMEOUT].value_digest is None
    schema = json.loads((Path(fp.__file__).parents[1] / "json_schema" / "manifest.schema.json").read_text())
    assert "value_digest" in json.dumps(schema)


# -- verify ----------------------------------------------------------------------------------------
def set_doc(spec, value):
    return patch_doc(id="s", kind="set", target=spec, value=value, processes=["frontend"])


def test_set_on_a_constant_whose_value_changed_upstream_fails(tmp_path, core):
    entry = pinned_with_value("s@1", TIMEOUT)
    assert entry["targets"][TIMEOUT]["value_digest"] == source_fingerprint.value_digest(5)
    core.HANDSHAKE_TIMEOUT_MINS = 10  # the release changed it
    loader = make_loader(tmp_path, {"s": set_doc(TIMEOUT, 30)}, [entry])
    loader.run_import_stage()
    rec = loader.records["s"]
    assert (rec.state, rec.code) == ("failed", "fingerprint")
    assert rec.reason == f"{TIMEOUT}: value changed since it was pinned (now 10)"
    assert (rec.expected, rec.found) == (source_fingerprint.value_digest(5), source_fingerprint.value_digest(10))
    assert core.HANDSHAKE_TIMEOUT_MINS == 10  # not set


def test_set_on_an_unchanged_constant_applies_and_a_second_loader_sees_it_already_set(tmp_path, core):
    entry = pinned_with_value("s@1", TIMEOUT)
    first = make_loader(tmp_path / "1", {"s": set_doc(TIMEOUT, 30)}, [entry])
    first.run_import_stage()
    try:
        assert first.records["s"].state == "applied", first.records["s"]
        assert core.HANDSHAKE_TIMEOUT_MINS == 30
        second = make_loader(tmp_path / "2", {"s": set_doc(TIMEOUT, 30)}, [entry])
        second.run_import_stage()
        assert second.records["s"].state == "applied", second.records["s"]
        assert "already" in second.records["s"].detail
        other = make_loader(tmp_path / "3", {"s": set_doc(TIMEOUT, 45)}, [entry])  # another value: changed
        other.run_import_stage()
        assert other.records["s"].code == "fingerprint"
    finally:
        first.unpatch()
    assert core.HANDSHAKE_TIMEOUT_MINS == 5


def test_set_on_a_class_constant_that_changed_fails(tmp_path):
    import vllm.v1.executor.abstract as ex

    entry = pinned_with_value("s@1", USES_RAY)
    saved = ex.Executor.__dict__["uses_ray"]
    ex.Executor.uses_ray = True
    try:
        loader = make_loader(tmp_path, {"s": set_doc(USES_RAY, False)}, [entry])
        loader.run_import_stage()
        rec = loader.records["s"]
        assert (rec.state, rec.code) == ("failed", "fingerprint")
        assert rec.reason == f"{USES_RAY}: value changed since it was pinned (now True)"
    finally:
        ex.Executor.uses_ray = saved


def test_a_pin_without_digest_does_not_judge_the_value(tmp_path, core):
    entry = pinned_with_value("s@1", TIMEOUT)
    del entry["targets"][TIMEOUT]["value_digest"]  # a manifest written before value digests
    core.HANDSHAKE_TIMEOUT_MINS = 10
    loader = make_loader(tmp_path, {"s": set_doc(TIMEOUT, 30)}, [entry])
    loader.run_import_stage()
    try:
        assert loader.records["s"].state == "applied", loader.records["s"]
    finally:
        loader.unpatch()
    assert core.HANDSHAKE_TIMEOUT_MINS == 10


def test_a_used_constant_whose_value_changed_fails_the_patch_using_it(tmp_path, kvu):
    doc = patch_doc(id="w", kind="wrap", target=POOL, uses=[SEED], processes=["frontend"])
    entry = pinned_with_value("w@1", POOL, SEED)
    assert entry["targets"][SEED]["value_digest"] == source_fingerprint.value_digest("vllm-none-hash")
    kvu.DEFAULT_NONE_HASH_SEED = "another-seed"
    loader = make_loader(tmp_path, {"w": doc}, [entry])
    loader.run_import_stage()
    rec = loader.records["w"]
    assert (rec.state, rec.code) == ("failed", "uses")
    assert rec.reason == (f"upstream callable the implementation uses changed: {SEED}: value changed since it was "
                          "pinned (now 'another-seed')")
    kvu.DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
    again = make_loader(tmp_path / "again", {"w": doc}, [entry])
    again.run_import_stage()
    try:
        assert again.records["w"].state == "applied", again.records["w"]
    finally:
        again.unpatch()

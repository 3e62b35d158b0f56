"""Patch sets that collide (issue 21, item 7): a patch id declared by two sets, a manifest error in a set's own file,
two extra folders with one basename. Each test failed before its fix; what happened then is in its docstring."""

from __future__ import annotations

import pytest

from vllm_patchkit.upstream import cache
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.patchsets import EXTRA_ENV, PatchSetSource, discover

from .helpers import patch_doc, pinned_entry, write_manifest, write_patch

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
PLAN = "vllm.v1.core.kv_cache_utils:generate_scheduler_kv_cache_config"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "cache"))


def _errors(exc: BaseException) -> list[DeclarationError]:
    return exc.errors if isinstance(exc, PatchSetErrors) else [exc]


def _two_sets(tmp_path):
    a = write_patch(tmp_path / "a" / "patches", "shared", patch_doc(id="shared-id", version=1, kind="wrap", target=KV,
                                                                    processes=["worker"]))
    b = write_patch(tmp_path / "b" / "patches", "shared", patch_doc(id="shared-id", version=2, kind="wrap", target=PLAN,
                                                                    processes=["worker"]))
    return a, b


def test_one_patch_id_in_two_sets_is_a_declaration_error_naming_both_sets_and_files(tmp_path):
    """Before: set A's shared-id@1 and set B's shared-id@2 (another target) loaded as two versions of one patch;
    the loader then chose one version per id, so B's never applied and had no row of its own."""
    a, b = _two_sets(tmp_path)
    sources = [PatchSetSource("set-a", a.parent), PatchSetSource("set-b", b.parent)]
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set(sources)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(b), "id")
    for words in ("'shared-id'", "'set-a'", "'set-b'", str(a), str(b), "shared-id@1", "shared-id@2", "unique across sets"):
        assert words in err.problem, (words, err.problem)


def test_versions_of_one_patch_within_one_set_still_load(tmp_path):
    folder = tmp_path / "one"
    write_patch(folder, "p1", patch_doc(id="p", version=1, kind="wrap", target=KV, processes=["worker"]))
    write_patch(folder, "p2", patch_doc(id="p", version=2, kind="wrap", target=KV, processes=["worker"]))
    ps = load_patch_set([PatchSetSource("one", folder)])
    assert sorted(ps.patches) == ["p@1", "p@2"]


def test_a_collision_between_extra_folders_stops_start_up_naming_both(tmp_path, monkeypatch):
    """The same through the loader, with the sets from $VLLM_PATCHKIT_EXTRA_PATCHES (before: it started, one of the
    two patches silently absent)."""
    a, b = _two_sets(tmp_path)
    (tmp_path / "a" / "patches").rename(tmp_path / "a" / "set-a")
    (tmp_path / "b" / "patches").rename(tmp_path / "b" / "set-b")
    monkeypatch.setenv(EXTRA_ENV, f"{tmp_path / 'a' / 'set-a'}:{tmp_path / 'b' / 'set-b'}")
    with pytest.raises(PatchSetErrors) as ei:
        Loader.builtin(role="worker", write_records=False)
    text = str(ei.value)
    assert "'extra:set-a'" in text and "'extra:set-b'" in text
    assert str(tmp_path / "a" / "set-a" / "shared.yaml") in text and str(tmp_path / "b" / "set-b" / "shared.yaml") in text


def _manifest_sets(tmp_path):
    """Set A pins its two patches in its own manifest; set B pins its two in its own, the second entry wrong."""
    pa, pb = tmp_path / "a" / "patches", tmp_path / "b" / "patches"
    write_patch(pa, "a1", patch_doc(id="a-one", kind="wrap", target=KV, processes=["worker"]))
    write_patch(pa, "a2", patch_doc(id="a-two", kind="wrap", target=PLAN, processes=["worker"]))
    write_patch(pb, "b1", patch_doc(id="b-one", kind="wrap", target=KV, processes=["worker"]))
    write_patch(pb, "b2", patch_doc(id="b-two", kind="wrap", target=PLAN, processes=["worker"]))
    ps = load_patch_set([PatchSetSource("a", pa), PatchSetSource("b", pb)])
    ma = write_manifest(tmp_path / "a" / "manifests", [pinned_entry("a-one@1", KV), pinned_entry("a-two@1", PLAN)])
    return ps, ma


def test_a_manifest_error_names_the_entry_index_within_its_own_file(tmp_path):
    """Before: the second file's entries were checked after merging them behind the first file's, so its entry 1
    was reported as `patches[3]` of a file with two entries."""
    ps, _ = _manifest_sets(tmp_path)
    mb = write_manifest(tmp_path / "b" / "manifests", [pinned_entry("b-one@1", KV), {"patch": "b-two@1", "targets": {}}])
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "a" / "manifests", tmp_path / "b" / "manifests"], ps)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(mb), "patches[1].targets") and "no pin for" in err.problem


def test_an_error_in_the_first_file_is_not_reported_again_against_the_second(tmp_path):
    """Before: the merged list was checked again with the second file's name, so an error of the first file was
    reported twice, once against a file that does not hold it."""
    ps, ma = _manifest_sets(tmp_path)
    ma.write_text(ma.read_text().replace("a-two@1", "a-three@1"))
    mb = write_manifest(tmp_path / "b" / "manifests", [pinned_entry("b-one@1", KV), pinned_entry("b-two@1", PLAN)])
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "a" / "manifests", tmp_path / "b" / "manifests"], ps)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(ma), "patches[1].patch") and "no patch a-three@1" in err.problem
    assert str(mb) not in str(ei.value)


def test_a_patch_listed_by_two_sets_manifests_names_both_places(tmp_path):
    ps, ma = _manifest_sets(tmp_path)
    mb = write_manifest(tmp_path / "b" / "manifests", [pinned_entry("b-one@1", KV), pinned_entry("a-two@1", PLAN)])
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "a" / "manifests", tmp_path / "b" / "manifests"], ps)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(mb), "patches[1].patch")
    assert "listed twice" in err.problem and f"{ma} patches[1]" in err.problem


def test_marked_not_applicable_in_one_file_and_applying_in_another_names_both(tmp_path):
    ps, ma = _manifest_sets(tmp_path)
    mb = tmp_path / "b" / "manifests" / "vllm-0.31.0.yaml"
    mb.parent.mkdir(parents=True)
    mb.write_text("vllm: 0.31.0\ngenerated_by: test\npatches: []\nnot_applicable:\n"
                  "- {patch: b-one, reason: r}\n- {patch: a-one, reason: r}\n")
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "a" / "manifests", tmp_path / "b" / "manifests"], ps)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(mb), "not_applicable[1].patch")
    assert "also listed under patches" in err.problem and f"{ma} patches[0]" in err.problem


def test_two_extra_folders_with_one_basename_fail_naming_both_paths(tmp_path, monkeypatch):
    """Before: both became set `extra:patches` and the error read "patch set 'extra:patches' also contributed by
    VLLM_PATCHKIT_EXTRA_PATCHES", naming neither folder."""
    one = write_patch(tmp_path / "one" / "patches", "x", patch_doc(id="x", kind="wrap", target=KV, processes=["worker"]))
    two = write_patch(tmp_path / "two" / "patches", "y", patch_doc(id="y", kind="wrap", target=KV, processes=["worker"]))
    monkeypatch.setenv(EXTRA_ENV, f"{one.parent}:{two.parent}")
    with pytest.raises(PatchSetErrors) as ei:
        discover()
    [err] = _errors(ei.value)
    assert err.file == EXTRA_ENV and err.field == str(two.parent)
    assert str(one.parent) in err.problem and "rename one of the two folders" in err.problem
    with pytest.raises(PatchSetErrors) as ei:  # and through the loader, as a start-up error
        Loader.builtin(role="worker", write_records=False)
    assert str(one.parent) in str(ei.value) and str(two.parent) in str(ei.value)

"""Bad patch files and manifests: an error naming the file and the field; nothing applied."""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import PatchSetErrors
from vllm_patchkit.declaration.manifest import load_manifests

from .helpers import make_loader, patch_doc, pinned_entry, write_manifest, write_patch

TARGET = "vllm.config.vllm:VllmConfig._maybe_enable_breakable_cudagraph"


def _errors(exc_info) -> list[tuple[str, str, str]]:
    return [(e.file, e.field, e.problem) for e in exc_info.value.errors]


def test_unknown_key_names_file_and_field(tmp_path):
    path = write_patch(tmp_path, "typo", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"],
                                                   preconditions={"vllm": ">=0.31"}))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    [(file, field, problem)] = _errors(ei)
    assert file == str(path) and field == "preconditions" and "unknown key" in problem


def test_wrong_type_names_field(tmp_path):
    write_patch(tmp_path, "p", patch_doc(id="a", version="1", kind="wrap", target=TARGET, processes=["frontend"]))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert [f for _, f, _ in _errors(ei)] == ["version"]
    assert "integer" in _errors(ei)[0][2]


def test_nested_field_path(tmp_path):
    write_patch(tmp_path, "p", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"],
                                         when={"runner": "v3"}))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert _errors(ei)[0][1] == "when.runner"


def test_kind_needs_its_fields(tmp_path):
    write_patch(tmp_path, "p", patch_doc(id="a", kind="refuse", processes=["frontend"]))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert "needs 'message'" in str(ei.value)


def test_bad_version_specifier(tmp_path):
    write_patch(tmp_path, "p", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"],
                                         when={"vllm": "0.31 or newer"}))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert _errors(ei)[0][1] == "when.vllm" and "PEP 440" in _errors(ei)[0][2]


def test_duplicate_id(tmp_path):
    doc = patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"])
    write_patch(tmp_path, "one", doc)
    second = write_patch(tmp_path, "two", doc)
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    [(file, field, problem)] = _errors(ei)
    assert file == str(second) and field == "id" and "duplicate patch a@1" in problem


def test_requires_cycle(tmp_path):
    write_patch(tmp_path, "a", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"], requires=["b"]))
    write_patch(tmp_path, "b", patch_doc(id="b", kind="wrap", target=TARGET, processes=["frontend"], requires=["a"]))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    [(file, field, problem)] = _errors(ei)
    assert field == "requires" and "cycle" in problem and file.endswith(("a.yaml", "b.yaml"))


def test_unknown_requires(tmp_path):
    write_patch(tmp_path, "a", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"], requires=["zz"]))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert _errors(ei)[0][1] == "requires[0]"


def test_not_yaml(tmp_path):
    write_patch(tmp_path, "a", "id: [unclosed\n")
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    assert "not valid YAML" in str(ei.value)


def test_unknown_target_module_nothing_applied(tmp_path):
    """A typo in a module name is caught before any patch of the set is applied."""
    import vllm.config.vllm as cfgmod

    before = cfgmod.VllmConfig.__dict__["__post_init__"]
    good = patch_doc(id="good", kind="wrap", target="vllm.config.vllm:VllmConfig.__post_init__", processes=["frontend"])
    bad = patch_doc(id="bad", kind="wrap", target="vllm.config.vlm:VllmConfig.__post_init__", processes=["frontend"])
    entries = [pinned_entry("good@1", "vllm.config.vllm:VllmConfig.__post_init__"),
               {"patch": "bad@1", "targets": {"vllm.config.vlm:VllmConfig.__post_init__": {"kind": "method"}}}]
    with pytest.raises(PatchSetErrors) as ei:
        make_loader(tmp_path, {"good": good, "bad": bad}, entries).run_import_stage()
    [(file, field, problem)] = _errors(ei)
    assert file.endswith("bad.yaml") and field == "target" and "vllm.config.vlm" in problem
    assert cfgmod.VllmConfig.__dict__["__post_init__"] is before


def test_manifest_unknown_patch_and_missing_pin(tmp_path):
    write_patch(tmp_path / "p", "a", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"]))
    ps = load_patch_set([tmp_path / "p"])
    m = write_manifest(tmp_path / "m", [{"patch": "a@1", "targets": {}}, {"patch": "zz@1", "targets": {}}])
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "m"], ps)
    fields = {f for _, f, _ in _errors(ei)}
    assert fields == {"patches[0].targets", "patches[1].patch"}
    assert all(file == str(m) for file, _, _ in _errors(ei))


def test_shipped_patch_set_and_manifests_load():
    from patchkit_deepseek_v4 import MANIFESTS
    from vllm_patchkit.declaration.declare import installed_sources

    ps = load_patch_set(installed_sources())
    ms = load_manifests([MANIFESTS], ps)
    assert "0.31.0" in ms
    assert "breakable-cudagraph-opt-out@1" in ps.patches

"""Regression tests for malformed-input bugs the reliability suite found in declare.py and manifest.py.

Each test failed before its fix. What each bug was is said in the test's docstring.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.declare import load_patch_set, parse_manifest, parse_patch
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.manifest import load_manifests

from ..framework.helpers import patch_doc, write_manifest, write_patch

TARGET = "vllm.config.vllm:VllmConfig._maybe_enable_breakable_cudagraph"
GOOD = """\
id: a
version: 1
summary: s
why: w
upstream: "none: test"
retire_when: {manual: test}
kind: wrap
target: vllm.config.vllm:VllmConfig._maybe_enable_breakable_cudagraph
processes: [frontend]
required: false
"""


def _errors(exc: BaseException) -> list[DeclarationError]:
    return exc.errors if isinstance(exc, PatchSetErrors) else [exc]


def _reject(path) -> list[DeclarationError]:
    with pytest.raises((DeclarationError, PatchSetErrors)) as ei:
        parse_patch(path)
    return _errors(ei.value)


def test_duplicate_top_level_key_is_rejected(tmp_path):
    """PyYAML keeps the last of two equal keys silently: `required: false` then
    `required: true` loaded as a required patch, with no error."""
    path = write_patch(tmp_path, "dup", GOOD + "required: true\n")
    [err] = _reject(path)
    assert (err.file, err.field) == (str(path), "required")
    assert "duplicate key" in err.problem and "line 10" in err.problem and "line 11" in err.problem


def test_duplicate_nested_key_names_its_path(tmp_path):
    path = write_patch(tmp_path, "dup", GOOD + "when:\n  runner: v1\n  prefix_caching: true\n  runner: v2\n")
    [err] = _reject(path)
    assert (err.file, err.field) == (str(path), "when.runner")


def test_duplicate_key_in_a_manifest_is_rejected(tmp_path):
    path = tmp_path / "vllm-0.31.0.yaml"
    path.write_text("vllm: 0.31.0\ngenerated_by: test\npatches: []\ngenerated_by: again\n")
    with pytest.raises((DeclarationError, PatchSetErrors)) as ei:
        parse_manifest(path)
    [err] = _errors(ei.value)
    assert (err.file, err.field) == (str(path), "generated_by")


def test_yaml_merge_key_override_is_not_a_duplicate(tmp_path):
    """`<<: *base` then an explicit key is YAML's own override, not a typo."""
    text = GOOD.replace("retire_when: {manual: test}", "retire_when: &r {manual: test}") + "when:\n  <<: {runner: v1}\n  runner: v2\n"
    patch = parse_patch(write_patch(tmp_path, "merge", text))
    assert patch.when.runner == "v2"


def test_deeply_nested_document_is_a_declaration_error(tmp_path):
    """A deeply nested value made the YAML reader raise RecursionError, which escaped
    as a crash instead of an error naming the file."""
    path = write_patch(tmp_path, "deep", GOOD + "when: " + "[" * 3000 + "]" * 3000 + "\n")
    [err] = _reject(path)
    assert err.file == str(path) and "nested too deeply" in err.problem


@pytest.mark.parametrize("doc, field", [
    (patch_doc(id="a", kind="wrap", processes=["frontend"]), "target"),
    (patch_doc(id="a", kind="replace", target=TARGET, processes=["frontend"]), "implementation"),
    (patch_doc(id="a", kind="refuse", processes=["frontend"]), "message"),
    (patch_doc(id="a", kind="env_default", processes=["frontend"]), "env_default"),
    (patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"], value=3), "value"),
    (patch_doc(id="a", kind="refuse", message="m", processes=["frontend"], copies=[TARGET]), "copies"),
    (patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"], requires=["a"]), "requires"),
])
def test_cross_field_rule_names_the_field(tmp_path, doc, field):
    """A rule spanning several fields (kind 'wrap' needs 'target', ...) was reported
    with the field `<file>` and the whole document as 'got'; now the field it is about."""
    path = write_patch(tmp_path, "p", doc)
    [err] = _reject(path)
    assert (err.file, err.field) == (str(path), field)
    assert not err.problem.startswith("Value error") and "(got {" not in err.problem


def test_unknown_requires_after_a_broken_file_points_at_it(tmp_path):
    """When the file declaring a required id fails to load, its dependents said only
    "unknown patch id", as if the id had a typo; now they point at the broken file."""
    write_patch(tmp_path, "a", patch_doc(id="a", kind="wrap", target=TARGET, processes=["frontend"], typo_key=1))
    write_patch(tmp_path, "b", patch_doc(id="b", kind="wrap", target=TARGET, processes=["frontend"], requires=["a"]))
    with pytest.raises(PatchSetErrors) as ei:
        load_patch_set([tmp_path])
    by_file = {e.file.rsplit("/", 1)[-1]: e for e in ei.value.errors}
    assert by_file["a.yaml"].field == "typo_key"
    assert by_file["b.yaml"].field == "requires[0]"
    assert "a.yaml" in by_file["b.yaml"].problem and "failed to load" in by_file["b.yaml"].problem


def _one_patch_set(tmp_path):
    write_patch(tmp_path / "p", "a", patch_doc(id="a", kind="refuse", message="m", processes=["frontend"]))
    write_patch(tmp_path / "p", "b", patch_doc(id="b", kind="refuse", message="m", processes=["frontend"]))
    return load_patch_set([tmp_path / "p"])


@pytest.mark.parametrize("not_applicable, field, words", [
    ([{"patch": "zz", "reason": "r"}], "not_applicable[0].patch", "no patch zz"),
    ([{"patch": "a", "reason": "r"}], "not_applicable[0].patch", "also listed"),
    ([{"patch": "b", "reason": "r"}, {"patch": "b", "reason": "again"}], "not_applicable[1].patch", "twice"),
])
def test_manifest_not_applicable_is_checked(tmp_path, not_applicable, field, words):
    """`not_applicable` was never checked against the patch set: a typo'd id, an id the
    same manifest also lists as applying, or one given twice were all accepted."""
    ps = _one_patch_set(tmp_path)
    path = write_manifest(tmp_path / "m", [{"patch": "a@1", "targets": {}}])
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["not_applicable"] = not_applicable
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PatchSetErrors) as ei:
        load_manifests([tmp_path / "m"], ps)
    [err] = ei.value.errors
    assert (err.file, err.field) == (str(path), field) and words in err.problem


def test_manifest_valid_not_applicable_still_loads(tmp_path):
    ps = _one_patch_set(tmp_path)
    path = write_manifest(tmp_path / "m", [{"patch": "a@1", "targets": {}}])
    path.write_text(path.read_text() + "not_applicable:\n- {patch: b, reason: gone upstream}\n")
    ms = load_manifests([tmp_path / "m"], ps)
    assert [n.patch for n in ms["0.31.0"].manifest.not_applicable] == ["b"]


def test_character_yaml_forbids_is_an_error_with_its_line(tmp_path):
    """A NUL byte: the YAML reader's ReaderError must become a DeclarationError naming the line."""
    path = tmp_path / "nul.yaml"
    path.write_bytes(GOOD.replace("version: 1\n", "version: 1\nbroken: \x00\n").encode())
    [err] = _reject(path)
    assert (err.file, err.field) == (str(path), "line 3") and "unacceptable character" in err.problem

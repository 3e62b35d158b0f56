"""`vllm-patchkit pin`: manifests from the release, keeping what a reviewer decided."""

from __future__ import annotations

import yaml

from vllm_patchkit.cli import main
from vllm_patchkit.declare import load_patch_set, parse_manifest
from vllm_patchkit.manifest import load_manifests

from .helpers import patch_doc, write_patches, write_tree

BEFORE = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(a, b=1):\n    pass\n"}
AFTER = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(a, b=2):\n    pass\n"}


def pin_cli(tree, version, patches, manifests, *extra):
    return main(["pin", "--source", str(tree), "--vllm", version, "--patch-dir", str(patches),
                 "--manifest-dir", str(manifests), *extra])


def setup(tmp_path, docs, before=BEFORE, after=AFTER):
    b, a = write_tree(tmp_path / "before", before), write_tree(tmp_path / "after", after)
    patches = write_patches(tmp_path / "patches", docs)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    assert pin_cli(b, "1.0.0", patches, manifests) == 0
    return a, patches, manifests


def test_new_release_lists_what_fits_and_marks_the_rest_not_applicable(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f"), patch_doc("q", "toy.mod:g")])
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(manifests / "vllm-2.0.0.yaml")
    assert [e.patch for e in m.patches] == ["p@1"]
    assert m.patches[0].targets["toy.mod:f"].signature == "(a)"
    [na] = m.not_applicable
    assert na.patch == "q"
    assert na.reason == "q@1 was pinned on vLLM 1.0.0; on 2.0.0: toy.mod:g: default of 'b' changed: 1 -> 2"
    assert "generated_by" in (manifests / "vllm-2.0.0.yaml").read_text()
    assert "q: not applicable on 2.0.0" in capsys.readouterr().out
    # the written manifests pass the loader's own checks
    load_manifests([manifests], load_patch_set([patches]))


def test_repinning_keeps_not_applicable_and_chosen_versions(tmp_path):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f"), patch_doc("q", "toy.mod:g")])
    # the owner of q writes version 2 for the new release and lists it by hand, without pins;
    # the reviewer marks p not applicable there for a reason of their own
    write_patches(patches, [patch_doc("q", "toy.mod:g", version=2)])
    path = manifests / "vllm-2.0.0.yaml"
    path.write_text(yaml.safe_dump({
        "vllm": "2.0.0", "generated_by": "by hand",
        "patches": [{"patch": "q@2", "targets": {}}],
        "not_applicable": [{"patch": "p", "reason": "upstream fixed it differently"}],
    }))
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(path)
    assert [(e.patch, e.targets["toy.mod:g"].signature) for e in m.patches] == [("q@2", "(a, b=2)")]
    assert [(n.patch, n.reason) for n in m.not_applicable] == [("p", "upstream fixed it differently")]
    text = path.read_text()
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    assert path.read_text() == text  # idempotent


def test_a_chosen_version_whose_target_is_missing_is_an_error(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f")], after={"toy/mod.py": "X = 1\n"})
    (manifests / "vllm-2.0.0.yaml").write_text(yaml.safe_dump(
        {"vllm": "2.0.0", "generated_by": "by hand", "patches": [{"patch": "p@1", "targets": {}}]}))
    assert pin_cli(a, "2.0.0", patches, manifests) == 2
    assert "p@1: listed for vLLM 2.0.0 but cannot be pinned: toy.mod:f:" in capsys.readouterr().err


def test_a_new_patch_whose_target_is_missing_is_not_applicable(tmp_path):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f")])
    write_patches(patches, [patch_doc("n", "toy.mod:nothing_here")])
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(manifests / "vllm-2.0.0.yaml")
    [na] = m.not_applicable
    assert na.patch == "n" and "toy.mod:nothing_here: target not found" in na.reason


def test_patches_without_targets_are_listed(tmp_path):
    a, patches, manifests = setup(tmp_path, [patch_doc("r", None, kind="refuse")])
    m = parse_manifest(manifests / "vllm-1.0.0.yaml")
    assert [(e.patch, e.targets) for e in m.patches] == [("r@1", {})]


def test_out_folder(tmp_path):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f")])
    out = tmp_path / "elsewhere"
    assert pin_cli(a, "2.0.0", patches, manifests, "--out", str(out)) == 0
    assert (out / "vllm-2.0.0.yaml").is_file() and not (manifests / "vllm-2.0.0.yaml").exists()


def test_version_is_required_for_a_tree_without_one(tmp_path, capsys):
    tree = write_tree(tmp_path / "t", BEFORE)
    patches = write_patches(tmp_path / "patches", [patch_doc("p", "toy.mod:f")])
    assert main(["pin", "--source", str(tree), "--patch-dir", str(patches), "--manifest-dir", str(tmp_path)]) == 2
    assert "pass --vllm VERSION" in capsys.readouterr().err


def test_version_must_match_the_source(tmp_path, capsys):
    tree = write_tree(tmp_path / "t", {**BEFORE, "vllm/_version.py": "__version__ = version = '0.40.0'\n"})
    patches = write_patches(tmp_path / "patches", [patch_doc("p", "toy.mod:f")])
    assert main(["pin", "--source", str(tree), "--vllm", "0.41.0", "--patch-dir", str(patches),
                 "--manifest-dir", str(tmp_path)]) == 2
    assert "is vLLM 0.40.0, not 0.41.0" in capsys.readouterr().err

"""`vllm-patchkit pin`: manifests from the release, keeping what a reviewer decided."""

from __future__ import annotations

import yaml

from vllm_patchkit.tools.cli import main
from vllm_patchkit.declaration.declare import load_patch_set, parse_manifest
from vllm_patchkit.declaration.manifest import load_manifests

from .helpers import patch_doc, write_patches, write_tree

BEFORE = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(a, b=1):\n    pass\n"}
AFTER = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(a, b=2):\n    pass\n"}


# reads `b`, whose default changes between BEFORE and AFTER: breaking for it (a passthrough would be carried)
READS_B = {"implementation": "toy_impl:wrapper", "params": ["b"]}


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
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f"), patch_doc("q", "toy.mod:g", **READS_B)])
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(manifests / "vllm-2.0.0.yaml")
    assert [e.patch for e in m.patches] == ["p@1"]
    assert m.patches[0].targets["toy.mod:f"].signature == "(a)"
    [na] = m.not_applicable
    assert na.patch == "q"
    assert na.reason == ("on vLLM 2.0.0, q@1 against its pins of vLLM 1.0.0: toy.mod:g: default of 'b' changed: 1 -> 2 "
                         "(breaking: the implementation reads 'b' (declared in params))")
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
        "not_applicable": [{"patch": "p", "reason": "by hand: upstream fixed it differently"}],
    }))
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(path)
    assert [(e.patch, e.targets["toy.mod:g"].signature) for e in m.patches] == [("q@2", "(a, b=2)")]
    assert [(n.patch, n.reason) for n in m.not_applicable] == [("p", "by hand: upstream fixed it differently")]
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


# -- folders named on the command line ------------------------------------------------------------
def test_missing_patch_dir_is_an_error(tmp_path, capsys):
    tree = write_tree(tmp_path / "t", BEFORE)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    nope = tmp_path / "patchez"
    assert pin_cli(tree, "1.0.0", nope, manifests) == 2
    out, err = capsys.readouterr()
    assert f"vllm-patchkit pin: --patch-dir {nope}: no such folder (expected a folder of patch files, *.yaml)" in err
    assert out == "" and list(manifests.iterdir()) == []


def test_patch_dir_without_patches_is_an_error(tmp_path, capsys):
    tree = write_tree(tmp_path / "t", BEFORE)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    empty = tmp_path / "patches"
    empty.mkdir()
    assert pin_cli(tree, "1.0.0", empty, manifests) == 2
    out, err = capsys.readouterr()
    assert f"vllm-patchkit pin: --patch-dir {empty}: holds no patch (*.yaml with an id)" in err
    assert out == "" and list(manifests.iterdir()) == []  # no manifest listing nothing


def test_missing_manifest_dir_is_an_error_even_with_out(tmp_path, capsys):
    """pin reads the earlier manifests there: a typo would pin every patch as new."""
    tree = write_tree(tmp_path / "t", BEFORE)
    patches = write_patches(tmp_path / "patches", [patch_doc("p", "toy.mod:f")])
    nope = tmp_path / "manifestz"
    out_dir = tmp_path / "out"
    for extra in ((), ("--out", str(out_dir))):
        assert pin_cli(tree, "1.0.0", patches, nope, *extra) == 2
        err = capsys.readouterr().err
        assert (f"vllm-patchkit pin: --manifest-dir {nope}: no such folder "
                "(expected a folder of manifests, vllm-VERSION.yaml)") in err
    assert not nope.exists() and not out_dir.exists()


# -- required patches are never marked not applicable on pin's own --------------------------------
REMEDY = ("remedy: add a new version of the patch that fits vLLM 2.0.0, "
          "or record it as not applicable with --not-applicable {}='reason'")


def test_a_required_patch_that_no_longer_fits_is_an_error(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f"),
                                             patch_doc("q", "toy.mod:g", required=True, **READS_B)])
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests) == 1
    out, err = capsys.readouterr()
    assert "vllm-patchkit pin: cannot pin vLLM 2.0.0: 1 required patch(es) do not fit it; nothing written" in err
    assert "  - q@1 (required) does not fit vLLM 2.0.0 (q@1 against its pins of vLLM 1.0.0):" in err
    assert ("      toy.mod:g: default of 'b' changed: 1 -> 2 (breaking: the implementation reads 'b' "
            "(declared in params))") in err
    assert ("      write q@2 with `when: {vllm: '>=2.0.0'}` that fits the changes above (and give q@1 "
            "`when: {vllm: '<2.0.0'}`), then re-run pin") in err
    assert REMEDY.format("q") in err
    assert "wrote" not in out
    assert not (manifests / "vllm-2.0.0.yaml").exists()  # nothing half-decided is written


def test_a_new_required_patch_whose_target_is_missing_is_an_error(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f")])
    write_patches(patches, [patch_doc("n", "toy.mod:nothing_here", required=True)])
    # an existing manifest for the release stays as it was
    path = manifests / "vllm-2.0.0.yaml"
    path.write_text(yaml.safe_dump({"vllm": "2.0.0", "generated_by": "by hand",
                                    "patches": [{"patch": "p@1", "targets": {}}]}))
    before = path.read_text()
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests) == 1
    err = capsys.readouterr().err
    assert "  - n@1 (required) does not fit vLLM 2.0.0 (n@1, not pinned before):" in err
    assert "      toy.mod:nothing_here: target not found" in err
    assert REMEDY.format("n") in err
    assert path.read_text() == before


def test_not_applicable_by_hand_records_the_reason(tmp_path, capsys):
    """The person's decision is written; an optional patch is still marked not applicable automatically."""
    docs = [patch_doc("p", "toy.mod:f"), patch_doc("q", "toy.mod:g", required=True, **READS_B),
            patch_doc("o", "toy.mod:g", **READS_B)]
    a, patches, manifests = setup(tmp_path, docs)
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests, "--not-applicable", "q=upstream sets b=2 itself now") == 0
    out = capsys.readouterr().out
    assert "q: marked not applicable by hand" in out
    assert "o: not applicable on 2.0.0" in out
    path = manifests / "vllm-2.0.0.yaml"
    m = parse_manifest(path)
    assert [e.patch for e in m.patches] == ["p@1"]
    assert [(n.patch, n.reason) for n in m.not_applicable] == [
        ("o", "on vLLM 2.0.0, o@1 against its pins of vLLM 1.0.0: toy.mod:g: default of 'b' changed: 1 -> 2 "
              "(breaking: the implementation reads 'b' (declared in params))"),
        ("q", "by hand: upstream sets b=2 itself now"),
    ]
    load_manifests([manifests], load_patch_set([patches]))
    # re-pinning carries the reviewer's entry over as it is
    text = path.read_text()
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    assert path.read_text() == text


def test_not_applicable_by_hand_for_an_optional_patch_that_fits(tmp_path):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f"), patch_doc("q", "toy.mod:g", **READS_B)])
    assert pin_cli(a, "2.0.0", patches, manifests, "--not-applicable", "p=not needed with the new runner") == 0
    m = parse_manifest(manifests / "vllm-2.0.0.yaml")
    assert m.patches == []
    assert ("p", "by hand: not needed with the new runner") in [(n.patch, n.reason) for n in m.not_applicable]


def test_not_applicable_by_hand_must_name_a_patch_and_a_reason(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:f")])
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests, "--not-applicable", "zz=gone") == 2
    assert "vllm-patchkit pin: --not-applicable zz: no such patch id in the patch set (known: p)" in capsys.readouterr().err
    assert pin_cli(a, "2.0.0", patches, manifests, "--not-applicable", "p=  ") == 2
    assert "vllm-patchkit pin: --not-applicable p: empty reason" in capsys.readouterr().err
    assert pin_cli(a, "2.0.0", patches, manifests, "--not-applicable", "p") == 2
    assert "vllm-patchkit pin: --not-applicable 'p': expected ID=REASON" in capsys.readouterr().err
    assert not (manifests / "vllm-2.0.0.yaml").exists()


# -- the plan: carry forward, choose a version by when.vllm, dry run -------------------------------
def test_a_new_version_admitted_by_when_vllm_is_chosen_when_the_old_one_breaks(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("q", "toy.mod:g", required=True, **READS_B,
                                                       when={"vllm": "<2"})])
    write_patches(patches, [patch_doc("q", "toy.mod:g", version=2, required=True, **READS_B, when={"vllm": ">=2"})])
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    m = parse_manifest(manifests / "vllm-2.0.0.yaml")
    assert [(e.patch, e.targets["toy.mod:g"].signature) for e in m.patches] == [("q@2", "(a, b=2)")]
    assert "q: new in this manifest at q@2 (replaces q@1 of vLLM 1.0.0)" in capsys.readouterr().out
    # 1.0.0 keeps q@1 (q@2 does not admit it)
    assert [e.patch for e in parse_manifest(manifests / "vllm-1.0.0.yaml").patches] == ["q@1"]


def test_no_version_admitting_the_release_is_not_applicable_with_the_ranges(tmp_path):
    # an optional patch (a required one is never marked by pin on its own: tests/contracts/test_contradictions.py)
    a, patches, manifests = setup(tmp_path, [patch_doc("q", "toy.mod:g", required=False, when={"vllm": "<2"})])
    assert pin_cli(a, "2.0.0", patches, manifests) == 0
    [na] = parse_manifest(manifests / "vllm-2.0.0.yaml").not_applicable
    assert (na.patch, na.reason) == ("q", "no version admits vLLM 2.0.0 (q@1: <2)")


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("p", "toy.mod:g"), patch_doc("q", "toy.mod:g", **READS_B)])
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "vllm-patchkit pin --dry-run: vLLM 2.0.0" in out and "nothing written" in out
    assert "  list      p@1 (1 pin(s))" in out
    assert "  n/a       q: on vLLM 2.0.0, q@1 against its pins of vLLM 1.0.0:" in out
    assert "note: p: carried forward at p@1 from vLLM 1.0.0: 1 compatible change(s)" in out
    assert not (manifests / "vllm-2.0.0.yaml").exists()


def test_dry_run_exits_one_when_a_required_patch_breaks(tmp_path, capsys):
    a, patches, manifests = setup(tmp_path, [patch_doc("q", "toy.mod:g", required=True, **READS_B)])
    capsys.readouterr()
    assert pin_cli(a, "2.0.0", patches, manifests, "--dry-run") == 1
    assert "q@1 (required) does not fit vLLM 2.0.0" in capsys.readouterr().err
    assert not (manifests / "vllm-2.0.0.yaml").exists()

"""A manifest and the patches it lists must not contradict each other (issue 21, item 6).

Before: a manifest listing a required patch whose own `when.vllm` excludes that manifest's release passed
`check` (ok) and the loader (which judges `when` first: the patch was skipped as not needed, and status
exited 0); `pin` wrote `not_applicable` for a required patch on its own when no version's `when.vllm` admitted
the release; and `check` then said "a model that needs it is refused at start-up", which is not what the loader
does with it (it skips it). Now the contradiction fails `check`, `pin` and the loader's manifest validation,
each naming the manifest file and entry and the patch file and its `when.vllm`; `pin` writes `not_applicable`
for a required patch only when a reviewer says so; and check's words say what the loader really does.
"""

from __future__ import annotations

import pytest
import yaml

from vllm_patchkit.tools.cli import main
from vllm_patchkit.declaration.declare import load_patch_set, parse_manifest
from vllm_patchkit.declaration.errors import PatchSetErrors, RequiredPatchUnavailable

from .helpers import patch_doc, write_patches, write_tree

TREE = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(a, b=1):\n    pass\n"}
PIN_F = {"toy.mod:f": {"kind": "function", "signature": "(a)"}}


def _manifest(folder, version, entries, not_applicable=()):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"vllm-{version}.yaml"
    doc = {"vllm": version, "generated_by": "test", "patches": entries}
    if not_applicable:
        doc["not_applicable"] = list(not_applicable)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cli(verb, tree, version, patches, manifests, *extra):
    return main([verb, "--source", str(tree), "--vllm", version, "--patch-dir", str(patches),
                 "--manifest-dir", str(manifests), *extra])


def _listed_but_excluded(tmp_path, required=True):
    tree = write_tree(tmp_path / "tree", TREE)
    patches = write_patches(tmp_path / "patches", [
        patch_doc("fine", "toy.mod:g"),
        patch_doc("q", "toy.mod:f", required=required, when={"vllm": "<2"})])
    manifest = _manifest(tmp_path / "manifests", "2.0.0", [
        {"patch": "fine@1", "targets": {"toy.mod:g": {"kind": "function", "signature": "(a, b=1)"}}},
        {"patch": "q@1", "targets": PIN_F}])
    return tree, patches, manifest


def test_check_fails_a_manifest_listing_a_required_patch_its_when_excludes(tmp_path, capsys):
    tree, patches, manifest = _listed_but_excluded(tmp_path)
    assert _cli("check", tree, "2.0.0", patches, manifest.parent) == 1
    out = capsys.readouterr().out
    assert (f"manifest and patch contradict each other: {manifest}: patches[1] (patch: q@1): lists required patch "
            f"q@1, whose own when.vllm '<2' ({patches / 'q-1.yaml'}) excludes vLLM 2.0.0: the loader would judge it "
            "not needed on this release and skip it") in out, out
    assert "BROKEN    q@1" in out


def test_an_optional_patch_listed_so_is_not_this_error(tmp_path, capsys):
    tree, patches, manifest = _listed_but_excluded(tmp_path, required=False)
    assert _cli("check", tree, "2.0.0", patches, manifest.parent) == 0
    assert "contradict" not in capsys.readouterr().out


def test_pin_refuses_it_naming_both_places(tmp_path, capsys):
    tree, patches, manifest = _listed_but_excluded(tmp_path)
    before = manifest.read_text()
    assert _cli("pin", tree, "2.0.0", patches, manifest.parent) == 2
    err = capsys.readouterr().err
    assert f"{manifest}: patches[1] (patch: q@1): lists required patch q@1" in err, err
    assert f"({patches / 'q-1.yaml'}) excludes vLLM 2.0.0" in err
    assert manifest.read_text() == before  # nothing written


def test_the_loaders_manifest_validation_refuses_it(tmp_path):
    """With the real loader and vLLM target: before, the patch was `skipped` / `precondition` and start-up went
    on (status exit 0)."""
    from vllm_patchkit.runtime.loader import Loader, installed_vllm_version
    from vllm_patchkit.declaration.manifest import load_manifests

    from ..framework.helpers import live_pin, patch_doc as core_doc, write_patch

    kv = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    version = installed_vllm_version()
    pdir = tmp_path / "patches"
    write_patch(pdir, "kv", core_doc(id="kv", kind="wrap", target=kv, processes=["frontend"], required=True,
                                     when={"vllm": f">{version}"}))
    write_patch(pdir, "other", core_doc(id="other", kind="wrap", target=kv, processes=["frontend"]))
    manifest = _manifest(tmp_path / "manifests", version, [{"patch": "other@1", "targets": {kv: live_pin(kv)}},
                                                           {"patch": "kv@1", "targets": {kv: live_pin(kv)}}])
    ps = load_patch_set([pdir])
    ms = load_manifests([tmp_path / "manifests"], ps)
    with pytest.raises(PatchSetErrors) as ei:
        Loader(ps, ms, role="frontend", vllm_version=version, status_dir=tmp_path / "status")
    [e] = ei.value.errors
    assert (e.file, e.field) == (str(manifest), "patches[1] (patch: kv@1)"), (e.file, e.field)
    assert e.problem.startswith(f"lists required patch kv@1, whose own when.vllm '>{version}' "
                                f"({pdir / 'kv.yaml'}) excludes vLLM {version}")


def test_an_entry_of_another_sets_manifest_is_named_in_its_own_file(tmp_path):
    """Manifests of one release are merged across the sets' folders: the entry is named in the file that holds
    it, at its index there (not the merged list's)."""
    from vllm_patchkit.declaration.contradictions import find
    from vllm_patchkit.declaration.manifest import load_manifests

    patches = write_patches(tmp_path / "patches", [patch_doc("fine", "toy.mod:g"),
                                                   patch_doc("q", "toy.mod:f", required=True, when={"vllm": "<2"})])
    main_dir, plugin_dir = tmp_path / "main", tmp_path / "plugin"
    _manifest(main_dir, "2.0.0", [{"patch": "fine@1", "targets": {"toy.mod:g": {"kind": "function",
                                                                                "signature": "(a, b=1)"}}}])
    plugin = _manifest(plugin_dir, "2.0.0", [{"patch": "q@1", "targets": PIN_F}])
    ps = load_patch_set([patches])
    ms = load_manifests([main_dir, plugin_dir], ps)
    [c] = find(ps, ms, folders=[main_dir, plugin_dir])
    assert (c.manifest_file, c.field) == (str(plugin), "patches[0] (patch: q@1)")
    [c] = find(ps, ms)  # the other file cannot be found: said so, never a merged index
    assert c.field == "an entry of a manifest for vLLM 2.0.0 merged with this one (patch: q@1)"


def test_pin_never_marks_a_required_patch_not_applicable_on_its_own(tmp_path, capsys):
    """No version's when.vllm admits the release: before, pin wrote `not_applicable` by itself."""
    tree = write_tree(tmp_path / "tree", TREE)
    patches = write_patches(tmp_path / "patches", [patch_doc("q", "toy.mod:f", required=True, when={"vllm": "<2"})])
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    capsys.readouterr()
    assert _cli("pin", tree, "2.0.0", patches, manifests) == 1
    err = capsys.readouterr().err
    assert "q@1 (required) does not fit vLLM 2.0.0 (no version's when.vllm admits vLLM 2.0.0 (q@1: <2))" in err, err
    assert "--not-applicable q='reason'" in err
    assert not (manifests / "vllm-2.0.0.yaml").exists()
    # the reviewer's decision is the only way
    assert _cli("pin", tree, "2.0.0", patches, manifests, "--not-applicable", "q=fixed upstream in 2.0") == 0
    [na] = parse_manifest(manifests / "vllm-2.0.0.yaml").not_applicable
    assert (na.patch, na.reason) == ("q", "by hand: fixed upstream in 2.0")


@pytest.mark.parametrize("when, words", [
    ({"vllm": "<2"}, "and no version's when.vllm admits the release, so the loader judges it not needed here and "
                     "skips it (`skipped` / `precondition`): a model that needs it starts WITHOUT it"),
    (None, "a model that needs it is refused at start-up (`refused` / `unavailable`, unless "
           "VLLM_PATCHKIT_ALLOW_UNPATCHED names it)"),
])
def test_required_not_applicable_says_what_the_loader_does(tmp_path, capsys, when, words):
    """A tool-written `not_applicable` for a required patch: check's words follow the loader (read below)."""
    tree = write_tree(tmp_path / "tree", TREE)
    extra = {"when": when} if when else {}
    patches = write_patches(tmp_path / "patches", [patch_doc("q", "toy.mod:f", required=True, **extra)])
    manifests = tmp_path / "manifests"
    _manifest(manifests, "2.0.0", [], [{"patch": "q", "reason": "target changed"}])
    assert _cli("check", tree, "2.0.0", patches, manifests) == 1
    out = capsys.readouterr().out
    assert ("required patch q@1 is marked not applicable on this release (target changed): " + words) in out, out


@pytest.mark.parametrize("excluded", [True, False], ids=["when-excludes", "when-admits"])
def test_the_loader_does_what_check_says(tmp_path, excluded):
    """The two behaviours check's words describe, on the real loader: skipped silently, or refused."""
    from vllm_patchkit.runtime.loader import Loader, installed_vllm_version
    from vllm_patchkit.declaration.manifest import load_manifests

    from ..framework.helpers import patch_doc as core_doc, write_patch

    kv = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    version = installed_vllm_version()
    pdir = tmp_path / "patches"
    when = {"vllm": f">{version}"} if excluded else {}
    write_patch(pdir, "kv", core_doc(id="kv", kind="wrap", target=kv, processes=["frontend"], required=True,
                                     when=when))
    _manifest(tmp_path / "manifests", version, [], [{"patch": "kv", "reason": "target changed"}])
    ps = load_patch_set([pdir])
    loader = Loader(ps, load_manifests([tmp_path / "manifests"], ps), role="frontend", vllm_version=version,
                    status_dir=tmp_path / "status")
    if excluded:
        loader.run_import_stage()
        rec = loader.records["kv"]
        assert (rec.state, rec.code, rec.warning) == ("skipped", "precondition", None)
    else:
        with pytest.raises(RequiredPatchUnavailable):
            loader.run_import_stage()
        assert (loader.records["kv"].state, loader.records["kv"].code) == ("refused", "unavailable")
    loader.unpatch()

"""`vllm-patchkit check`: output formats and exit codes (synthetic releases)."""

from __future__ import annotations

import json

from vllm_patchkit.tools.cli import main

from .helpers import patch_doc, write_tree

BEFORE = {"toy/mod.py": "def f(a, query_start_loc=None):\n    pass\n\ndef g(x):\n    pass\n"}
AFTER = {"toy/mod.py": "def f(a, query_start_loc):\n    pass\n\ndef g(x):\n    pass\n"}
# reads-loc reads query_start_loc, which changes: breaking for it (a verbatim passthrough would survive it)
PATCHES = [patch_doc("fine", "toy.mod:g"),
           patch_doc("reads-loc", "toy.mod:f", implementation="toy_impl:wrapper", params=["query_start_loc"])]
PASSTHROUGH = [patch_doc("fine", "toy.mod:g"), patch_doc("pass-through", "toy.mod:f")]


def test_text(scenario, capsys):
    s = scenario(BEFORE, AFTER, PATCHES)
    assert main(["check", *s.cli()]) == 1
    out = capsys.readouterr().out
    assert "  ok        fine@1 (pins of vLLM 1.0.0)" in out
    assert "  BROKEN    reads-loc@1 (pins of vLLM 1.0.0)" in out
    assert ("- [parameter_now_required] toy.mod:f: parameter 'query_start_loc' is now required "
            "(its default None was removed)") in out
    assert "(breaking: the implementation reads 'query_start_loc' (declared in params))" in out
    assert out.rstrip().endswith("1 ok, 0 compatible, 0 stale, 1 broken, 0 unpinned, 0 not applicable, 0 retirable "
                                 "on vLLM 2.0.0")


def test_a_change_a_passthrough_survives_is_carried_exit_zero(scenario, capsys):
    s = scenario(BEFORE, AFTER, PASSTHROUGH)
    assert main(["check", *s.cli()]) == 0
    out = capsys.readouterr().out
    assert "  carry     pass-through@1 (pins of vLLM 1.0.0)" in out
    assert "(compatible: verbatim passthrough: args and kwargs reach upstream untouched)" in out
    # and pin carries it forward, with the new pin
    assert main(["pin", *s.cli()]) == 0
    assert "pass-through: carried forward at pass-through@1 from vLLM 1.0.0" in capsys.readouterr().out
    assert main(["check", *s.cli()]) == 0
    assert "  ok        pass-through@1 (pins of vLLM 2.0.0)" in capsys.readouterr().out


def test_json(scenario, capsys):
    s = scenario(BEFORE, AFTER, PATCHES)
    assert main(["check", *s.cli("--format", "json")]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm"] == "2.0.0" and doc["ok"] is False
    assert doc["counts"]["broken"] == 1
    broken = next(p for p in doc["patches"] if p["status"] == "broken")
    [b] = broken["breakages"]
    assert b == {"kind": "parameter_now_required", "patch": "reads-loc@1", "target": "toy.mod:f",
                 "parameter": "query_start_loc", "old": "None", "new": None,
                 "explain": "toy.mod:f: parameter 'query_start_loc' is now required (its default None was removed)",
                 "breaking": True, "compat": "the implementation reads 'query_start_loc' (declared in params)"}


def test_github_annotations(scenario, capsys):
    s = scenario(BEFORE, AFTER, PATCHES)
    assert main(["check", *s.cli("--format", "github")]) == 1
    lines = capsys.readouterr().out.splitlines()
    [err] = [line for line in lines if line.startswith("::error")]
    assert "title=reads-loc@1 breaks on vLLM 2.0.0 (parameter_now_required)::" in err
    assert "file=" in err and "reads-loc-1.yaml" in err  # points at the patch file
    assert err.endswith("::toy.mod:f: parameter 'query_start_loc' is now required (its default None was removed)")


def test_ok_exits_zero(scenario, capsys):
    s = scenario(BEFORE, BEFORE, PATCHES)
    assert main(["check", *s.cli()]) == 0
    assert "2 ok, 0 compatible, 0 stale, 0 broken" in capsys.readouterr().out


def test_the_release_own_manifest_is_used_when_there_is_one(scenario, capsys):
    """Pinned from 2.0.0 itself: everything fits; the broken patch shows as not applicable there."""
    s = scenario(BEFORE, AFTER, PATCHES)
    assert main(["pin", *s.cli()]) == 0
    capsys.readouterr()
    assert main(["check", *s.cli()]) == 0
    out = capsys.readouterr().out
    assert ("n/a       reads-loc@1: on vLLM 2.0.0, reads-loc@1 against its pins of vLLM 1.0.0: toy.mod:f: parameter "
            "'query_start_loc' is now required") in out
    # --baseline asks the upgrade question again, against 1.0.0's pins
    assert main(["check", *s.cli("--baseline", "1.0.0")]) == 1


def test_unreadable_source_exits_two(tmp_path, capsys):
    assert main(["check", "--source", str(tmp_path / "nope.whl")]) == 2
    assert "no such wheel or source folder" in capsys.readouterr().err


def test_version_not_installed_and_not_cached(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("VLLM_PATCHKIT_WHEEL_CACHE", str(tmp_path))
    assert main(["check", "--vllm", "9.9.9"]) == 2
    err = capsys.readouterr().err
    assert "vLLM 9.9.9 is not installed" in err and "pip download --no-deps --only-binary=:all:" in err and "vllm==9.9.9`" in err


def test_version_from_the_wheel_cache(monkeypatch, tmp_path, scenario, capsys):
    import zipfile

    s = scenario(BEFORE, AFTER, PATCHES)
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / "vllm-2.0.0-py3-none-any.whl", "w") as z:
        z.writestr("toy/__init__.py", "")
        z.writestr("toy/mod.py", AFTER["toy/mod.py"])
    monkeypatch.setenv("VLLM_PATCHKIT_WHEEL_CACHE", str(cache))
    assert main(["check", "--vllm", "2.0.0", "--patch-dir", str(s.patch_dir), "--manifest-dir", str(s.manifest_dir)]) == 1
    out = capsys.readouterr().out
    assert "(static, " in out and "vllm-2.0.0-py3-none-any.whl" in out and "parameter_now_required" in out


def test_package_folder_or_its_parent(tmp_path):
    from vllm_patchkit.tools.static import StaticRelease

    root = write_tree(tmp_path / "r", {"toy/mod.py": "def f(a):\n    pass\n"})
    for given in (root, root / "toy"):
        assert StaticRelease.open(given).lookup("toy.mod:f").signature == "(a)"


# -- folders named on the command line must exist and hold something (never "0 ok" about nothing) --
def _check_args(s, patch_dirs, manifest_dir):
    """(An empty manifest folder with no patch: what "0 ok, 0 broken" used to be reported for, exit 0.)"""
    args = ["check", "--source", str(s.after), "--vllm", "2.0.0"]
    for d in patch_dirs:
        args += ["--patch-dir", str(d)]
    return args + ["--manifest-dir", str(manifest_dir)]


def test_missing_patch_dir_exits_two_naming_it(scenario, capsys, tmp_path):
    s = scenario(BEFORE, AFTER, PATCHES)
    nope = tmp_path / "no" / "such"
    no_manifests = tmp_path / "no-manifests"
    no_manifests.mkdir()
    assert main(_check_args(s, [nope], no_manifests)) == 2
    out, err = capsys.readouterr()
    assert f"vllm-patchkit check: --patch-dir {nope}: no such folder (expected a folder of patch files, *.yaml)" in err
    assert "0 ok" not in out and out == ""


def test_missing_manifest_dir_exits_two_naming_it(scenario, capsys, tmp_path):
    s = scenario(BEFORE, AFTER, PATCHES)
    nope = tmp_path / "manifestz"
    assert main(_check_args(s, [s.patch_dir], nope)) == 2
    out, err = capsys.readouterr()
    assert (f"vllm-patchkit check: --manifest-dir {nope}: no such folder "
            "(expected a folder of manifests, vllm-VERSION.yaml)") in err
    assert out == ""


def test_patch_dir_without_patches_exits_two(scenario, capsys, tmp_path):
    s = scenario(BEFORE, AFTER, PATCHES)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("not a patch\n")
    no_manifests = tmp_path / "no-manifests"
    no_manifests.mkdir()
    assert main(_check_args(s, [empty], no_manifests)) == 2
    out, err = capsys.readouterr()
    assert f"vllm-patchkit check: --patch-dir {empty}: holds no patch (*.yaml with an id)" in err
    assert "0 ok" not in out
    # each folder given must hold a patch, even when another one does
    assert main(_check_args(s, [s.patch_dir, empty], s.manifest_dir)) == 2
    assert f"--patch-dir {empty}: holds no patch" in capsys.readouterr().err


def test_patch_dir_that_is_a_file_exits_two(scenario, capsys, tmp_path):
    s = scenario(BEFORE, AFTER, PATCHES)
    a_file = s.patch_dir / "fine-1.yaml"
    no_manifests = tmp_path / "no-manifests"
    no_manifests.mkdir()
    assert main(_check_args(s, [a_file], no_manifests)) == 2
    assert f"--patch-dir {a_file}: not a folder (expected a folder of patch files, *.yaml)" in capsys.readouterr().err

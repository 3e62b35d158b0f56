"""`vllm-patchkit check` over several releases (tools/matrix.py): the table, the worst exit code, the requirement
line. Synthetic releases are toy wheels in a wheel cache of the test's own (read exactly as vLLM wheels are)."""

from __future__ import annotations

import json
import zipfile

import pytest
import yaml

from vllm_patchkit.tools.cli import main

from .helpers import patch_doc, release, write_patches, write_tree
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.tools.manifest_files import write
from vllm_patchkit.tools.pin import pin_release

FGH = "def f(a):\n    pass\n\ndef g(x):\n    pass\n\ndef h(y):\n    pass\n"
RELEASES = {
    "1.0.0": FGH,
    "2.0.0": "def f(a):\n    pass\n\ndef h(y):\n    pass\n",   # g gone: the required patch on it breaks
    "3.0.0": "def f(a):\n    pass\n\ndef g(x):\n    pass\n",   # h gone: only the optional patch breaks
}
PATCHES = [patch_doc("needs-g", "toy.mod:g", required=True),
           patch_doc("opt-h", "toy.mod:h"),
           patch_doc("fix-f", "toy.mod:f", required=True, retire_when={"vllm": ">=3"})]


def _wheel(cache, version, source):
    with zipfile.ZipFile(cache / f"vllm-{version}-py3-none-any.whl", "w") as z:
        z.writestr("toy/__init__.py", "")
        z.writestr("toy/mod.py", source)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Wheels 1.0.0, 2.0.0, 3.0.0 in a cache; the set pinned on 1.0.0 (its only manifest)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for v, src in RELEASES.items():
        _wheel(cache, v, src)
    monkeypatch.setenv("VLLM_PATCHKIT_WHEEL_CACHE", str(cache))
    pdir = write_patches(tmp_path / "patches", PATCHES)
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    before = write_tree(tmp_path / "before", {"toy/mod.py": FGH})
    pinned = pin_release(release(before, "1.0.0"), load_patch_set([pdir]), {}, generated_by="test")
    write(pinned.manifest, mdir)

    class Toy:
        patch_dir, manifest_dir, wheels = pdir, mdir, cache

        def args(self, selection, *extra):
            return ["check", "--vllm", selection, "--patch-dir", str(pdir), "--manifest-dir", str(mdir), *extra]
    return Toy()


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows: patch -> [required, cell per release] (cells are single words here)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("patch "))
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("cells:"):
            break
        words = line.split()
        rows[words[0]] = words[1:]
    return rows


def test_table_exit_code_and_requirement_line_with_a_hole(toy, capsys):
    assert main(toy.args("1.0.0,2.0.0,3.0.0")) == 1  # the worst release's code
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "vllm-patchkit check: 3 releases (1.0.0, 2.0.0, 3.0.0)"
    assert out.splitlines()[1].split() == ["patch", "required", "1.0.0", "2.0.0", "3.0.0"]
    rows = _rows(out)
    assert rows["needs-g"] == ["yes", "ok", "BROKEN", "ok"]
    assert rows["opt-h"] == ["no", "ok", "ok", "BROKEN"]
    assert rows["fix-f"] == ["yes", "ok", "ok", "ok", "+retirable"]
    assert "requirement (pyproject.toml): vllm>=1.0.0,<=3.0.0,!=2.0.*" in out
    assert "  not supported: 2.0.0 (needs-g@1 broken)" in out
    assert "  excluded: !=2.0.* (examined, not supported: 2.0.0)" in out
    assert "note: 3.0.0 supported without optional opt-h@1" in out
    # each release's own findings, as single-release check explains them
    assert "- [target_removed] toy.mod:g: target not found" in out


def test_matrix_cells_are_the_single_release_verdicts(toy, capsys):
    assert main(toy.args("1.0.0,2.0.0,3.0.0", "--format", "json")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["releases"] == ["1.0.0", "2.0.0", "3.0.0"] and doc["exit_code"] == 1 and doc["ok"] is False
    for rel in doc["releases"]:
        assert main(toy.args(rel, "--format", "json")) == (0 if rel == "1.0.0" else 1)
        alone = json.loads(capsys.readouterr().out)
        assert doc["reports"][rel] == alone
        for p in alone["patches"]:
            row = next(r for r in doc["matrix"] if r["patch"] == p["patch"].split("@")[0])
            assert row["cells"][rel]["status"] == p["status"]
            assert row["cells"][rel]["retirable"] == p["retirable"]
    assert doc["requirement"]["line"] == "vllm>=1.0.0,<=3.0.0,!=2.0.*"
    assert doc["requirement"]["supported"] == ["1.0.0", "3.0.0"]
    assert doc["blockers"] == {"2.0.0": ["needs-g@1 broken"]}


def test_a_range_selects_the_known_releases_inside_it(toy, capsys):
    assert main(toy.args(">=1.0,<3", "--format", "json")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["releases"] == ["1.0.0", "2.0.0"]  # 3.0.0 is outside; the installed vLLM (0.31.0) too
    assert doc["requirement"]["line"] == "vllm==1.0.0"


def test_all_includes_every_wheel_of_the_cache(toy, capsys):
    main(toy.args("all", "--format", "json"))
    doc = json.loads(capsys.readouterr().out)
    assert {"1.0.0", "2.0.0", "3.0.0"} <= set(doc["releases"])


def test_every_release_fine_exits_zero(toy, capsys):
    assert main(toy.args("1.0.0,3.0.0")) == 1  # opt-h breaks on 3.0.0: the exit code still says so
    capsys.readouterr()
    _wheel(toy.wheels, "1.1.0", FGH)
    assert main(toy.args("1.0.0,1.1.0")) == 0
    out = capsys.readouterr().out
    assert "requirement (pyproject.toml): vllm>=1.0.0,<=1.1.0" in out
    assert "1.1.0 has no manifest of its own" in out  # supported on older pins: it must be pinned to ship


def test_required_patch_marked_not_applicable_by_a_tool_is_not_supported(toy, capsys):
    """A release's own manifest marks a required patch not applicable (pin's mark, not a reviewer's): the cell
    reads n/a, and the release is still not supported: the loader refuses a model that needs it there."""
    _wheel(toy.wheels, "4.0.0", FGH)
    (toy.manifest_dir / "vllm-4.0.0.yaml").write_text(yaml.safe_dump({
        "vllm": "4.0.0", "generated_by": "test",
        "patches": [{"patch": p, "targets": {t: {"kind": "function", "signature": s}}}
                    for p, t, s in (("opt-h@1", "toy.mod:h", "(y)"), ("fix-f@1", "toy.mod:f", "(a)"))],
        "not_applicable": [{"patch": "needs-g", "reason": "needs-g@1 was pinned on 1.0.0; on 4.0.0 it differs"}]}))
    assert main(toy.args("1.0.0,4.0.0")) == 1
    out = capsys.readouterr().out
    assert _rows(out)["needs-g"] == ["yes", "ok", "n/a"]
    assert "requirement (pyproject.toml): vllm==1.0.0" in out
    assert "not supported: 4.0.0 (needs-g@1 not_applicable but refused (required_not_applicable))" in out


def test_no_release_supported(toy, capsys):
    assert main(toy.args("2.0.0,2", "--format", "json")) == 1  # a list may name one release twice
    doc = json.loads(capsys.readouterr().out)
    assert doc["releases"] == ["2.0.0"] and doc["requirement"]["line"] is None
    assert main(toy.args("2.0.0,", "--format", "github")) == 2  # an empty item is no version
    assert "'' is not a release version" in capsys.readouterr().err


def test_a_release_that_cannot_be_read_exits_two_naming_it(toy, capsys):
    assert main(toy.args("1.0.0,9.9.9")) == 2
    out, err = capsys.readouterr()
    assert out == "" and "9.9.9: vLLM 9.9.9 is not installed" in err and "pip download --no-deps --only-binary=:all:" in err


def test_a_range_that_selects_nothing_and_a_bad_range(toy, capsys):
    assert main(toy.args(">=7")) == 2
    assert "--vllm '>=7' selects no known release (known: " in capsys.readouterr().err
    assert main(toy.args(">=1,<<2")) == 2
    assert "not a PEP 440 range" in capsys.readouterr().err


def test_source_and_live_read_one_release(toy, capsys):
    assert main(toy.args("1.0.0,2.0.0", "--source", str(toy.wheels))) == 2
    assert "--source reads one release" in capsys.readouterr().err
    assert main(toy.args("1.0.0,2.0.0", "--live")) == 2
    assert "--live reads one release" in capsys.readouterr().err


def test_github_format_ends_with_the_requirement_notice(toy, capsys):
    main(toy.args("1.0.0,2.0.0,3.0.0", "--format", "github"))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("::error ") and "needs-g@1 breaks on vLLM 2.0.0" in line for line in lines)
    assert lines[-1] == "::notice title=vLLM requirement line::vllm>=1.0.0,<=3.0.0,!=2.0.* (supported: 1.0.0, 3.0.0)"


def test_a_result_for_a_patch_the_set_does_not_hold_is_never_read_as_supported(toy):
    """Whether it is required cannot be told: the release is not supported (fail closed, not open)."""
    from vllm_patchkit.tools.matrix import Matrix
    from vllm_patchkit.tools.report import PatchResult, Report

    ps = load_patch_set([toy.patch_dir])
    m = Matrix(["1.0.0"], {"1.0.0": Report("1.0.0", "test", [PatchResult("ghost@1", "ok")])}, ps, {})
    assert m.blockers("1.0.0") == ["ghost@1 is not in the patch set"]
    assert m.supported() == [] and m.requirement().line is None

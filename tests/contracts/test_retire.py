"""Retirement: `check` lists the patches a release makes unnecessary, by specifier or by probe."""

from __future__ import annotations

import sys

import pytest

from vllm_patchkit.tools.render import render_github, render_text
from vllm_patchkit.upstream.findings import BreakageKind

from .helpers import patch_doc

TREE = {"toy/mod.py": "def f(a):\n    pass\n"}
FIXED = {**TREE, "toy/fixed.py": "UPSTREAM_FIX = True\n"}

PROBES = '''
def has_fix(root):
    return (root / "toy" / "fixed.py").is_file()

def says_why(root):
    return "toy/fixed.py ships the upstream fix" if (root / "toy" / "fixed.py").is_file() else False

def broken(root):
    raise RuntimeError("probe bug")
'''


@pytest.fixture
def probes(tmp_path, monkeypatch):
    folder = tmp_path / "probe_pkg"
    folder.mkdir()
    (folder / "toy_probes.py").write_text(PROBES)
    monkeypatch.syspath_prepend(str(folder))
    yield "toy_probes"
    sys.modules.pop("toy_probes", None)


@pytest.mark.parametrize("spec, retirable", [(">=2", True), ("==2.0.0", True), (">=3", False), ("<2", False)])
def test_retire_when_vllm_specifier(scenario, spec, retirable):
    s = scenario(TREE, TREE, [patch_doc("p", "toy.mod:f", retire_when={"vllm": spec})])
    res = s.check().results[0]
    assert res.status == "ok"
    assert (res.retire == f"retire_when.vllm '{spec}' contains 2.0.0") if retirable else res.retire is None


def test_retire_when_probe_reads_the_release_source(scenario, probes):
    s = scenario(TREE, FIXED, [patch_doc("p", "toy.mod:f", retire_when={"probe": f"{probes}:has_fix"}),
                               patch_doc("q", "toy.mod:f", retire_when={"probe": f"{probes}:says_why"})])
    report = s.check()
    p, q = report.results
    assert p.retire == f"probe {probes}:has_fix detects the upstream fix"
    assert q.retire == "toy/fixed.py ships the upstream fix"
    assert report.exit_code() == 0  # retirable is news, not a failure
    assert "retirable: toy/fixed.py ships the upstream fix" in render_text(report)
    assert "::notice" in render_github(report) and "can be retired on vLLM 2.0.0" in render_github(report)


def test_probe_false_on_a_release_without_the_fix(scenario, probes):
    s = scenario(TREE, TREE, [patch_doc("p", "toy.mod:f", retire_when={"probe": f"{probes}:has_fix"})])
    assert s.check().results[0].retire is None


def test_probe_on_a_wheel(tmp_path, scenario, probes):
    """Probes get a pathlib-like root for wheels too (zipfile.Path)."""
    import zipfile

    from vllm_patchkit.tools.check import check
    from vllm_patchkit.tools.releases import StaticView
    from vllm_patchkit.tools.static import StaticRelease
    from vllm_patchkit.upstream.static_source import open_source

    s = scenario(TREE, FIXED, [patch_doc("p", "toy.mod:f", retire_when={"probe": f"{probes}:has_fix"})])
    wheel = tmp_path / "toy-2.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in s.after.rglob("*.py"):
            z.write(path, path.relative_to(s.after).as_posix())
    rel = StaticView(StaticRelease(open_source(wheel)))
    assert rel.version() == "2.0.0"  # from the wheel's file name
    assert check(rel, s.patch_set, {"1.0.0": s.pinned.manifest}).results[0].retire


def test_a_failing_probe_is_a_finding(scenario, probes):
    s = scenario(TREE, TREE, [patch_doc("p", "toy.mod:f", retire_when={"probe": f"{probes}:broken"})])
    report = s.check()
    [b] = report.breakages
    assert b.kind is BreakageKind.probe_error and "RuntimeError: probe bug" in b.explain()
    assert report.results[0].status == "broken" and report.exit_code() == 1

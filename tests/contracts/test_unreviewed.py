"""Adoption that cannot lie (issue 31, item 3): an unreviewed draft (`draft: true`), a `TODO…` placeholder and
an implementation that only raises are refused by name by `pin` and `check` (exit 1, naming the file and the
field), and the loader refuses the marker; pin never marks a draft not applicable on its own; check's text folds
a compatible finding repeated per copy into one line, heads only breakages "breakages", and `--format json`
carries a `source_changed` diff whole. Releases are toy trees read statically (helpers.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import PatchSetErrors
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.tools import baseline
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.pin import RequiredPatchesDoNotFit, pin_release
from vllm_patchkit.tools.render import render_text
from vllm_patchkit.tools.report import PatchResult, Report
from vllm_patchkit.upstream.findings import Breakage, BreakageKind

from .helpers import Scenario, patch_doc, release, write_patches, write_tree

TREE = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(x):\n    pass\n\nclass C:\n    pass\n"}


def _args(verb, root, pdir, mdir, *extra):
    return [verb, "--source", str(root), "--vllm", "1.0.0", "--patch-dir", str(pdir), "--manifest-dir", str(mdir),
            *extra]


def _set(tmp_path, *docs):
    root = write_tree(tmp_path / "tree", TREE)
    pdir = write_patches(tmp_path / "patches", list(docs))
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    return root, pdir, mdir


def test_a_draft_left_unreviewed_fails_pin_and_check(tmp_path, capsys):
    root, pdir, mdir = _set(tmp_path, patch_doc("drafted", "toy.mod:f", draft=True), patch_doc("fine", "toy.mod:g"))
    file = pdir / "drafted-1.yaml"
    assert main(_args("pin", root, pdir, mdir)) == 1
    err = capsys.readouterr().err
    assert f"{file}: draft: drafted by `vllm-patchkit scan --write` and not reviewed" in err
    assert "delete the line `draft: true`" in err and "nothing written" in err
    assert not list(mdir.iterdir())
    assert main(_args("pin", root, pdir, mdir, "--dry-run")) == 1  # the plan is shown, the exit code is not 0
    out = capsys.readouterr()
    assert "list      drafted@1" in out.out and f"{file}: draft:" in out.err
    # reviewed: the line deleted, the set pins; put back, check fails naming it
    doc = yaml.safe_load(file.read_text())
    del doc["draft"]
    file.write_text(yaml.safe_dump(doc))
    assert main(_args("pin", root, pdir, mdir)) == 0
    doc["draft"] = True
    file.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(_args("check", root, pdir, mdir)) == 1
    out = capsys.readouterr().out
    assert "BROKEN    drafted@1" in out and "ok        fine@1" in out
    assert f"- [unreviewed] toy.mod:f: not reviewed: {file}: draft: drafted by" in out
    assert main(_args("check", root, pdir, mdir, "--format", "json")) == 1
    found = json.loads(capsys.readouterr().out)["breakages"]
    assert [(b["kind"], b["parameter"]) for b in found] == [("unreviewed", "draft")]


def test_the_loader_refuses_a_draft_naming_file_and_field(tmp_path):
    _, pdir, _ = _set(tmp_path, patch_doc("drafted", "toy.mod:f", draft=True))
    ps = load_patch_set([pdir])  # the file is valid: the marker is a decision still to make, not a typo
    with pytest.raises(PatchSetErrors) as exc:
        Loader(ps, {}, role="engine_core", vllm_version="1.0.0", write_records=False)
    assert str(pdir / "drafted-1.yaml") in str(exc.value) and ": draft: drafted by" in str(exc.value)


@pytest.mark.parametrize("field,doc", [
    ("value_from", patch_doc("p", "toy.mod:C", kind="set", value_from="TODO.module:PluginClass")),
    ("implementation", patch_doc("p", "toy.mod:f", kind="replace", implementation="TODO.module:impl")),
    ("why", patch_doc("p", "toy.mod:f", why="TODO: say what fails in vLLM without this patch")),
])
def test_placeholders_are_refused_by_name(tmp_path, capsys, field, doc):
    root, pdir, mdir = _set(tmp_path, doc)
    assert main(_args("pin", root, pdir, mdir)) == 1
    assert f"{pdir / 'p-1.yaml'}: {field}: placeholder 'TODO" in capsys.readouterr().err
    assert main(_args("check", root, pdir, mdir)) == 1
    assert f"not reviewed: {pdir / 'p-1.yaml'}: {field}: placeholder" in capsys.readouterr().out


def test_an_implementation_that_only_raises_is_refused(tmp_path, capsys, monkeypatch):
    impl = write_tree(tmp_path / "impl", {"stubs_only/impl.py": (
        "def replacement(*args, **kwargs):\n"
        "    \"\"\"Drafted by scan.\"\"\"\n"
        "    raise NotImplementedError('TODO: the replacement drafted from plugin.py:3')\n"
        "def working(a):\n    return a\n")})
    monkeypatch.syspath_prepend(str(impl))
    root, pdir, mdir = _set(tmp_path, patch_doc("stub", "toy.mod:f", kind="replace",
                                                 implementation="stubs_only.impl:replacement"),
                            patch_doc("real", "toy.mod:g", kind="replace", implementation="stubs_only.impl:working"))
    assert main(_args("pin", root, pdir, mdir)) == 1
    err = capsys.readouterr().err
    assert f"{pdir / 'stub-1.yaml'}: implementation: stubs_only.impl:replacement only raises (a stub)" in err
    assert "real-1.yaml" not in err
    assert main(_args("check", root, pdir, mdir)) == 1
    assert "[unreviewed] toy.mod:f: not reviewed:" in capsys.readouterr().out


def test_pin_never_marks_a_draft_not_applicable(tmp_path):
    """Even one a person left `required: false`: the draft's target is gone, and the plan refuses rather than
    writing `not applicable` (the old plan wrote it and exited 0)."""
    root, pdir, _ = _set(tmp_path, patch_doc("drafted", "toy.mod:gone", draft=True, required=False))
    ps = load_patch_set([pdir])
    with pytest.raises(RequiredPatchesDoNotFit) as exc:
        pin_release(release(root, "1.0.0"), ps, {}, generated_by="test", plan_only=True)
    assert "drafted@1" in str(exc.value) and "--not-applicable drafted=" in str(exc.value)
    pinned = pin_release(release(root, "1.0.0"), ps, {}, generated_by="test", plan_only=True,
                         not_applicable_by_hand={"drafted": "the plugin no longer does this"})
    assert [n.patch for n in pinned.manifest.not_applicable] == ["drafted"]


def test_a_compatible_finding_per_copy_is_one_line_and_no_breakages_heading():
    b = [Breakage(BreakageKind.optional_parameter_added, "p@1", t, parameter="b", new="b=None", breaking=False,
                  compat="a verbatim forwarder passes it on") for t in ("toy.mod:f", "toy.a:f", "toy.b:f", "toy.c:f")]
    text = render_text(Report("2.0.0", "toy", [PatchResult("p@1", "compatible", b, pins_from="1.0.0")]))
    assert "breakages" not in text
    lines = [x for x in text.splitlines() if "optional_parameter_added" in x]
    assert lines == ["  - [optional_parameter_added] 4 places: parameter 'b' added (b=None) — affects p@1 "
                     "(compatible: a verbatim forwarder passes it on) (toy.mod:f, toy.a:f, toy.b:f, and 1 more)"]


def test_a_source_changed_diff_is_whole_in_json(tmp_path, capsys, monkeypatch):
    before = "def f(a):\n" + "".join(f"    x{i} = a + {i}\n" for i in range(80)) + "    return a\n"
    after = "def f(a):\n" + "".join(f"    x{i} = a * {i}\n" for i in range(80)) + "    return a\n"
    sc = Scenario(tmp_path, {"toy/mod.py": before}, {"toy/mod.py": after},
                  [patch_doc("copy", "toy.mod:f", kind="wrap", reimplements=["toy.mod:f"])])
    # the pinned release's source, as check opens it for a real release (its wheel in the cache)
    monkeypatch.setitem(baseline._OPENED, "1.0.0", (release(sc.before, "1.0.0"), ""))
    assert main(["check", *sc.cli("--format", "json")]) == 1
    (found,) = [b for b in json.loads(capsys.readouterr().out)["breakages"] if b["kind"] == "source_changed"]
    diff = found["diff"].splitlines()
    assert "more diff line(s)" not in found["diff"]
    assert sum(1 for x in diff if x.startswith("-    x")) == 80 and sum(1 for x in diff if x.startswith("+    x")) == 80
    assert main(["check", *sc.cli()]) == 1
    assert "more diff line(s) (whole in --format json)" in capsys.readouterr().out

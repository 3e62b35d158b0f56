"""One module per kind: every kind declared (declaration/kinds.py) has its runtime module of the same name and
nothing else does; the loader runs a kind it has never heard of by name (`warn`, the worked example of
docs/writing-a-kind.md, added as one module and one row), and the example in the doc is the code that runs."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from vllm_patchkit.declaration.errors import PatchSetErrors
from vllm_patchkit.declaration.kinds import DECLARATIONS
from vllm_patchkit.runtime.kinds import all_kinds

from .helpers import make_loader, patch_doc

#: a comparison of a kind row's `call_shape`: which kind it is, asked by another name
CALL_SHAPE_COMPARISON = re.compile(r"\bcall_shape\)? *(==|!=|\bin\b|\bnot in\b)")

ROOT = Path(__file__).resolve().parents[2]
KINDS_DIR = ROOT / "src" / "vllm_patchkit" / "runtime" / "kinds"


def test_every_declared_kind_has_its_module_and_every_module_a_declaration():
    modules = {p.stem for p in KINDS_DIR.glob("*.py")} - {"__init__", "base"}
    kinds = all_kinds()
    assert modules == {d.name for d in DECLARATIONS} == set(kinds)
    assert all(kinds[name].name == name for name in kinds)


def _warn_loader(tmp_path, env):
    doc = patch_doc(id="slow-path", kind="warn", message="served on the slow path", processes=["frontend"],
                    when={"env": {"PK_SLOW": "1"}})
    return make_loader(tmp_path, {"slow_path": doc}, [{"patch": "slow-path@1", "targets": {}}])


def test_the_worked_example_kind_runs_through_the_loader(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PK_SLOW", "1")
    lo = _warn_loader(tmp_path, {})
    with caplog.at_level(logging.WARNING, logger="vllm.patchkit"):
        lo.run_import_stage()
    rec = lo.records["slow-path"]
    assert (rec.state, rec.warning, rec.detail.get("warned")) == ("applied", "served on the slow path",
                                                                 "served on the slow path")
    assert "slow-path@1: served on the slow path" in caplog.text
    lo.unpatch()


def test_the_worked_example_kind_is_skipped_in_its_own_words_when_its_condition_does_not_hold(tmp_path, monkeypatch):
    monkeypatch.delenv("PK_SLOW", raising=False)
    lo = _warn_loader(tmp_path, {})
    lo.run_import_stage()
    rec = lo.records["slow-path"]
    assert (rec.state, rec.code) == ("skipped", "precondition") and rec.reason.startswith("warning condition does not")
    assert rec.warning is None


def test_its_declarative_row_is_enforced_when_the_yaml_is_read(tmp_path):
    with pytest.raises(PatchSetErrors, match="kind 'warn' needs 'message'"):
        make_loader(tmp_path, {"w": patch_doc(id="w", kind="warn", processes=["frontend"])}, [])
    with pytest.raises(PatchSetErrors, match="'implementation' is only for kinds wrap, replace, subclass, hook, not 'warn'"):
        make_loader(tmp_path, {"w": patch_doc(id="w", kind="warn", message="m", processes=["frontend"],
                                              implementation="os:getcwd")}, [])


def test_the_doc_shows_the_code_that_runs():
    doc = (ROOT / "docs" / "writing-a-kind.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (KINDS_DIR / "warn.py").read_text() in blocks
    row = next(line for line in (ROOT / "src/vllm_patchkit/declaration/kinds.py").read_text().splitlines()
               if 'KindDeclaration("warn"' in line)
    assert any(row.strip() in b for b in blocks)


def test_no_layer_branches_on_which_kind_a_patch_is():
    """Issue 23: the loader, verify, apply, `check`, `pin` and reporting ask a kind's traits (its row, or its
    runtime module), never its identity; only the kinds' own code (their rows and modules) and the schema that
    defines the enum name a member. Fails on a `Kind.wrap`-style comparison, a tuple of kind names or a
    comparison of the row's `call_shape` (a kind's identity by another name: issue 32; the row's traits
    `wraps_original`, `stands_in`, `installs_function` say what is asked) anywhere else in the framework."""
    src = Path(__file__).resolve().parents[2] / "src" / "vllm_patchkit"
    names = "|".join(d.name for d in DECLARATIONS)
    member = re.compile(rf"\bKind\.({names})\b")
    named = re.compile(rf"kind(\.value)?\)? (==|!=|in|not in) \(?\"({names})\"")
    allowed = {src / "declaration" / "kinds.py", src / "declaration" / "schema.py"}
    found = []
    for path in sorted(src.rglob("*.py")):
        if path in allowed or (src / "runtime" / "kinds") in path.parents or (src / "tools" / "scan") in path.parents:
            continue  # tools/scan classifies a third-party plugin's code into the kinds it would declare
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if member.search(line) or named.search(line) or CALL_SHAPE_COMPARISON.search(line):
                found.append(f"{path.relative_to(src)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_call_shape_traits_and_their_guard():
    """The traits the layers ask instead of comparing `call_shape` (issue 32): one kind wraps the original, one
    stands in for it, the others install no function; the guard above catches the six comparisons it replaced."""
    rows = {d.name: d for d in DECLARATIONS}
    assert [n for n, d in rows.items() if d.wraps_original] == ["wrap"]
    assert [n for n, d in rows.items() if d.stands_in] == ["replace"] == [n for n, d in rows.items() if d.pins_source]
    assert {n for n, d in rows.items() if d.installs_function} == {"wrap", "replace"}
    for line in ('if traits(patch).call_shape == "wrap" and impl is not None:',
                 'if self.params and (row.call_shape != "wrap" or self.implementation is None):',
                 'elif traits(patch).call_shape in ("replace",):'):
        assert CALL_SHAPE_COMPARISON.search(line), line
    assert not CALL_SHAPE_COMPARISON.search("problems(sig, target_signature, shape=traits(patch).call_shape, name=name)")

"""`check` never says OK for a release on which a required patch is marked not applicable by a tool.

Issue 11: on vLLM 0.32.0 `batch-dispatch-override@1` (required) was marked not applicable by `pin`,
the stand-in V4 served without it, and `check` said OK. A reviewer's decision (`by hand: ...`,
written by `pin --not-applicable`) is reported but does not fail the check.
"""

from __future__ import annotations

import yaml

from vllm_patchkit.tools.cli import main

from .helpers import patch_doc, write_tree

TREE = {"toy/mod.py": "def f(a):\n    pass\n\ndef g(x):\n    pass\n"}


def _setup(tmp_path, reason, required=True):
    root = write_tree(tmp_path / "tree", TREE)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    for d in (patch_doc("needed", "toy.mod:f", required=required), patch_doc("fine", "toy.mod:g")):
        (pdir / f"{d['id']}.yaml").write_text(yaml.safe_dump(d))
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / "vllm-2.0.0.yaml").write_text(yaml.safe_dump({
        "vllm": "2.0.0", "generated_by": "test",
        "patches": [{"patch": "fine@1", "targets": {"toy.mod:g": {"kind": "function", "signature": "(x)"}}}],
        "not_applicable": [{"patch": "needed", "reason": reason}]}))
    return ["check", "--source", str(root), "--vllm", "2.0.0", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)]


def test_required_patch_marked_not_applicable_by_pin_fails_the_check(tmp_path, capsys):
    args = _setup(tmp_path, "needed@1 was pinned on vLLM 1.0.0; on 2.0.0: toy.mod:f: parameter 'b' added")
    assert main(args) == 1
    out = capsys.readouterr().out
    assert ("- [required_not_applicable] toy.mod:f: required patch needed@1 is marked not applicable on this "
            "release (needed@1 was pinned on vLLM 1.0.0; on 2.0.0: toy.mod:f: parameter 'b' added): a model that "
            "needs it is refused at start-up") in out


def test_reviewers_decision_and_optional_patches_do_not_fail_it(tmp_path, capsys):
    assert main(_setup(tmp_path / "a", "by hand: fixed upstream in 2.0.0")) == 0
    assert main(_setup(tmp_path / "b", "target changed", required=False)) == 0
    assert "required_not_applicable" not in capsys.readouterr().out

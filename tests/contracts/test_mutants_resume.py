"""`scripts/mutants.py --resume`: a long run stopped (a session's end, a timeout) goes on where it was. What is
kept must be what would be measured again: an outcome of a mutant no longer generated, or one whose oracle timed
out, is run again, never carried into the table."""

from __future__ import annotations

import json

from tests.scripts_module import load_script

mutants = load_script("mutants", "patchkit_mutants_resume")


def _outcome(kind: str, place: str, breaking, tests=("tests/patches/test_x.py",)) -> dict:
    return {"mutant": {"kind": kind, "aim": "breaking", "place": place, "description": "", "files": []},
            "patches": ["p@1"], "oracle": {"breaking": breaking, "tests": list(tests), "summary": "", "seconds": 1.0},
            "check": {"flagged": True, "exit": 1, "findings": [], "seconds": 1.0}}


def test_resume_keeps_only_judged_outcomes_of_mutants_still_generated(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"outcomes": [
        _outcome("rename-method", "m:C.a", True),
        _outcome("rename-method", "m:C.gone", True),        # no longer generated: dropped
        _outcome("reformat", "m:C.b", None),                # timed out: run again
        _outcome("new-method", "m:C", None, tests=()),      # no test of an affected patch: a verdict, kept
    ]}))
    generated = [mutants.Mutant("rename-method", "breaking", "m:C.a", ""),
                 mutants.Mutant("reformat", "harmless", "m:C.b", ""),
                 mutants.Mutant("new-method", "harmless", "m:C", "")]
    kept = mutants.kept_outcomes(path, generated)
    assert [(o.mutant["kind"], o.mutant["place"]) for o in kept] == [("rename-method", "m:C.a"), ("new-method", "m:C")]
    assert mutants.kept_outcomes(tmp_path / "none.json", generated) == []


def test_resume_needs_a_results_file():
    import pytest

    with pytest.raises(SystemExit, match="--resume needs --results"):
        mutants.main(["--resume"])


def test_only_selects_mutants_by_a_substring_of_their_name():
    """`--only SUBSTRING` (repeatable) keeps the mutants whose `kind:place` holds any of them, in their order; none
    given keeps all."""
    generated = [mutants.Mutant("tuple-arity", "breaking", "m:C.a", ""),
                 mutants.Mutant("rename-method", "breaking", "m:C.a", ""),
                 mutants.Mutant("tuple-arity", "breaking", "m:D.b", "")]
    assert [m.name for m in mutants.only(generated, ["tuple-arity:"])] == ["tuple-arity:m:C.a", "tuple-arity:m:D.b"]
    assert [m.name for m in mutants.only(generated, ["D.b", "rename-"])] == ["rename-method:m:C.a",
                                                                           "tuple-arity:m:D.b"]
    assert mutants.only(generated, None) == generated
    assert mutants.only(generated, ["no-such-kind:"]) == []  # main stops there: "no mutant's name holds ..."

"""Import / patch / unpatch permutations for every patch of the shipped sets, each in a fresh process.

The same harness any patch set gets from the pytest plugin (`patchkit_sets = NAME`), called
through its API (vllm_patchkit.tools.testing): the cases are made from the sets at collection time,
so a new patch (or a new process role of one) gets them with no test to write. What each case
checks: vllm_patchkit/tools/testing/lifecycle.py; how the processes are made: testing/runner.py.

On top, this repository's policy (lifecycle.py): a case failing only on a check listed in
KNOWN_BUGS is a strict xfail; the counters feed the reliability summary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_patchkit.tools.testing import STEPS, lifecycle_cases, run_lifecycle

from .conftest import COUNTS, OPS
from .lifecycle import KNOWN_BUGS, SETS, classify

REPO = Path(__file__).resolve().parents[2]
CASES = lifecycle_cases(SETS)


@pytest.fixture(scope="module")
def lifecycle_run(tmp_path_factory):
    return run_lifecycle(CASES, SETS, tmp_path_factory.mktemp("lifecycle"), env={"PYTHONPATH": str(REPO)},
                         overrides="tests.reliability.lifecycle:OVERRIDES")


def test_every_shipped_patch_has_cases():
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set

    ps = load_patch_set([s for s in installed_sources() if s.name in SETS])
    assert {c.patch for c in CASES} == {p.id for p in ps.patches.values()}


def test_runner_forks_from_clean_processes(lifecycle_run, capsys):
    """The import-after server forks before any target is imported, else the order would not be
    what it says; both fork with no thread running (a fork copies only the calling thread)."""
    run = lifecycle_run
    with capsys.disabled():
        print(f"\nlifecycle runner: {len(CASES)} cases in {run.seconds} s")
    assert run.runner["import-after"]["preloaded_targets"] == []
    assert set(run.runner["import-before"]["preloaded_targets"]) == set(run.watch)
    for order in ("import-after", "import-before"):
        assert run.group_problems(order) == [], run.runner[order]


MATCHED: set[str] = set()  # known bugs seen in this run
DONE: list[str] = []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_patch_lifecycle(case, lifecycle_run):
    r = lifecycle_run.results.get(case.id)
    assert r is not None, f"no result for {case.id}: {lifecycle_run.stderr[-3000:]}"
    DONE.append(case.id)
    checks = r["checks"]
    steps = [s for s in STEPS if any(c["step"] == s for c in checks)]
    unexpected, bugs = classify(checks)
    MATCHED.update(b.key for b in bugs)
    COUNTS["lifecycle"] += len(steps)
    OPS["lifecycle"][case.order] += len(steps)
    COUNTS["lifecycle:checks"] += len(checks)
    COUNTS["lifecycle:failures"] += len({c["step"] for c in unexpected})
    if bugs and not unexpected:
        COUNTS["lifecycle:known-bug cases"] += 1
    report = "\n".join(f"  [{c['step']}] {c['name']}: {c['detail']}" for c in unexpected)
    assert not unexpected, f"{case.id} ({r.get('seconds')} s):\n{report}\nnotes: {r.get('notes')}"
    if case.order == "import-after":
        assert not any(r["imported_before_loader"].values()), r["imported_before_loader"]
    if bugs:
        failed = [c for c in checks if not c["ok"]]
        pytest.xfail("; ".join(f"known bug {b.key}: {b.reason}" for b in bugs)
                     + " | first: " + f"[{failed[0]['step']}] {failed[0]['name']}")
    assert steps == list(STEPS), f"steps run: {steps}"


def test_known_bugs_still_reproduce():
    """Each KNOWN_BUGS entry must still explain some failure; a fixed bug's entry must go."""
    if len(DONE) < len(CASES):
        pytest.skip("not every lifecycle case ran in this session")
    stale = [b.key for b in KNOWN_BUGS if b.key not in MATCHED]
    assert not stale, f"known bugs no longer seen (fixed?): remove {stale} from tests/reliability/lifecycle.py"

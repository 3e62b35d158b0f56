"""This repository's additions to the framework's lifecycle harness (vllm_patchkit.tools.testing).

The permutations, the forked runner and the checks on restored originals live in the
framework, shared with every patch set (the pytest plugin's `patchkit_sets`). What stays
here is this repository's policy on top of them:

- SETS: the sets whose lifecycle this suite runs (the framework's hooks and the product set);
- KNOWN_BUGS: checks that fail because of a framework bug reported (not fixed) by the
  reliability suite. A case failing only on these is a strict xfail, and an entry that no
  longer matches anything fails (the bug was fixed: remove the entry);
- OVERRIDES: recipe adjustments for a precondition the harness cannot meet with a real config
  (imported by the harness's children through `overrides="tests.reliability.lifecycle:OVERRIDES"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SETS = ("core", "deepseek-v4")


@dataclass(frozen=True)
class KnownBug:
    key: str
    reason: str
    matches: Any  # check dict -> bool
    cascades: bool = False  # the patch never applies: every later check of the case fails with it


KNOWN_BUGS: list[KnownBug] = []  # late-copy: fixed (apply.Applied.undo restores declared copies imported after install)

# patch id -> function(recipe) adjusting what recipe_for derived, for a precondition it cannot meet
# (say so in recipe.notes; results carry the notes). Empty: every shipped patch's `when` is met by
# recipe_for, with a real config (runner v2 only as vLLM's live rule allows on a CPU, see there).
OVERRIDES: dict = {}


def classify(checks: list[dict]) -> tuple[list[dict], list[KnownBug]]:
    """(unexpected failures, known bugs behind the expected ones)."""
    failed = [c for c in checks if not c["ok"]]
    bugs: list[KnownBug] = []
    for bug in KNOWN_BUGS:
        if failed and bug.cascades and bug.matches(failed[0]):
            return [], [bug]
    unexpected = []
    for c in failed:
        bug = next((b for b in KNOWN_BUGS if b.matches(c)), None)
        if bug is None:
            unexpected.append(c)
        elif bug not in bugs:
            bugs.append(bug)
    return unexpected, bugs

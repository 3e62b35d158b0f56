"""Shared pieces of the reliability suite: the case counters and their summary, the valid corpus."""

from __future__ import annotations

import collections

import pytest

# Cases run per suite part, failures, and per-operator counts; printed at the end of the session.
COUNTS: collections.Counter = collections.Counter()
OPS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def pytest_terminal_summary(terminalreporter):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("vllm-patchkit reliability suite")
    for part, title in (("patch", "malformed patch files"), ("manifest", "malformed manifests"),
                        ("lifecycle", "lifecycle permutations (patch x import order x step)"),
                        ("fault", "fault injections")):
        if COUNTS[part]:
            tr.write_line(f"{title}: {COUNTS[part]} cases run, {COUNTS[part + ':failures']} failures")
            if OPS[part]:
                tr.write_line("    " + ", ".join(f"{op} {n}" for op, n in sorted(OPS[part].items())))


@pytest.fixture(scope="session")
def corpus():
    from .malformed import build_corpus

    return build_corpus()

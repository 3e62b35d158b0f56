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
            extra = ""
            if part == "lifecycle":
                extra = (f" ({COUNTS['lifecycle:checks']} checks; cases failing only on a known, reported "
                         f"framework bug: {COUNTS['lifecycle:known-bug cases']}, strict xfail)")
            tr.write_line(f"{title}: {COUNTS[part]} cases run, {COUNTS[part + ':failures']} failures{extra}")
            if OPS[part]:
                tr.write_line("    " + ", ".join(f"{op} {n}" for op, n in sorted(OPS[part].items())))


@pytest.fixture(scope="session")
def corpus():
    from .malformed import build_corpus

    return build_corpus()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item (the fault counter reads `rep_call`)."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "reliability: the reliability suite (tests/reliability); in the normal run, "
                                       "deselect with -m 'not reliability'")


def pytest_collection_modifyitems(config, items):
    here = str(__import__("pathlib").Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.reliability)

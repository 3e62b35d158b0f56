"""The registry run's list (tests/corpus/registry.yaml) is well-formed and holds at least 30 general plugins, with
every registry plugin the project already reads; and scripts/registry_run.py tells a crash from a refusal. No
network: nothing is downloaded here (the run itself is `python scripts/registry_run.py`, on demand)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from tests.corpus.catalogue import HERE, all_catalogues
from tests.scripts_module import load_script

LIST = HERE / "registry.yaml"
ROWS = yaml.safe_load(LIST.read_text(encoding="utf-8"))["plugins"]
ENTRY = re.compile(r"^[\w.-]+ = [A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")  # `name = module:attr` (entry_points.txt)
GENERAL = "vllm.general_plugins"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_row_is_well_formed():
    for row in ROWS:
        assert set(row) == {"name", "version", "entry_points", "found"}, row
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", row["name"]), row
        assert isinstance(row["version"], str) and str(Version(row["version"])) == row["version"], row
        assert isinstance(row["found"], str) and row["found"].strip(), row
        assert isinstance(row["entry_points"], dict), row
        for group, eps in row["entry_points"].items():
            assert group.startswith("vllm.") and eps and all(ENTRY.match(e) for e in eps), (row["name"], group, eps)
    names = [_norm(r["name"]) for r in ROWS]
    assert len(names) == len(set(names)), "a plugin is listed twice"


def test_at_least_thirty_general_plugins():
    assert sum(1 for r in ROWS if GENERAL in r["entry_points"]) >= 30


def test_the_projects_registry_plugins_are_listed_at_their_versions():
    listed = {_norm(r["name"]): r["version"] for r in ROWS}
    known = {}
    for cat in all_catalogues():
        if cat.source.startswith("pypi:"):
            name, _, version = cat.source.split(":", 1)[1].strip().partition("==")
            known[_norm(name)] = version.strip()
    data = Path(__file__).resolve().parents[1] / "data" / "scan_registry.yaml"
    for row in yaml.safe_load(data.read_text(encoding="utf-8"))["plugins"]:
        known[_norm(row["name"])] = str(row["version"])
    assert {n: listed.get(n) for n in known} == known


def test_a_found_file_of_the_repository_exists():
    root = HERE.parents[1]
    for row in ROWS:
        if row["found"].startswith("tests/"):
            assert (root / row["found"]).is_file(), row


@pytest.fixture(scope="module")
def run():
    return load_script("registry_run")


def test_a_raise_is_a_crash_and_a_refusal_is_not(run, monkeypatch):
    import vllm_patchkit.tools.cli as cli

    def raises(argv):
        raise KeyError("boom")

    monkeypatch.setattr(cli, "main", raises)
    with pytest.raises(run.Crash, match=r"scan: KeyError: 'boom'"):
        run.run_cli(["scan", "x"])

    def refuses(argv):
        print("vllm-patchkit pin: cannot pin vLLM 0.31.0: 1 required patch(es) do not fit it; nothing written",
              file=__import__("sys").stderr)
        return 1

    monkeypatch.setattr(cli, "main", refuses)
    assert run.run_cli(["pin"])[0] == 1


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File ...",
    "draft x not written (the schema rejects it): 1 validation error for Patch\nkind\n  Input should be ...",
    "  Input should be 'wrap' [type=literal_error, input_value='x', input_type=str]",
])
def test_raw_output_is_a_crash(run, monkeypatch, text):
    import vllm_patchkit.tools.cli as cli

    monkeypatch.setattr(cli, "main", lambda argv: print(text) or 0)
    with pytest.raises(run.Crash, match="raw output"):
        run.run_cli(["scan", "x"])


def test_the_table_totals_and_names_each_crash(run):
    rows = [run.Row("a", "1.0", files=3, sites=2, drafts=1, pin="1 drafts", resolved=0.5, seconds=1.0),
            run.Row("b", "2.0", files=4, sites=0, drafts=0, crash="reach: KeyError: 'x'"),
            run.Row("c", "3.0", unfetched="pip download c==3.0 failed")]
    text = run.render(rows)
    assert "crash: reach: KeyError: 'x'" in text and "not fetched: pip download c==3.0 failed" in text
    assert re.search(r"total: 2 plugins\s+7\s+2\s+1\s+0\s+50%.*1 crashed, 1 not fetched", text), text

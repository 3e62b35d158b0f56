"""Recall of the scan against the corpus catalogues (tests/corpus/*/catalogue.yaml): every catalogued place of
a plugin whose source can be had is found (same file within ±3 lines, or the same target), recall >= 0.90 per
plugin. Same function as scripts/scan_recall.py. ATOM (a GitHub source) is scanned only when $PATCHKIT_ATOM_SRC
names a checkout of ROCm/ATOM."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_patchkit.scan.recall import ATOM_ENV, read_catalogue, places_of, recall_of, source_of
from vllm_patchkit.scan.scanner import scan

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CATALOGUES = sorted(CORPUS.glob("*/catalogue.yaml"))


@pytest.mark.parametrize("path", CATALOGUES, ids=[p.parent.name for p in CATALOGUES])
def test_recall_per_plugin(path, upstream):
    cat = read_catalogue(path)
    places = places_of(cat)
    src, why = source_of(cat)
    if src is None:
        pytest.skip(f"{cat.get('plugin')}: source not available: {why}"
                    + (f" (set ${ATOM_ENV})" if "ATOM" in str(cat.get("source")) else ""))
    r = recall_of(str(cat.get("plugin")), places, scan(str(src), upstream=upstream))
    missed = [f"{p.id} {p.mechanism} {p.target} at {p.file}:{p.line}" for p in r.missed]
    assert r.recall >= 0.90, f"{r.plugin}: recall {r.recall:.2f} ({len(r.found)}/{len(places)}); missed: {missed}"


def test_corpus_has_catalogues():
    assert CATALOGUES, "no corpus catalogue to measure recall against"

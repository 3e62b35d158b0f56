"""Recall of the scan against the corpus catalogues (tests/corpus/*/catalogue.yaml): every catalogued place of
a plugin whose source can be had is found (same file within ±3 lines, or the same target), recall >= 0.90 per
plugin. Same function as scripts/scan_recall.py. ATOM (a GitHub source) is scanned only when $PATCHKIT_ATOM_SRC
names a folder holding its atom/plugin/vllm/ (a checkout, or the files assembled at the versions the catalogue was
read from: tests/data/atom_scan_recall.yaml records that figure, 97 of the 107 places whose files it holds)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.tools.scan.recall import ATOM_ENV, read_catalogue, places_of, recall_of, source_of
from vllm_patchkit.tools.scan.scanner import scan

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CATALOGUES = sorted(CORPUS.glob("*/catalogue.yaml"))


# Plugins catalogued on 2026-12-04 whose scan recall is below the goal, as measured then (a ratchet both ways: a
# recall that moves fails, so the figure here and in README stays the measured one). What scan misses: subclasses
# reached by a returned dotted path and a wrap that takes the original through `__dict__` on a class found in the MRO
# (amass-kv, held out), writes into live scheduler objects and calls on them (thaw-vllm, in the tuning split since its
# model-loader registration is found by the `register`-word rule, issue 31), overrides in subclasses of subscripted
# bases and a version guard (meralion2, held out), a variable set only while the plugin's imports run (mixinputs,
# held out: drawn to replace thaw-vllm, measured the day it was catalogued). raif-vllm and vllm-canon left it (issue
# 31: names a plugin helper returns as a tuple, `A, B = helper()`; a vLLM function named for registering,
# `direct_register_custom_op`).
BELOW_GOAL = {"amass-kv": (5, 7), "thaw-vllm": (4, 7), "vllm_plugin_meralion2": (6, 9), "mixinputs": (3, 4)}


@pytest.mark.parametrize("path", CATALOGUES, ids=[p.parent.name for p in CATALOGUES])
def test_recall_per_plugin(path, upstream):
    cat = read_catalogue(path)
    places = places_of(cat)
    if path.parent.name == "atom":
        places = [p for p in places if p.id not in _atom_not_measured()]
    src, why = source_of(cat)
    if src is None:
        pytest.skip(f"{cat.get('plugin')}: source not available: {why}"
                    + (f" (set ${ATOM_ENV})" if "ATOM" in str(cat.get("source")) else ""))
    r = recall_of(str(cat.get("plugin")), places, scan(str(src), upstream=upstream))
    missed = [f"{p.id} {p.mechanism} {p.target} at {p.file}:{p.line}" for p in r.missed]
    if r.plugin in BELOW_GOAL:
        assert (len(r.found), len(places)) == BELOW_GOAL[r.plugin], (
            f"{r.plugin}: recall now {len(r.found)}/{len(places)}, recorded {BELOW_GOAL[r.plugin]}: update BELOW_GOAL "
            f"(and README); missed: {missed}")
        return
    assert r.recall >= 0.90, f"{r.plugin}: recall {r.recall:.2f} ({len(r.found)}/{len(places)}); missed: {missed}"


def test_corpus_has_catalogues():
    assert CATALOGUES, "no corpus catalogue to measure recall against"


# -- ROCm/ATOM: the figure recorded in tests/data/atom_scan_recall.yaml ------------------------------------------
ATOM_RECORD = Path(__file__).resolve().parents[1] / "data" / "atom_scan_recall.yaml"


def _atom_not_measured() -> set[str]:
    """Catalogue places whose ATOM file versions the recorded folder lacks: left out of the figure, said why."""
    rec = yaml.safe_load(ATOM_RECORD.read_text(encoding="utf-8"))
    return {u["id"] for u in rec.get("not_measured") or []}


def test_atom_record_is_consistent():
    """The record's own figures agree, and its unfound places are places of the catalogue (runs without ATOM)."""
    rec = yaml.safe_load(ATOM_RECORD.read_text(encoding="utf-8"))
    cat_ids = {p.id for p in places_of(read_catalogue(CORPUS / "atom" / "catalogue.yaml"))}
    skipped = rec.get("not_measured") or []
    assert all(u["reason"] for u in skipped) and {u["id"] for u in skipped} <= cat_ids
    assert not {u["id"] for u in skipped} & {u["id"] for u in rec["unfound"]}
    assert rec["places"] + len(skipped) == len(cat_ids)
    assert rec["found"] + len(rec["unfound"]) == rec["places"]
    assert rec["recall"] == round(rec["found"] / rec["places"], 2) and rec["recall"] >= 0.90
    assert {u["id"] for u in rec["unfound"]} <= cat_ids and all(u["reason"] for u in rec["unfound"])
    assert all(f["path"].startswith("atom/plugin/vllm/") and len(f["sha256"]) == 64 for f in rec["files"])


def test_atom_recall_matches_record(upstream):
    """With $PATCHKIT_ATOM_SRC naming the assembled folder: recall >= 0.90, and exactly the recorded figure."""
    src = os.environ.get(ATOM_ENV)
    if not src:
        pytest.skip(f"set ${ATOM_ENV} to a folder holding ROCm/ATOM's atom/plugin/vllm/*.py at the versions "
                    f"{ATOM_RECORD.relative_to(ATOM_RECORD.parents[2])} lists under `files` (read them through the "
                    "code index or a git snapshot of ROCm/ATOM; its header says how), then rerun")
    rec = yaml.safe_load(ATOM_RECORD.read_text(encoding="utf-8"))
    root = Path(src)  # the folder that holds atom/plugin/vllm/ (as a checkout of the repository does)
    differ = []
    for f in rec["files"]:
        p = root / f["path"]
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != f["sha256"]:
            differ.append(f["path"])
    places = [p for p in places_of(read_catalogue(CORPUS / "atom" / "catalogue.yaml"))
              if p.id not in _atom_not_measured()]
    r = recall_of("ROCm/ATOM", places, scan(str(src), upstream=upstream))
    missed = sorted(p.id for p in r.missed)
    note = f" (files missing or not at the recorded versions: {differ})" if differ else ""
    assert r.recall >= 0.90, f"recall {r.recall:.2f} ({len(r.found)}/{len(places)}); missed {missed}{note}"
    assert (len(places), len(r.found)) == (rec["places"], rec["found"]), (
        f"found {len(r.found)} of {len(places)}, recorded {rec['found']} of {rec['places']}; missed {missed}{note}")
    assert missed == sorted(u["id"] for u in rec["unfound"]), note

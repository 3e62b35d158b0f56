"""ROCm/ATOM's corpus catalogue (tests/corpus/atom/catalogue.yaml): the ground truth for vLLM 0.32.0 and 0.33.0.

Checked here, all statically (vLLM is never imported):
- the catalogue validates structurally with the corpus models (tests/corpus/catalogue.py): both truths on every
  place with a non-empty reason, a declaration or a reason why none, `reimplements` on every copied body;
- every declaration builds a real `Patch` (boilerplate filled here);
- every target, and every place a declaration pins, exists in the installed 0.31.0 source;
- it lists the same places as tests/data/atom_patch_sites.yaml, from which it is derived (same order, same
  declarability), with stable ids: rising in file order, a removed place's id never reused (gaps are allowed);
- its figures (breaks per release, copied bodies) are the ones its header states;
- with the 0.32.0 / 0.33.0 wheels in the wheel cache: every truth that says "identical" has the same signature and
  source digest on both sides, and every target a release no longer has (not even through a base) breaks there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.tools.releases import cached_wheel, installed_root
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.static_source import DirSource
from vllm_patchkit.declaration.validation import validate

from tests.corpus.catalogue import RELEASES, Catalogue

HERE = Path(__file__).resolve().parent
CATALOGUE = HERE / "atom" / "catalogue.yaml"
SITES = HERE.parent / "data" / "atom_patch_sites.yaml"

# the figures the catalogue's header states
PLACES, DECLARED = 114, 101
BREAKS = {"0.32.0": 4, "0.33.0": 15}
# places ATOM no longer patches (issue 31: gone from the newest files): removed with their ids, which stay unused
REMOVED = {"atom-037", "atom-086"}
COPIED = ["atom-031", "atom-032", "atom-033", "atom-047", "atom-049", "atom-050", "atom-054", "atom-059", "atom-060",
          "atom-077", "atom-093"]


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CATALOGUE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def catalogue(raw) -> Catalogue:
    return Catalogue.model_validate({**raw, "folder": "atom"})


@pytest.fixture(scope="module")
def release() -> StaticRelease:
    root = installed_root()
    if root is None:
        pytest.skip("vLLM is not installed")
    rel = StaticRelease(DirSource(root))
    if (rel.version() or "").split("+")[0] != "0.31.0":
        pytest.skip(f"ATOM's places are named at vLLM 0.31.0; installed is {rel.version()}")
    return rel


def _patch(place) -> Patch:
    d = place.declaration.model_dump(exclude_defaults=True)
    return validate(Patch, {
        "id": f"atom-{place.id}", "version": 1, "summary": place.what[:200], "why": place.what,
        "upstream": "none: third-party plugin", "retire_when": {"manual": "when ATOM no longer patches this place"},
        "processes": ["engine_core"], "required": True, **d}, strict=False)


def test_structure(catalogue):
    assert len(catalogue.places) == PLACES
    for place in catalogue.places:
        assert set(place.truth) == set(RELEASES), place.id
        for r in RELEASES:
            assert place.truth[r].reason.strip(), (place.id, r)
        assert (place.declaration is None) == bool(place.not_declarable), place.id
        if place.copies_body and place.declaration is not None:
            assert place.declaration.reimplements, place.id


def test_declarations_build_patches(catalogue):
    patches = [_patch(p) for p in catalogue.places if p.declaration is not None]
    assert len(patches) == DECLARED
    copied = {p.id: p for p in catalogue.places if p.copies_body}
    for pid, place in copied.items():
        assert _patch(place).reimplements, pid


def _exists(release: StaticRelease, spec: str) -> bool:
    r = release.resolve(spec)
    return not isinstance(r, Missing) or bool(r.inherited_from)


def test_targets_exist_at_0_31_0(catalogue, release):
    absent = []
    for place in catalogue.places:
        specs = [place.target]
        if place.declaration is not None:
            specs += [s for s in _patch(place).pinned_specs if s not in specs]
        absent += [f"{place.id}: {s}" for s in specs if not _exists(release, s)]
    assert not absent, absent


def test_same_places_as_the_site_list(catalogue, release):
    sites = yaml.safe_load(SITES.read_text(encoding="utf-8"))["sites"]
    assert len(sites) == len(catalogue.places)
    ids = [p.id for p in catalogue.places]
    wrong = [f"{i}: expected an id atom-NNN" for i in ids if not re.fullmatch(r"atom-\d{3}", i)]
    wrong += [f"{i}: the id of a removed place, never reused" for i in ids if i in REMOVED]
    if not wrong and ids != sorted(set(ids)):
        wrong.append(f"ids must rise in file order, each once: {ids}")
    for site, place in zip(sites, catalogue.places):
        named = release.resolve(site["target"])
        definer = site["target"] if isinstance(named, Missing) else named.where
        if place.target not in (site["target"], definer) and not site["target"].startswith(place.target + "."):
            wrong.append(f"{place.id}: target {place.target} is not {site['target']} (or where it is defined)")
        declarable = site["declarable"] and site["exists_in_0_31"]
        if (place.declaration is not None) != declarable:
            wrong.append(f"{place.id}: declared {place.declaration is not None}, the site list says {declarable}")
    assert not wrong, "\n".join(wrong)


def test_figures(catalogue):
    for r, n in BREAKS.items():
        assert sum(p.truth[r].breaks for p in catalogue.places) == n, r
    assert [p.id for p in catalogue.places if p.copies_body] == COPIED


@pytest.mark.parametrize("version", RELEASES)
def test_truth_agrees_with_the_wheel(catalogue, release, version):
    wheel = cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no vLLM {version} wheel in the wheel cache (scripts/fetch_wheels.sh {version})")
    other = StaticRelease.open(wheel)
    wrong = []
    for place in catalogue.places:
        truth = place.truth[version]
        before, after = release.lookup(place.target, True), other.lookup(place.target, True)
        if truth.reason.startswith("identical"):
            if isinstance(after, Missing) or isinstance(before, Missing) or (after.signature, after.source_digest) != (
                    before.signature, before.source_digest):
                wrong.append(f"{place.id}: says identical, but {place.target} differs on {version}")
        if isinstance(after, Missing) and not after.inherited_from and not isinstance(before, Missing) \
                and not truth.breaks:
            wrong.append(f"{place.id}: {place.target} is gone on {version} ({after.reason}) but breaks is false")
    assert not wrong, "\n".join(wrong)

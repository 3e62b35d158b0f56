"""One reading, one verdict (issue 20 item 4): for every declaration of the corpus (tests/corpus/: four
registry plugins and ROCm/ATOM) and of the shipped patch sets, the loader's verdict at start-up (`verify`, what
it runs before installing anything: applied, or the refusal) equals `check`'s on the installed release, and the
by-value copies the loader's stale search finds are among those `check` finds statically.

The loader reads live objects in this process; places in another platform's modules (vllm.platforms.rocm,
...) cannot be imported here at all (their import kills the process on some CPUs: test_live_isolation.py), so
they are judged by `check` only and counted in the skip note.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_patchkit.tools.examine import examine
from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.patchsets import discover
from vllm_patchkit.tools.pin_plan import settle_inherited
from vllm_patchkit.tools.releases import installed_static, installed_version
from vllm_patchkit.declaration.vocabulary import Kind
from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.runtime.verify import stale_copies, verify
from vllm_patchkit.declaration.validation import validate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)) if str(ROOT) not in sys.path else None
OTHER_PLATFORMS = ("vllm.platforms.rocm", "vllm.platforms.cuda", "vllm.platforms.xpu", "vllm.platforms.tpu",
                   "vllm._C", "vllm._rocm_C")
#: a loader refusal code -> the check breakage kinds that say the same
SAME = {"kind": {"misdeclared"}, "target": {"misdeclared", "target_removed", "target_moved", "target_inherited"},
        "convention": {"convention_mismatch"}, "fingerprint": None, "uses": None, "copy": {"copy_differs", "copy_gone"},
        "conflict": set(), "unpinned": {"unpinned"}}


def _declarations():
    from tests.corpus.catalogue import all_catalogues

    release = installed_static()
    out = []
    for cat in all_catalogues():
        for place in cat.places:
            if place.declaration is not None:
                patch = cat.patch(place)
                found, _ = examine(release, patch, None)
                found, _ = settle_inherited(release, patch, found)
                out.append((patch, {s: f for s, f in found.items() if isinstance(f, Fingerprint)}))
    sources = discover(None)
    ps = load_patch_set(sources)
    manifests = load_manifests(manifest_dirs(sources), ps)
    m = next((lm.manifest for v, lm in manifests.items() if v == installed_version()), None)
    for entry in (m.patches if m else []):
        out.append((ps.patches[entry.patch], dict(entry.targets)))
    return release, out


@pytest.fixture(scope="module")
def judged():
    release, decls = _declarations()
    rows, skipped = [], []
    for patch, pins in decls:
        if any(s.startswith(OTHER_PLATFORMS) for s in patch.pinned_specs):
            skipped.append(patch.key)
            continue
        _, found = examine(release, patch, pins, release)
        said = sorted({b.kind.value for b in found if b.breaking and b.kind.value != "copy_undeclared"})
        if patch.kind is Kind.env_default or patch.kind is Kind.refuse or patch.target is None:
            live = "ok"
        else:
            v = verify(patch, ManifestEntry(patch=patch.key, targets=pins))
            live = v.code if isinstance(v, Finding) else "ok"
            reason = v.reason if isinstance(v, Finding) else ""
        rows.append((patch, live, reason if live != "ok" else "", said, found))
    return release, rows, skipped


def test_the_loader_and_check_give_one_verdict(judged):
    _, rows, skipped = judged
    assert len(rows) >= 100, len(rows)
    differ = []
    for patch, live, reason, said, _ in rows:
        if (live == "ok") != (said == []):
            differ.append((patch.key, live, reason[:160], said))
        elif live != "ok" and SAME.get(live) and not set(said) & SAME[live]:
            differ.append((patch.key, live, reason[:160], said))
    assert differ == [], differ
    print(f"{len(rows)} declarations judged alike; {len(skipped)} on other platforms' modules judged by check only")


def test_misdeclared_places_get_the_same_words(judged):
    """Where both refuse a declaration as misdeclared, the loader's reason is check's explanation."""
    _, rows, _ = judged
    for patch, live, reason, said, found in rows:
        if live in ("kind", "target") and "misdeclared" in said:
            detail = next(b.detail for b in found if b.kind.value == "misdeclared")
            assert detail in reason or reason in detail, (patch.key, reason, detail)


def test_every_by_value_copy_the_loader_finds_check_finds(judged):
    """The loader's stale search over this process's modules (vLLM's engine, runner, scheduler are imported by
    now) finds no holder of a target that the static reading of the release does not."""
    from vllm_patchkit.upstream.targets import function_of
    from vllm_patchkit.upstream.targets import TargetError, resolve

    release, rows, _ = judged
    originals, static = {}, {}
    for patch, live, _, _, _ in rows:
        if patch.kind not in (Kind.wrap, Kind.replace) or "." in patch.target.partition(":")[2] or live != "ok":
            continue
        try:
            fn = function_of(resolve(patch.target, import_module=False).get_raw())
        except TargetError:
            continue
        originals[id(fn)] = (patch.key, {patch.target, *patch.copies})
        static[patch.key] = set(release.holders(patch.target)) | set(patch.copies)
    assert originals
    found = stale_copies(originals)
    missed = {k: [w for w in where if w.startswith("vllm") and w not in static[k]] for k, where in found.items()}
    assert not any(missed.values()), missed


def _misdeclared(spec: str):
    from vllm_patchkit.declaration.schema import Patch

    release = installed_static()
    patch = validate(Patch, {"id": "misdeclared", "version": 1, "summary": "s", "why": "w", "upstream": "none: t",
                                  "retire_when": {"manual": "t"}, "kind": "wrap", "target": spec,
                                  "processes": ["engine_core"], "required": True})
    found, _ = examine(release, patch, None)
    _, judged = examine(release, patch, dict(found), release)
    v = verify(patch, ManifestEntry(patch=patch.key, targets=dict(found)))
    return [b for b in judged if b.breaking], v


def test_a_name_imported_by_value_is_refused_by_check_and_the_loader_alike():
    """EngineCore's module imports get_kv_cache_configs by value; declared there as the target, the loader said
    "was replaced by another object with the same signature" (untrue) and check said ok (issue 20)."""
    [b], v = _misdeclared("vllm.v1.engine.core:get_kv_cache_configs")
    assert b.kind.value == "misdeclared" and "by value" in b.detail and "declare the target as vllm.v1.core." in b.detail
    assert isinstance(v, Finding) and v.code == "target" and v.reason == b.detail
    assert "replaced by another object" not in v.reason


def test_a_wrap_of_a_class_is_refused_by_check_and_the_loader_alike():
    [b], v = _misdeclared("vllm.v1.core.block_pool:BlockPool")
    assert b.kind.value == "misdeclared" and "is a class" in b.detail
    assert isinstance(v, Finding) and v.code == "kind" and v.reason == b.detail

"""How much of a real plugin's vLLM patching the schema expresses, measured, not asserted.

tests/data/atom_patch_sites.yaml lists every place AMD's ATOM plugin (ROCm/ATOM, atom/plugin/vllm)
patches in vLLM 0.31.0, with a `summary:` of the figures. Here every figure is worked out again:
each declarable place is declared with the real schema (`Patch.model_validate` on a minimal document
built as `helpers.patch_doc` builds one), each existing target is resolved against the installed vLLM
and fingerprinted as `vllm-patchkit pin` does (`fingerprint.live` plus the decorator layers), and
each pinned patch is checked by `verify.verify` against a manifest entry holding those pins. The
counts must equal the summary's; a place that changes state on another vLLM, or an entry edited
without its summary, fails here. Imports vLLM modules, loads no model.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from vllm_patchkit import fingerprint as fp
from vllm_patchkit.schema import Kind, ManifestEntry, Patch
from vllm_patchkit.targets import TargetError, resolve
from vllm_patchkit.verify import Finding, verify

from .helpers import patch_doc

DATA = Path(__file__).resolve().parent.parent / "data" / "atom_patch_sites.yaml"

MISSING_KINDS = {"instance_method", "config_subclass", "registry", "property", "set_object", "custom_op",
                 "when_condition", "config_override"}
SCHEMA_KINDS = {k.value for k in Kind}


@pytest.fixture(scope="module")
def data():
    doc = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    return doc["summary"], doc["sites"]


def _primary_index(sites: list[dict]) -> dict[int, list[int]]:
    """Index of each declarable non-copy entry -> indexes of the copy entries declared with it."""
    by_key = {(e["atom_file"], e["atom_function"], e["target"]): i
              for i, e in enumerate(sites) if e["mechanism"] != "copy"}
    groups: dict[int, list[int]] = {}
    for j, e in enumerate(sites):
        if e["mechanism"] == "copy":
            groups.setdefault(by_key[(e["atom_file"], e["atom_function"], e["copy_of"])], []).append(j)
    return groups


def _pin(spec: str, with_digest: bool):
    place = resolve(spec)
    raw = place.get_raw()
    f = fp.live(raw, place.owner_is_class, with_digest=with_digest, with_value=True)
    layers = fp.wrapper_layers(raw)
    return f.model_copy(update={"wrappers": layers}) if layers else f


def _install_standins() -> None:
    """Stand-ins for ATOM's Scheduler subclasses (not importable here), named by the `declare:` blocks of the
    kind subclass entries: each overrides the base method with the base's signature and calls up, so `verify`
    judges the declaration (import, subclass, override defined, signature) as it would ATOM's class."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class AtomSchedulerStandIn(Scheduler):
        def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens,
                                                 evict_blocks=True):
            return super()._update_requests_with_invalid_blocks(requests, invalid_block_ids, num_scheduled_tokens,
                                                                evict_blocks)

    class PrefixCapMixin:  # ATOM's V4.1 class takes its override from a mixin
        def _get_local_prefix_cache_hit(self, request):
            return super()._get_local_prefix_cache_hit(request)

    class AtomV41SchedulerStandIn(PrefixCapMixin, Scheduler):
        pass

    for cls in (AtomSchedulerStandIn, AtomV41SchedulerStandIn):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls


ATOM_PINS = "0.31.0"  # the vLLM release the ATOM plugin (and so this list) is written against


@pytest.fixture(scope="module")
def measured(data):
    """Per entry: exists / declared / pinned / checked, each computed here, plus why not."""
    import vllm
    from packaging.version import Version

    if Version(vllm.__version__).base_version != ATOM_PINS:
        pytest.skip(f"ATOM's plugin patches vLLM {ATOM_PINS}; the figures are measured on that release "
                    f"(installed: {vllm.__version__})")
    _, sites = data
    _install_standins()
    copies = _primary_index(sites)
    out = [{"exists": False, "declared": False, "pinned": False, "checked": False, "why": ""} for _ in sites]
    for e, r in zip(sites, out):
        try:
            resolve(e["target"])
            r["exists"] = True
        except TargetError as exc:
            r["why"] = str(exc)
    for i, e in enumerate(sites):
        if not e["declarable"] or e["mechanism"] == "copy":
            continue
        members = [i] + copies.get(i, [])
        extra = {k: v for k, v in (e.get("declare") or {}).items() if k != "copies"}
        target = extra.pop("target", e["target"])  # kind subclass: the base class, the entry's place overridden
        doc = patch_doc(f"atom-site-{i:03d}", target, kind=e["mechanism"],
                        copies=[sites[j]["target"] for j in members[1:]], **extra)
        patch = Patch.model_validate(doc)  # a declarable entry that does not validate is a test failure
        for j in members:
            out[j]["declared"] = True
        for j in members:
            out[j]["pinned"] = out[j]["exists"]
        if not out[i]["pinned"]:
            continue
        pins = {}  # every place the declaration pins (a subclass: its base and each overridden method)
        for spec in patch.pinned_specs:
            try:
                pins[spec] = _pin(spec, patch.kind is Kind.replace)
            except TargetError:
                pass  # a copy that does not exist here: verify judges the declaration without it
        found = verify(patch, ManifestEntry(patch=patch.key, targets=pins))
        for j in members:
            if out[j]["pinned"]:
                out[j]["checked"] = not isinstance(found, Finding)
                out[j]["why"] = "" if out[j]["checked"] else f"{found.code}: {found.reason}"
    return out


def test_entries_are_well_formed(data):
    _, sites = data
    bad = []
    for e in sites:
        where = f"{e['target']} ({e['atom_function']})"
        if e["declarable"] != (e["missing_kind"] is None):
            bad.append(f"{where}: declarable must be true exactly when missing_kind is null")
        if e["missing_kind"] is not None and e["missing_kind"] not in MISSING_KINDS:
            bad.append(f"{where}: unknown missing_kind {e['missing_kind']!r}")
        if e["declarable"] and e["mechanism"] not in SCHEMA_KINDS | {"copy"}:
            bad.append(f"{where}: declarable, but mechanism {e['mechanism']!r} is no schema kind")
        if (e["mechanism"] == "copy") != ("copy_of" in e):
            bad.append(f"{where}: copy entries (and only they) name copy_of")
        if not e["atom_file"].startswith("atom/plugin/vllm/") or not e["note"]:
            bad.append(f"{where}: atom_file under atom/plugin/vllm/ and a note are required")
    assert not bad, "\n".join(bad)
    _primary_index(sites)  # every copy has its declared target entry (KeyError otherwise)


def test_exists_matches_the_installed_vllm(data, measured):
    _, sites = data
    wrong = [f"{e['target']}: data says {e['exists_in_0_31']}, resolve says {r['exists']} {r['why']}"
             for e, r in zip(sites, measured) if e["exists_in_0_31"] != r["exists"]]
    assert not wrong, "\n".join(wrong)


def test_every_declarable_place_is_declared(data, measured):
    _, sites = data
    undeclared = [e["target"] for e, r in zip(sites, measured) if e["declarable"] and not r["declared"]]
    assert not undeclared


def test_summary_equals_the_measured_figures(data, measured):
    summary, sites = data
    computed = {
        "places": len(sites),
        "distinct_targets": len({e["target"] for e in sites}),
        "exists": sum(r["exists"] for r in measured),
        "declarable": sum(r["declared"] for r in measured),
        "pinnable": sum(r["pinned"] for r in measured),
        "checked": sum(r["checked"] for r in measured),
        "missing_kinds": dict(Counter(e["missing_kind"] for e in sites if e["missing_kind"])),
    }
    not_checked = [f"{e['target']}: {r['why']}" for e, r in zip(sites, measured) if r["pinned"] and not r["checked"]]
    assert {**summary, "missing_kinds": dict(summary["missing_kinds"])} == computed, \
        "pinned but not checked:\n" + "\n".join(not_checked)

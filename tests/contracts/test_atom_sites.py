"""How much of a real plugin's vLLM patching the schema expresses, measured, not asserted.

tests/data/atom_patch_sites.yaml lists every place AMD's ATOM plugin (ROCm/ATOM, atom/plugin/vllm)
patches in vLLM 0.31.0, with a `summary:` of the figures. Here every figure is worked out again by
scripts/atom_sites_report.py (the one implementation; its docstring states each rule): each declarable
place is declared with the real schema (`Patch.model_validate`), each target is found and fingerprinted
in the installed vLLM source **read statically** (`vllm_patchkit.tools.static.StaticRelease`), and each pinned
patch is judged by the loader's rules read from the source. The counts must equal the summary's; a place
that changes state on another vLLM, or an entry edited without its summary, fails here.

tests/corpus/atom/catalogue.yaml is derived from the same data file (one corpus place per entry, with the
truth for vLLM 0.32.0 and 0.33.0); tests/corpus/test_atom_truth.py checks that both list the same places.

Never imports vLLM: two targets live in vllm.platforms.rocm, whose import kills a CPU-build process
(tests/contracts/test_platform_isolation.py runs the same code under an aborting import guard).
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

from vllm_patchkit.declaration.vocabulary import Kind

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "atom_sites_report.py"

MISSING_KINDS = {"instance_method", "config_subclass", "registry", "property", "set_object", "custom_op",
                 "when_condition", "config_override", "hook_method"}
SCHEMA_KINDS = {k.value for k in Kind}
FOREIGN = ("vllm._C", "vllm._rocm_C", "vllm.platforms.rocm", "vllm.platforms.cuda", "vllm.platforms.xpu",
           "vllm.platforms.tpu")


def _report():
    spec = importlib.util.spec_from_file_location("atom_sites_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _report()


@pytest.fixture(scope="module")
def data():
    return report.load()


@pytest.fixture(scope="module")
def measured(data):
    """Per entry: exists / declared / pinned / checked, each computed here from the source, plus why not."""
    release = report.installed_release()
    if release is None:
        pytest.skip("vLLM is not installed")
    installed = (release.version() or "").split("+")[0]
    if installed != report.ATOM_PINS:
        pytest.skip(f"ATOM's plugin patches vLLM {report.ATOM_PINS}; the figures are measured on that release "
                    f"(installed: {installed})")
    _, sites = data
    before = set(sys.modules)
    out = report.evaluate(sites, release)
    imported = sorted(m for m in set(sys.modules) - before if m.startswith(FOREIGN))
    assert not imported, f"the static measurement imported another platform's modules: {imported}"
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
    primaries = {(e["atom_file"], e["atom_function"], e["target"]) for e in sites if e["mechanism"] != "copy"}
    orphans = [e["target"] for e in sites if e["mechanism"] == "copy"
               and (e["atom_file"], e["atom_function"], e["copy_of"]) not in primaries]
    assert not orphans, f"copies without the entry of the target they copy: {orphans}"


def test_exists_matches_the_installed_vllm(data, measured):
    _, sites = data
    wrong = [f"{e['target']}: data says {e['exists_in_0_31']}, the source says {r['exists']} {r.get('why', '')}"
             for e, r in zip(sites, measured) if e["exists_in_0_31"] != r["exists"]]
    assert not wrong, "\n".join(wrong)


def test_every_declarable_place_is_declared(data, measured):
    _, sites = data
    undeclared = [f"{e['target']}: {r.get('why')}" for e, r in zip(sites, measured)
                  if e["declarable"] and not r.get("declared")]
    assert not undeclared, "\n".join(undeclared)


def test_foreign_platform_targets_are_measured(data, measured):
    """The places in vllm.platforms.rocm are read like any other (they exist in 0.31.0), not skipped."""
    _, sites = data
    rocm = [r for e, r in zip(sites, measured) if e["target"].startswith("vllm.platforms.rocm:")]
    assert len(rocm) == 2 and all(r["exists"] for r in rocm)
    assert sum(bool(r.get("checked")) for r in rocm) == 1  # the wrap; the platform subclass is not declarable


def test_summary_equals_the_measured_figures(data, measured):
    summary, sites = data
    computed = report.figures(sites, measured)
    assert computed["missing_kinds"] == dict(Counter(e["missing_kind"] for e in sites if e["missing_kind"]))
    not_checked = [f"{e['target']}: {r.get('why')}" for e, r in zip(sites, measured)
                   if r.get("pinned") and not r.get("checked")]
    assert {**summary, "missing_kinds": dict(summary["missing_kinds"])} == computed, \
        "pinned but not checked:\n" + "\n".join(not_checked)

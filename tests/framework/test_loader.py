"""The loader against real vLLM targets: verify, apply, record, undo."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import pytest
import wrapt

from vllm_patchkit.declaration.errors import RequiredPatchFailed

from .helpers import make_loader, patch_doc, pinned_entry

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
KV_COPY = "vllm.v1.engine.core:get_kv_cache_configs"
POST_INIT = "vllm.config.vllm:VllmConfig.__post_init__"
BREAKABLE = "vllm.config.vllm:VllmConfig._maybe_enable_breakable_cudagraph"


@pytest.fixture
def modules():
    import vllm.config.vllm as cfg
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.engine.core as core

    before = (kvu.get_kv_cache_configs, core.get_kv_cache_configs, cfg.VllmConfig.__dict__["__post_init__"],
              cfg.VllmConfig.__dict__["_maybe_enable_breakable_cudagraph"])
    yield kvu, core, cfg
    kvu.get_kv_cache_configs, core.get_kv_cache_configs = before[0], before[1]
    cfg.VllmConfig.__post_init__ = before[2]
    cfg.VllmConfig._maybe_enable_breakable_cudagraph = before[3]


def kv_patch(**kw):
    return patch_doc(id="kv", kind="wrap", target=KV, processes=["frontend"], expected_calls="per_step", **kw)


def test_wrap_with_declared_copy_patches_both_places_and_counts(tmp_path, modules):
    kvu, core, _ = modules
    original = kvu.get_kv_cache_configs
    loader = make_loader(tmp_path, {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert rec.state == "applied", rec
    assert kvu.get_kv_cache_configs is core.get_kv_cache_configs is not original
    assert kvu.get_kv_cache_configs.__wrapped__ is original
    with pytest.raises(TypeError):  # forwarded verbatim: vLLM's own arity error, counted on the way
        core.get_kv_cache_configs()
    loader.sync_calls()
    assert rec.calls == 1
    assert rec.detail["places"] == [KV, KV_COPY]


def test_undeclared_copy_is_reported_stale(tmp_path, modules):
    kvu, core, _ = modules
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV)])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert rec.state == "applied"
    assert {"code": "stale_copy", "where": KV_COPY} == {k: rec.findings[0][k] for k in ("code", "where")}
    assert core.get_kv_cache_configs is not kvu.get_kv_cache_configs  # the copy really was missed


def test_a_required_patch_bypassed_through_a_stale_copy_in_vllm_fails_status(tmp_path, modules):
    """A required patch that vLLM's own module calls around (a by-value copy nobody declared) is not in effect
    there: `status` exits 1 naming the copy (it said OK before: the finding was only listed)."""
    from vllm_patchkit.reporting import run_folder, verdict

    loader = make_loader(tmp_path, {"kv": kv_patch(required=True)}, [pinned_entry("kv@1", KV)])
    loader.run_import_stage()
    loader.flush()
    run = run_folder.load_run(Path(os.environ["VLLM_PATCHKIT_STATUS_DIR"]), None)
    code, problems = verdict.assess(run)
    assert code == verdict.BAD
    assert any(f"stale copy at {KV_COPY}" in p and "bypassing this required patch" in p for p in problems), problems


def test_apply_twice_changes_nothing(tmp_path, modules):
    kvu, core, _ = modules
    docs, entries = {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)]
    first = make_loader(tmp_path, docs, entries)
    first.run_import_stage()
    installed = kvu.get_kv_cache_configs
    first.run_import_stage()  # same loader: nothing pending, nothing re-done
    second = make_loader(tmp_path / "again", docs, entries)  # a second loader in the same process
    second.run_import_stage()
    assert second.records["kv"].state == "applied"
    assert "already" in second.records["kv"].detail
    assert kvu.get_kv_cache_configs is installed and core.get_kv_cache_configs is installed
    assert not hasattr(installed.__wrapped__, "__vllm_patchkit__")  # exactly one layer of ours


def test_unpatch_restores_identity(tmp_path, modules):
    kvu, core, cfg = modules
    originals = (kvu.get_kv_cache_configs, core.get_kv_cache_configs, cfg.VllmConfig.__dict__["__post_init__"])
    docs = {"kv": kv_patch(copies=[KV_COPY]),
            "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["frontend"])}
    loader = make_loader(tmp_path, docs, [pinned_entry("kv@1", KV, KV_COPY), pinned_entry("pi@1", POST_INIT)])
    loader.run_import_stage()
    assert cfg.VllmConfig.__dict__["__post_init__"] is not originals[2]
    loader.unpatch()
    assert kvu.get_kv_cache_configs is originals[0]
    assert core.get_kv_cache_configs is originals[1]
    assert cfg.VllmConfig.__dict__["__post_init__"] is originals[2]


def test_signature_mismatch_fails_with_expected_and_found(tmp_path, modules):
    kvu, _, _ = modules
    original = kvu.get_kv_cache_configs
    entry = pinned_entry("kv@1", KV)
    entry["targets"][KV]["signature"] = "(vllm_config, kv_cache_specs)"
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "fingerprint")
    assert rec.expected == "(vllm_config, kv_cache_specs)"
    assert rec.found.startswith("(vllm_config, kv_cache_specs, available_memory")
    assert kvu.get_kv_cache_configs is original


@pytest.mark.parametrize("third_party", ["functools", "wrapt"])
def test_target_wrapped_by_third_party_is_a_conflict(tmp_path, modules, third_party):
    kvu, _, _ = modules
    entry = pinned_entry("kv@1", KV)
    upstream = kvu.get_kv_cache_configs
    if third_party == "functools":
        @functools.wraps(upstream)
        def foreign(*a, **k):
            return upstream(*a, **k)
    else:
        foreign = wrapt.FunctionWrapper(upstream, lambda wrapped, instance, a, k: wrapped(*a, **k))
    kvu.get_kv_cache_configs = foreign
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.expected == [] and len(rec.found) == 1
    assert ("test_loader.py" in rec.found[0]) if third_party == "functools" else "FunctionWrapper" in rec.found[0]
    assert kvu.get_kv_cache_configs is foreign  # never stacked on


def test_native_upstream_decorator_is_not_a_conflict(tmp_path):
    """Executor.__init__ carries vLLM's own @instrument layer; the pin records it."""
    import vllm.v1.executor.abstract as ex

    spec = "vllm.v1.executor.abstract:Executor.__init__"
    before = ex.Executor.__dict__["__init__"]
    loader = make_loader(tmp_path, {"ex": patch_doc(id="ex", kind="wrap", target=spec, processes=["frontend"])},
                         [pinned_entry("ex@1", spec)])
    try:
        loader.run_import_stage()
        assert loader.records["ex"].state == "applied", loader.records["ex"]
    finally:
        loader.unpatch()
    assert ex.Executor.__dict__["__init__"] is before


def test_upstream_decorator_layer_absent_on_this_deployment_is_not_a_conflict(tmp_path):
    """Executor.__init__'s @instrument layer exists only when OpenTelemetry imports; a pin taken
    with it must still apply where it is absent (and vice versa). Regression: strict layer
    equality refused the required config-ready hook there."""
    import vllm.v1.executor.abstract as ex

    spec = "vllm.v1.executor.abstract:Executor.__init__"
    entry = pinned_entry("ex@1", spec)
    entry["targets"][spec]["wrappers"] = []  # pinned on a deployment without the layer
    loader = make_loader(tmp_path, {"ex": patch_doc(id="ex", kind="wrap", target=spec, processes=["frontend"])}, [entry])
    try:
        loader.run_import_stage()
        assert loader.records["ex"].state == "applied", loader.records["ex"]
    finally:
        loader.unpatch()


def test_required_failure_stops_startup_before_anything_applied(tmp_path, modules):
    kvu, _, cfg = modules
    before = (kvu.get_kv_cache_configs, cfg.VllmConfig.__dict__["__post_init__"])
    entry = pinned_entry("kv@1", KV)
    entry["targets"][KV]["signature"] = "(vllm_config)"
    docs = {"kv": kv_patch(required=True), "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["frontend"])}
    loader = make_loader(tmp_path, docs, [entry, pinned_entry("pi@1", POST_INIT)])
    with pytest.raises(RequiredPatchFailed) as ei:
        loader.run_import_stage()
    msg = str(ei.value)
    assert "required patch kv@1 failed" in msg and KV in msg
    assert "expected '(vllm_config)'" in msg and "found '(vllm_config, kv_cache_specs, available_memory" in msg
    assert ei.value.record.expected == "(vllm_config)"
    assert (kvu.get_kv_cache_configs, cfg.VllmConfig.__dict__["__post_init__"]) == before


def test_optional_failure_is_recorded_and_startup_goes_on(tmp_path, modules, patchkit_log):
    kvu, _, cfg = modules
    entry = pinned_entry("kv@1", KV)
    entry["targets"][KV]["signature"] = "(vllm_config)"
    docs = {"kv": kv_patch(), "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["frontend"])}
    loader = make_loader(tmp_path, docs, [entry, pinned_entry("pi@1", POST_INIT)])
    loader.run_import_stage()
    assert loader.records["kv"].state == "failed"
    assert loader.records["pi"].state == "applied"
    assert any("optional patch kv@1 failed" in r.getMessage() for r in patchkit_log.records)


def test_dependent_of_failed_patch_is_skipped_naming_the_cause(tmp_path, modules):
    entry = pinned_entry("kv@1", KV)
    entry["targets"][KV]["signature"] = "(x)"
    docs = {"kv": kv_patch(), "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["frontend"], requires=["kv"])}
    loader = make_loader(tmp_path, docs, [entry, pinned_entry("pi@1", POST_INIT)])
    loader.run_import_stage()
    rec = loader.records["pi"]
    assert (rec.state, rec.code) == ("skipped", "requires")
    assert "requires kv, which is failed (fingerprint)" == rec.reason


def test_other_process_and_unlisted_patch_are_skipped_with_reason(tmp_path, modules):
    docs = {"kv": kv_patch(), "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["worker"])}
    loader = make_loader(tmp_path, docs, [pinned_entry("pi@1", POST_INIT)])
    loader.run_import_stage()
    kv = loader.records["kv"]  # needed here (no preconditions) but not listed: an optional one warns
    assert (kv.state, kv.code, kv.found) == ("skipped", "unavailable", "not_listed")
    assert kv.warning == "optional patch kv@1 is needed here but cannot be applied on vLLM 0.31.0: not listed in vllm-0.31.0.yaml"
    pi = loader.records["pi"]
    assert (pi.state, pi.code, pi.expected, pi.found) == ("skipped", "process", ["worker"], "frontend")


def test_vllm_version_and_env_preconditions(tmp_path, modules, monkeypatch):
    monkeypatch.setenv("PATCHKIT_TEST_FLAG", "1")
    docs = {"kv": kv_patch(when={"vllm": ">=0.32"}),
            "pi": patch_doc(id="pi", kind="wrap", target=POST_INIT, processes=["frontend"], when={"env": {"PATCHKIT_TEST_FLAG": None}})}
    loader = make_loader(tmp_path, docs, [pinned_entry("kv@1", KV), pinned_entry("pi@1", POST_INIT)])
    loader.run_import_stage()
    kv, pi = loader.records["kv"], loader.records["pi"]
    assert (kv.state, kv.expected, kv.found) == ("skipped", ">=0.32", "0.31.0")
    assert (pi.state, pi.reason) == ("skipped", "env.PATCHKIT_TEST_FLAG: expected unset, actual '1'")


def test_records_written_atomically_per_process(tmp_path, modules):
    import json

    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV)])
    loader.run_import_stage()
    path = loader.flush()
    data = json.loads(path.read_text())
    assert path.parent.parent == tmp_path / "status"
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    assert data["role"] == "frontend" and data["patches"][0]["state"] == "applied"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_no_manifest_for_release_skips_needed_optional_patch_with_a_warning(tmp_path, modules):
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV)], vllm_version="0.40.0",
                         policy="skip")  # the default, nearest, judges it against 0.31.0's pins (test_nearest.py)
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code, rec.found) == ("skipped", "unavailable", "no_manifest")
    assert "no manifest pins vLLM 0.40.0" in rec.reason and rec.warning
    assert loader.process.warnings and "no manifest pins vLLM 0.40.0" in loader.process.warnings[0]


def test_no_manifest_policy_nearest_and_error(tmp_path, modules):
    from vllm_patchkit.declaration.errors import DeclarationError

    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV)], vllm_version="0.31.5", policy="nearest")
    loader.run_import_stage()
    assert loader.records["kv"].state == "applied" and loader.process.manifest == "vllm-0.31.0.yaml"
    loader.unpatch()
    with pytest.raises(DeclarationError, match="no manifest pins vLLM 0.31.5"):
        make_loader(tmp_path / "e", {"kv": kv_patch()}, [pinned_entry("kv@1", KV)], vllm_version="0.31.5", policy="error")


def test_changed_upstream_callable_in_uses_fails_before_installing(tmp_path, modules):
    """`uses` pins what the implementation calls without patching it (the KV hook re-runs vLLM's auto-fit)."""
    kvu, _, _ = modules
    original = kvu.get_kv_cache_configs
    used = "vllm.v1.core.kv_cache_utils:_auto_fit_max_model_len"
    entry = pinned_entry("kv@1", KV, used)
    entry["targets"][used]["signature"] = "(vllm_config, projected_groups_per_worker)"
    loader = make_loader(tmp_path, {"kv": kv_patch(uses=[used])}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "uses")
    assert rec.found == "(vllm_config, projected_groups_per_worker, available_memory)"
    assert kvu.get_kv_cache_configs is original


def test_uses_needs_a_pin(tmp_path):
    from vllm_patchkit.declaration.errors import PatchSetErrors

    with pytest.raises(PatchSetErrors, match="no pin for vllm.v1.core.kv_cache_utils:_auto_fit_max_model_len"):
        make_loader(tmp_path, {"kv": kv_patch(uses=["vllm.v1.core.kv_cache_utils:_auto_fit_max_model_len"])},
                    [pinned_entry("kv@1", KV)])


def test_layer_from_an_upstream_dependency_is_not_a_conflict(tmp_path):
    """Worker.execute_model is wrapped by @torch.inference_mode(), whose code lives in torch.
    Regression: judging layers by 'code outside vllm' refused the worker's step counter."""
    import vllm.v1.worker.gpu_worker as gw

    spec = "vllm.v1.worker.gpu_worker:Worker.execute_model"
    before = gw.Worker.__dict__["execute_model"]
    assert "torch" in before.__code__.co_filename  # the premise: a dependency's wrapper layer
    loader = make_loader(tmp_path, {"st": patch_doc(id="st", kind="wrap", target=spec, processes=["frontend"])},
                         [pinned_entry("st@1", spec)])
    try:
        loader.run_import_stage()
        assert loader.records["st"].state == "applied", loader.records["st"]
    finally:
        loader.unpatch()
    assert gw.Worker.__dict__["execute_model"] is before


def test_stacking_order_on_one_target_is_recorded_and_shown(tmp_path, modules):
    """Two patches on one target: each record says the order (innermost first), and status shows it."""
    from vllm_patchkit.reporting import status
    from vllm_patchkit.reporting import run_folder

    docs = {"kv": kv_patch(), "kv2": patch_doc(id="kv2", kind="wrap", target=KV, processes=["frontend"], requires=["kv"])}
    loader = make_loader(tmp_path, docs, [pinned_entry("kv@1", KV), pinned_entry("kv2@1", KV)])
    loader.run_import_stage()
    want = f"2 patches on {KV}, innermost first: kv@1 < kv2@1"
    assert loader.records["kv"].detail["stack"] == loader.records["kv2"].detail["stack"] == want
    loader.flush()
    run = run_folder.load_run(tmp_path / "status")
    rows = json.loads(status.to_json(run))["processes"][0]["patches"]
    assert [r["detail"]["stack"] for r in rows] == [want, want]
    assert "innermost first" in status.render(run)
    loader.unpatch()
    assert "stack" not in loader.records["kv"].detail


def test_start_up_says_what_changed_in_checks_words(tmp_path, modules):
    """One findings vocabulary: a signature mismatch at start-up is explained per parameter with the
    same Breakage objects and words as `vllm-patchkit check` (it said "signature differs" before)."""
    from vllm_patchkit.upstream.sigdiff import diff_signatures

    entry = pinned_entry("kv@1", KV)
    live_sig = entry["targets"][KV]["signature"]
    entry["targets"][KV]["signature"] = "(vllm_config, kv_cache_specs)"
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    words = [b.explain() for b in diff_signatures("", KV, "(vllm_config, kv_cache_specs)", live_sig)]
    assert words and rec.reason.startswith(words[0]) and all(w in rec.reason for w in words)
    assert "required parameter 'available_memory' added" in rec.reason
    assert [f["kind"] for f in rec.findings if f["code"] == "breakage"] == ["required_parameter_added"]
    assert all(f["patch"] == "kv@1" for f in rec.findings)


def test_a_fingerprint_finding_says_whether_the_difference_breaks_this_patch(tmp_path, modules):
    """The record uses `check`'s words and its per-patch verdict: a passthrough wrap survives an added
    parameter (still refused: pins are compared exactly, so the remedy is to re-pin)."""
    kvu, _, _ = modules
    original = kvu.get_kv_cache_configs
    entry = pinned_entry("kv@1", KV)
    entry["targets"][KV]["signature"] = "(vllm_config, kv_cache_specs)"
    loader = make_loader(tmp_path, {"kv": kv_patch()}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "fingerprint")
    assert "required parameter 'available_memory' added" in rec.reason
    assert "(compatible: verbatim passthrough: args and kwargs reach upstream untouched)" in rec.reason
    assert "re-pin the release (`vllm-patchkit pin`)" in rec.reason
    assert kvu.get_kv_cache_configs is original


def test_a_copy_under_another_name_or_bound_after_start_up_is_found_by_the_late_search(tmp_path, modules):
    """The stage's search is by name outside vLLM (fast, on the start-up path); the flusher's full search
    (`rescan_stale`, once start-up is over) finds `from x import f as g` in a plugin's module, and copies bound
    by modules imported after start-up, which no search at start-up could see."""
    import sys
    import types

    kvu, core, _ = modules
    original = kvu.get_kv_cache_configs
    early = types.ModuleType("patchkit_test_plugin_early")
    early.sizing = original  # `from vllm.v1.core.kv_cache_utils import get_kv_cache_configs as sizing`
    sys.modules[early.__name__] = early
    try:
        loader = make_loader(tmp_path, {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)])
        loader.run_import_stage()
        rec = loader.records["kv"]
        assert rec.state == "applied" and not rec.findings  # by name only: the alias is not seen at start-up
        late = types.ModuleType("patchkit_test_plugin_late")
        late.get_kv_cache_configs = original  # imported after start-up, holding what it took before the patch
        sys.modules[late.__name__] = late
        assert loader.rescan_stale() == 2
        assert sorted(f["where"] for f in rec.findings) == [
            "patchkit_test_plugin_early:sizing", "patchkit_test_plugin_late:get_kv_cache_configs"]
        assert loader.rescan_stale() == 0  # each one reported once
        loader.unpatch()
        assert loader.rescan_stale() == 0  # nothing applied, nothing to search for
    finally:
        sys.modules.pop("patchkit_test_plugin_early", None)
        sys.modules.pop("patchkit_test_plugin_late", None)


def test_the_flusher_runs_the_full_search_after_the_config_stage_and_after_the_first_step(tmp_path, modules):
    import sys
    import types

    from vllm_patchkit.runtime.flush import Flusher

    kvu, _, _ = modules
    loader = make_loader(tmp_path, {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)])
    loader.run_import_stage()
    flusher = Flusher(loader, interval=0)
    late = types.ModuleType("patchkit_test_plugin_late2")
    sys.modules[late.__name__] = late
    try:
        late.f = kvu.get_kv_cache_configs.__wrapped__
        assert flusher._search_stale() == 0  # no config yet: start-up is not over
        loader.process.config = {"model": "x"}
        assert flusher._search_stale() == 1
        late.g = kvu.get_kv_cache_configs.__wrapped__
        assert flusher._search_stale() == 0  # once per phase
        loader.process.steps = 3
        assert flusher._search_stale() == 1
        assert flusher.tick()  # the new finding is written even with no new call
    finally:
        sys.modules.pop(late.__name__, None)
        loader.unpatch()


def test_a_declared_module_run_as_the_program_is_patched_as_that_copy(tmp_path, modules):
    """`python -m vllm.entrypoints.openai.api_server` runs that module as `__main__`: a declared copy there is
    patched under that name too, and not reported as a stale copy (it was, on every `python -m` serve)."""
    import sys
    import types

    kvu, core, _ = modules
    original = kvu.get_kv_cache_configs
    fake_main = types.ModuleType("__main__")
    fake_main.__spec__ = types.SimpleNamespace(name="vllm.v1.engine.core")
    fake_main.get_kv_cache_configs = original
    real_main = sys.modules["__main__"]
    sys.modules["__main__"] = fake_main
    try:
        loader = make_loader(tmp_path, {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)])
        loader.run_import_stage()
        rec = loader.records["kv"]
        assert rec.state == "applied" and not rec.findings, rec.findings
        assert fake_main.get_kv_cache_configs is kvu.get_kv_cache_configs is not original
        assert loader.rescan_stale() == 0
        loader.unpatch()
        assert fake_main.get_kv_cache_configs is original
    finally:
        sys.modules["__main__"] = real_main


def test_the_plugins_loader_leaves_the_stale_search_to_the_flusher(tmp_path, modules):
    """The plugin's (lazy) loader does not search at the stage (start-up cost); the flusher's search after the
    config stage reports the same undeclared copy."""
    from vllm_patchkit.runtime.flush import Flusher

    loader = make_loader(tmp_path, {"kv": kv_patch()}, [pinned_entry("kv@1", KV)], lazy=True)
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert rec.state == "applied" and not rec.findings
    flusher = Flusher(loader, interval=0)
    loader.process.config = {"model": "x"}
    assert flusher._search_stale() == 1
    assert [f["where"] for f in rec.findings] == [KV_COPY]
    loader.unpatch()


def test_two_flushes_at_once_leave_the_newer_snapshot_on_disk(tmp_path, modules, monkeypatch):
    """Regression (seen in CI: the operator endpoints' note missing from the front end's record): the flusher
    thread's flush and a patch's note flush ran at once, and the older snapshot, written last, replaced the newer
    file; nothing rewrote it while no count changed. Here the first flush is held inside its write until the
    second has started: the second must wait for it, then write what was noted meanwhile."""
    import threading

    from vllm_patchkit.runtime import flush as flush_mod

    loader = make_loader(tmp_path, {"kv": kv_patch(copies=[KV_COPY])}, [pinned_entry("kv@1", KV, KV_COPY)])
    loader.run_import_stage()
    real_write, first_in, release, writes = flush_mod.write_atomic, threading.Event(), threading.Event(), []

    def held_write(path, data):
        writes.append(data)
        if len(writes) == 1:
            first_in.set()
            release.wait(10)
        real_write(path, data)

    monkeypatch.setattr(flush_mod, "write_atomic", held_write)
    older = threading.Thread(target=loader.flush)
    older.start()
    assert first_in.wait(10)
    loader.records["kv"].detail["noted"] = "after the first snapshot"
    newer = threading.Thread(target=loader.flush)
    newer.start()
    newer.join(0.5)  # unserialised, it writes now, before the older one
    release.set()
    older.join(10), newer.join(10)
    path = tmp_path / "status" / loader.process.run_id / f"frontend-{os.getpid()}.json"
    [row] = [r for r in json.loads(path.read_text())["patches"] if r["patch"] == "kv@1"]
    assert row["detail"].get("noted") == "after the first snapshot"
    loader.unpatch()

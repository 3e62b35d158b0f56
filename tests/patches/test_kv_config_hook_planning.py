"""kv-config-hook@2 on vLLM 0.33.0's own KV-cache planning, and the 0.33 manifest checked live.

vLLM 0.33.0 exists only as a CUDA wheel; its planning code is plain Python, so
tests/release_sources.py runs tests/patches/kv_hook_planning_probe.py with 0.33's sources
importable as `vllm` (CPU platform). Real there: `get_global_kv_cache_groups`,
`get_kv_cache_configs`, `_auto_fit_max_model_len` with vLLM's builder, `VllmConfig` from
`EngineArgs`, the loader's `verify` and `vllm-patchkit check` by import. Not exercised: a serve.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.release_sources import probe_json

PROBE = Path(__file__).with_name("kv_hook_planning_probe.py")


@pytest.fixture(scope="module")
def probe():
    return probe_json("0.33.0", PROBE)


def test_it_ran_vllm_0_33_from_the_wheel(probe):
    assert probe["vllm"] == "0.33.0" and "vllm-patchkit/sources/vllm-0.33.0" in probe["vllm_file"]


def test_version_2_sizes_the_pool_as_version_1_does_on_0_31(probe):
    """The toy numbers of tests/patches/test_kv_config_hook.py (0.31.0): 100 physical blocks, 11 withheld,
    auto-fit to 82 history blocks = 20,992 tokens where vLLM alone fits 93 = 23,808."""
    sized = probe["sized"]
    assert sized["num_blocks"] == 100 - 11
    assert sized["pages"] == [4096] and sized["group_sizes"] == [1, 1, 1, 1]
    assert sized["tensor_sizes"] == [100 * 4096]  # the allocation still covers the withheld slot tail
    assert sized["max_model_len"] == 20_992 and probe["vllm_alone_max_model_len"] == 23_808
    assert sized["decisions"] == {"sized": 1}


def test_without_regrouping_start_up_is_refused_wrongly(probe):
    """Negative control: version 1's flow on 0.33 passes EngineCore's groups (built from the unpriced
    proxy spec) through; the re-fit then works from the placeholder page and refuses a pool that fits."""
    assert probe["stale_groups"].startswith("PoolTooSmall:")
    assert "max_model_len=23808 needs ceil(23808/256) = 93" in probe["stale_groups"]


def test_the_0_33_manifest_verifies_live(probe):
    assert probe["verify"] == {k: "ok" for k in probe["verify"]}
    assert set(probe["verify"]) >= {"kv-config-hook@2", "pool-bytes-passthrough@2"}


def test_check_by_import_of_0_33_is_clean(probe):
    """Every patch fits 0.33 read by import, except places whose modules import a package vLLM 0.33 needs
    and this 0.31 virtualenv lacks (0.33's API server imports orjson): those cannot be read here at all,
    and tests/contracts/test_release_manifests.py checks them statically from the wheel instead."""
    check = probe["check"]
    assert "installed vLLM 0.33.0 (by import" in check["release"]
    counts = check["counts"]
    assert counts["not_applicable"] == counts["stale"] == counts["unpinned"] == 0
    assert counts["ok"] >= 13
    unreadable_here = {pid: why for pid, why in check["broken"].items()
                       if all("cannot be imported: ModuleNotFoundError: No module named 'orjson'" in w for w in why)}
    assert check["broken"] == unreadable_here, check["broken"]
    assert set(check["broken"]) <= {"core.operator-endpoints@1"}
    assert not any(pid.startswith(("kv-config-hook", "pool-bytes", "batch-dispatch", "image-publish"))
                   for pid in check["broken"])

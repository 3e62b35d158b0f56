"""The DeepSeek-V4 set ported to vLLM 0.34.0, on 0.34.0's own Python sources (tests/patches/v034_probe.py,
run by tests/release_sources.py: 0.34.0 exists only as a CUDA wheel). Real there: the V2 runner's
`gather_batch_req_state`, `get_kv_cache_configs` / `_auto_fit_max_model_len` with the extensible-KV-cache era
signature, `KVCacheConfig.__post_init__` (the field that replaced the property), `VllmConfig` from EngineArgs
(its CPU platform's triton-cpu check skipped), the loader's `verify` against the 0.34.0 manifest. Not
exercised (cannot run here): a CUDA graph replay, a serve, the extensible KV cache's post-warmup shrink."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.release_sources import probe_json

PROBE = Path(__file__).with_name("v034_probe.py")


@pytest.fixture(scope="module")
def probe():
    return probe_json("0.34.0", PROBE)


def test_the_defect_exists_on_0_34_and_the_v2_override_removes_it(probe):
    """Without the patch 0.34.0 offers the FULL decode graph (eligible, a uniform count) to a 1-token tail after
    a prefix hit and to a spec-padded tail; with it no prefilling row does; pure decode keeps its graph."""
    assert probe["vllm"] == "0.34.0"
    assert probe["dispatch_without"] == {"tail_after_prefix_hit": [True, 1], "one_token_prompt": [False, None],
                                         "two_token_tail_spec": [False, None], "padded_tail_spec": [True, 2],
                                         "decode": [True, 1]}
    assert probe["dispatch_with"] == {**{k: [False, None] for k in probe["dispatch_without"]}, "decode": [True, 1]}
    assert probe["dispatch_counts"] == {"steps_seen": 5, "steps_overridden": 2}


def test_kv_config_hook_sizes_the_pool_on_0_34_as_on_0_31(probe):
    """The toy numbers of tests/patches/test_kv_config_hook.py: 100 physical, 11 withheld, re-fit 20,992."""
    assert probe["sized"]["num_blocks"] == 100 - 11 and probe["sized"]["max_model_len"] == 20_992
    assert probe["sized"]["tensor_sizes"] == [100 * 4096]  # the allocation still covers the withheld tail


def test_kv_zeroing_off_through_the_field(probe):
    """0.34.0 zeroes a pool with Mamba groups (the field is True without the patch); image-kv-zeroing-off@2 sets
    the field False on the configs vLLM builds for the adapter's model, and leaves another model's alone."""
    assert probe["sized"]["zeroing_without_patch"] is True
    assert probe["zeroing_with_patch"] is False and probe["zeroing_counts"] >= 1
    assert probe["zeroing_other_model"] is True


def test_the_extensible_kv_cache_is_refused_for_the_adapters_model(probe):
    assert probe["extensible"].startswith("Refusal: ")
    assert "--no-enable-extensible-kv-cache" in probe["extensible"]


def test_the_0_34_manifest_verifies_live(probe):
    assert probe["verify"] == {k: "ok" for k in probe["verify"]}
    assert len(probe["verify"]) == 6

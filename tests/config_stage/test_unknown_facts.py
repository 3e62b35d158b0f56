"""A fact the framework cannot read on a release is unknown, never unmet (issue: vLLM 0.34.0 removed
`VllmConfig.use_v2_model_runner`; reading it raised, the runner was None, and `None != "v1"` skipped every
runner-keyed patch as "not needed" while status read OK).

Judged on real VllmConfigs: 0.31.0's (installed) with the property removed from the real class as 0.34.0
removed it, and 0.34.0's own, built from its wheel's Python sources (tests/release_sources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_patchkit.declaration.errors import RequiredPatchFailed
from vllm_patchkit.declaration.preconditions import Facts, Unknown, Unmet, unmet_at_config, unmet_at_import
from vllm_patchkit.declaration.schema import When

from .. import release_sources
from ..framework.helpers import make_loader, patch_doc, pinned_entry
from .conftest import build_config

DISPATCH = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"
V4 = "DeepseekV4ForCausalLM"
PROBE = Path(__file__).with_name("v034_config_probe.py")


def _loader(tmp_path, required: bool):
    doc = patch_doc(id="dispatch", kind="wrap", target=DISPATCH, processes=["worker"], required=required,
                    expected_calls="per_step", when={"architectures": [V4], "runner": "v1"})
    return make_loader(tmp_path, {"dispatch": doc}, [pinned_entry("dispatch@1", DISPATCH)], role="worker")


@pytest.fixture
def config_without_runner_property(monkeypatch):
    """A real 0.31.0 VllmConfig, then its class without `use_v2_model_runner` as vLLM 0.34.0 has it (removed
    after the build: 0.31.0's own `__post_init__` reads it). The V1 runner's module is still there, so the
    release does not say which runner runs: the fact is unknown."""
    from vllm.config import VllmConfig

    def build(model_dir):
        cfg = build_config(model_dir)
        monkeypatch.delattr(VllmConfig, "use_v2_model_runner")
        return cfg
    return build


def test_unknown_runner_fails_a_required_patch_naming_the_fact(tmp_path, checkpoints, config_without_runner_property):
    cfg = config_without_runner_property(checkpoints[V4])
    loader = _loader(tmp_path, required=True)
    loader.run_import_stage()
    try:
        with pytest.raises(RequiredPatchFailed) as err:
            loader.run_config_stage(cfg)
        rec = loader.records["dispatch"]
        assert (rec.state, rec.code, rec.found) == ("failed", "precondition_unknown", "unknown")
        assert "runner" in rec.reason and "0.31.0" in rec.reason
        assert "runner" in str(err.value)
    finally:
        loader.unpatch()


def test_unknown_runner_warns_for_an_optional_patch(tmp_path, checkpoints, config_without_runner_property):
    cfg = config_without_runner_property(checkpoints[V4])
    loader = _loader(tmp_path, required=False)
    loader.run_import_stage()
    loader.run_config_stage(cfg)
    try:
        rec = loader.records["dispatch"]
        assert (rec.state, rec.code) == ("skipped", "precondition_unknown")
        assert rec.warning and "runner" in rec.warning
    finally:
        loader.unpatch()


def test_a_known_false_part_still_decides(tmp_path, checkpoints, config_without_runner_property):
    """A Llama is not the plugin's model whatever the runner: skipped as not needed, no refusal."""
    cfg = config_without_runner_property(checkpoints["LlamaForCausalLM"])
    loader = _loader(tmp_path, required=True)
    loader.run_import_stage()
    loader.run_config_stage(cfg)
    try:
        rec = loader.records["dispatch"]
        assert (rec.state, rec.code, rec.expected) == ("skipped", "precondition", [V4])
    finally:
        loader.unpatch()


@pytest.mark.parametrize("field,config,when", [
    ("runner", {"architectures": [V4], "runner": None}, {"architectures": [V4], "runner": "v1"}),
    ("prefix_caching", {"architectures": [V4], "prefix_caching": None}, {"prefix_caching": True}),
    ("speculative", {"architectures": [V4], "speculative": None}, {"speculative": False}),
    ("cudagraph_mode", {"architectures": [V4], "cudagraph_mode": None}, {"cudagraph_mode": ["FULL"]}),
    ("architectures", {"architectures": None}, {"architectures": [V4]}),
    ("served_by", {"architectures": [V4], "served_by": {V4: None}}, {"architectures": [V4],
                                                                    "served_by": "out_of_tree"}),
])
def test_each_config_fact_can_be_unknown(field, config, when):
    got = unmet_at_config(When(**when), config)
    assert isinstance(got, Unknown) and got.field == field


def test_unmet_wins_over_unknown_in_any_order():
    when = When(architectures=[V4], runner="v1", prefix_caching=True)
    assert unmet_at_config(when, {"architectures": [V4], "runner": None, "prefix_caching": False}) == \
        Unmet("prefix_caching", True, False)
    served = When(architectures=[V4], served_by="out_of_tree", runner="v1")
    got = unmet_at_config(served, {"architectures": [V4], "served_by": {V4: "vllm.models.x"}, "runner": None})
    assert isinstance(got, Unmet) and got.field == "served_by"


def test_unknown_platform_at_import():
    facts = Facts(vllm_version="0.31.0", platform=None, role="worker", env={})
    got = unmet_at_import(When(platform=["cuda"]), facts)
    assert isinstance(got, Unknown) and got.field == "platform"
    assert unmet_at_import(When(platform=["cuda"], vllm="<0.30"), facts) == Unmet("vllm", "<0.30", "0.31.0")


def test_config_facts_of_vllm_034_are_read_from_the_release():
    """vLLM 0.34.0's own VllmConfig (its sources from the wheel; its CPU platform's config check, which refuses
    without triton-cpu, is skipped — nothing else): no `use_v2_model_runner`, and the runner is read as `v2`
    from the release (the V1 GPU runner's module is gone, the V2 one is there). The shipped set's `when`s are
    judged on these facts: none is unknown."""
    out = release_sources.run("0.34.0", PROBE)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["version"] == "0.34.0" and doc["has_use_v2_model_runner"] is False
    facts = doc["facts"]
    assert facts["runner"] == "v2" and facts["architectures"] == [V4]
    assert facts["served_by"][V4] == "patchkit_standin.model"
    assert all(v is not None for k, v in facts.items()), facts
    assert doc["unknown"] == {}, doc["unknown"]

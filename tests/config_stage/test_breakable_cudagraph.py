"""BRIEF 3.2 on the real VllmConfig: exact architecture + the registry's answer, before vLLM decides."""

from __future__ import annotations

import logging
import os

import pytest

from .conftest import build_config

OPT_OUT, REFUSE = "breakable-cudagraph-opt-out", "breakable-cudagraph-refuse"


def test_plugin_v4_unset_becomes_0_with_one_log_line(frontend, checkpoints, standin_registered, patchkit_log):
    build_config(checkpoints["DeepseekV4ForCausalLM"])
    rec = frontend.records[OPT_OUT]
    assert rec.state == "applied", rec
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    lines = [r.getMessage() for r in patchkit_log.records if "VLLM_USE_BREAKABLE_CUDAGRAPH=0" in r.getMessage()]
    assert lines == ["vllm-patchkit: breakable-cudagraph-opt-out@1 set VLLM_USE_BREAKABLE_CUDAGRAPH=0 (was unset)"]
    assert frontend.process.config["served_by"]["DeepseekV4ForCausalLM"] == "patchkit_standin.model"


def test_plugin_mtp_architecture_is_covered(frontend, checkpoints, monkeypatch):
    from vllm import ModelRegistry

    saved = ModelRegistry.models.get("DeepSeekV4MTPModel")
    ModelRegistry.register_model("DeepSeekV4MTPModel", "patchkit_standin.model:StandinDeepseekV4ForCausalLM")
    try:
        try:
            build_config(checkpoints["DeepSeekV4MTPModel"])
        except Exception:
            pass  # vLLM may reject an MTP model as a main model later; the decision was made first
        assert frontend.records[OPT_OUT].state == "applied"
        assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    finally:
        ModelRegistry.models["DeepSeekV4MTPModel"] = saved


def test_explicit_1_is_refused_before_the_config_is_finished(frontend, checkpoints, standin_registered, monkeypatch):
    import vllm.config.vllm as cfgmod

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    seen = []
    # spy on the first thing vLLM's own __post_init__ does (not a patch target: replacing
    # a target would rightly be refused as a conflict)
    real = cfgmod.VllmConfig._resolve_mm_encoder_only
    monkeypatch.setattr(cfgmod.VllmConfig, "_resolve_mm_encoder_only", lambda self: seen.append(1) or real(self))
    with pytest.raises(ValueError, match="VLLM_USE_BREAKABLE_CUDAGRAPH=1 is not supported") as ei:
        build_config(checkpoints["DeepseekV4ForCausalLM"])
    # pydantic's dataclass re-raises it as its ValueError subclass, with our message inside
    assert "vllm-patchkit: breakable-cudagraph-refuse@1" in str(ei.value)
    assert "DeepseekV4ForCausalLM" in str(ei.value)
    assert seen == []  # none of vLLM's own __post_init__ logic ran
    assert frontend.records[REFUSE].state == "refused"


def test_explicit_0_is_kept(frontend, checkpoints, standin_registered, monkeypatch):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    build_config(checkpoints["DeepseekV4ForCausalLM"])
    rec = frontend.records[OPT_OUT]
    assert rec.state == "applied" and rec.detail["env"] == "kept explicit VLLM_USE_BREAKABLE_CUDAGRAPH=0"
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"


def test_vllm_own_v4_is_skipped_served_by(frontend, checkpoints):
    """Without the plugin's class, the registry serves V4 with vLLM's own: the opt-out stays out of it."""
    try:
        build_config(checkpoints["DeepseekV4ForCausalLM"])
    except Exception:
        pass  # vLLM's own V4 may not accept a Llama checkpoint further on; the decision came first
    rec = frontend.records[OPT_OUT]
    assert (rec.state, rec.code) == ("skipped", "precondition")
    assert rec.expected == "out_of_tree"
    assert rec.found == {"DeepseekV4ForCausalLM": "vllm.models.deepseek_v4"}


def test_v41_is_not_matched_by_substring(frontend, checkpoints, standin_registered):
    try:
        build_config(checkpoints["DeepseekV41ForCausalLM"])
    except Exception:
        pass
    rec = frontend.records[OPT_OUT]
    assert (rec.state, rec.code) == ("skipped", "precondition")
    assert rec.reason.startswith("architectures: expected ['DeepseekV4ForCausalLM', 'DeepSeekV4MTPModel'], actual ['DeepseekV41ForCausalLM']")


def test_other_architectures_untouched(frontend, checkpoints):
    build_config(checkpoints["LlamaForCausalLM"])
    assert frontend.records[OPT_OUT].state == "skipped"
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ


def test_applying_twice_changes_nothing(frontend, checkpoints, standin_registered):
    import vllm.config.vllm as cfgmod

    hook = cfgmod.VllmConfig.__dict__["__post_init__"]
    build_config(checkpoints["DeepseekV4ForCausalLM"])
    frontend.run_import_stage()
    from vllm_patchkit.runtime.loader import Loader

    again = Loader.builtin(role="frontend")
    again.run_import_stage()
    assert cfgmod.VllmConfig.__dict__["__post_init__"] is hook
    assert again.records["core.config-ready.frontend"].detail.get("already")
    build_config(checkpoints["DeepseekV4ForCausalLM"])  # config stage runs once per process
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"


def test_spec_decode_with_prefix_caching_refused_for_plugin_v4():
    """Judged on the configuration facts (a real speculative config needs a draft model)."""
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
    from vllm_patchkit.declaration.preconditions import unmet_at_config

    patch = load_patch_set(installed_sources()).patches["v4-spec-decode-prefix-cache-refuse@1"]
    facts = {"architectures": ["DeepseekV4ForCausalLM"], "served_by": {"DeepseekV4ForCausalLM": "atom.models"},
             "speculative": True, "prefix_caching": True}
    assert unmet_at_config(patch.when, facts) is None
    assert "--no-enable-prefix-caching" in patch.message and "--speculative-config" in patch.message
    assert str(unmet_at_config(patch.when, {**facts, "prefix_caching": False})) == "prefix_caching: expected True, actual False"

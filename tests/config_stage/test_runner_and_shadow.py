"""Runner preconditions and shadowed targets, judged on real VllmConfigs and vLLM's real runner classes."""

from __future__ import annotations

import pytest

from ..framework.helpers import make_loader, patch_doc, pinned_entry
from .conftest import build_config

TO_LIST = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._to_list"
DISPATCH = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"


def _worker_loader(tmp_path, runner=None):
    when = {"runner": runner} if runner else {"platform": ["cpu", "cuda", "rocm"]}
    docs = {
        "to-list": patch_doc(id="to-list", kind="wrap", target=TO_LIST, processes=["worker"],
                             expected_calls="per_step", when={**when, "prefix_caching": True}),
        "dispatch": patch_doc(id="dispatch", kind="wrap", target=DISPATCH, processes=["worker"],
                              expected_calls="per_step", when={**when, "prefix_caching": True}),
    }
    return make_loader(tmp_path, docs, [pinned_entry("to-list@1", TO_LIST), pinned_entry("dispatch@1", DISPATCH)],
                       role="worker")


def test_v1_only_patch_skipped_when_config_selects_v2(tmp_path, checkpoints, monkeypatch):
    """On this CPU the V2 runner cannot start: VllmConfig itself refuses it ("Model Runner V2
    requires Triton"). So the config is built as vLLM allows here, then judged with
    VLLM_USE_V2_MODEL_RUNNER=1, which is what `VllmConfig.use_v2_model_runner` (vLLM's own
    rule, read live by the precondition) answers on a machine where V2 can run."""
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert cfg.use_v2_model_runner is True
    loader = _worker_loader(tmp_path, runner="v1")
    loader.run_import_stage()
    loader.run_config_stage(cfg)
    try:
        rec = loader.records["dispatch"]
        assert (rec.state, rec.code, rec.expected, rec.found) == ("skipped", "precondition", "v1", "v2")
        assert rec.reason == "runner: expected v1, actual v2"
    finally:
        loader.unpatch()


def test_v1_patch_applies_when_config_selects_v1(tmp_path, checkpoints, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    loader = _worker_loader(tmp_path, runner="v1")
    loader.run_config_stage(cfg)
    try:
        assert loader.records["dispatch"].state == "applied"
        assert loader.process.config["classes"]["model_runner"] == "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
    finally:
        loader.unpatch()


def test_patch_on_base_method_overridden_by_cpu_runner_is_shadowed(tmp_path, checkpoints, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    loader = _worker_loader(tmp_path)
    loader.run_config_stage(cfg)
    try:
        to_list, dispatch = loader.records["to-list"], loader.records["dispatch"]
        assert to_list.state == dispatch.state == "applied"
        [finding] = to_list.findings
        assert finding["code"] == "shadowed"
        assert finding["by"] == "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
        assert dispatch.findings == []  # the CPU runner inherits this one: it runs
    finally:
        loader.unpatch()


def test_shadow_check_can_be_switched_off(tmp_path, checkpoints, monkeypatch):
    monkeypatch.setenv("VLLM_PATCHKIT_SHADOW_CHECK", "0")
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    loader = _worker_loader(tmp_path)
    loader.run_config_stage(cfg)
    try:
        assert loader.records["to-list"].findings == []
    finally:
        loader.unpatch()


@pytest.mark.parametrize("body, shadowed", [
    ("return 1", True),
    ("return super().m() + 1", False),
    ("return Base.m(self)", False),
])
def test_override_calling_up_is_not_shadowing(tmp_path, monkeypatch, body, shadowed):
    import importlib
    import sys

    (tmp_path / "shadowmod.py").write_text(
        "class Base:\n    def m(self):\n        return 0\n\n"
        f"class Child(Base):\n    def m(self):\n        {body}\n\nclass Grandchild(Child):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("shadowmod", None)
    mod = importlib.import_module("shadowmod")
    from vllm_patchkit.runtime.shadow import shadowing

    assert (shadowing(mod.Base, "m", mod.Grandchild) is not None) == shadowed
    assert shadowing(mod.Base, "m", mod.Base) is None

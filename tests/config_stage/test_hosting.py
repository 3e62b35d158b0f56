"""A process that will host another role's code (runtime/hosting.py) on real VllmConfigs built by vLLM's
EngineArgs: the optional hook that marks that role's start must be in place there, or start-up stops naming it.
A hook that could not be installed (a pin broken on a new release: simulated by marking its record failed, as
verification does) would otherwise leave the role's patches "not for this process" and the status OK."""

from __future__ import annotations

import pytest

from tests.conftest import process_loader
from tests.config_stage.conftest import build_config
from vllm_patchkit.declaration.errors import RequiredPatchFailed
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.hosting import expected_hosts
from vllm_patchkit.runtime.loader import Loader


@pytest.fixture
def engine_core(tmp_path):
    loader = Loader.builtin(role="engine_core", status_dir=tmp_path / "status")
    runtime.install(loader)
    loader.run_import_stage()
    yield loader
    loader.unpatch()
    runtime.reset()


def _uni(checkpoints):
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    cfg.parallel_config.distributed_executor_backend = "uni"  # what vLLM picks on one GPU (the CPU build forces mp)
    return cfg


def test_the_roles_vllms_configuration_says_a_process_will_host(checkpoints, monkeypatch):
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    assert cfg.parallel_config.distributed_executor_backend == "mp"  # the CPU build: workers are processes
    assert expected_hosts("engine_core", cfg) == {}
    assert expected_hosts("engine_core", _uni(checkpoints)) == {"worker": "distributed_executor_backend=uni"}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert expected_hosts("frontend", cfg) == {"engine_core": "VLLM_ENABLE_V1_MULTIPROCESSING=0"}
    assert expected_hosts("worker", _uni(checkpoints)) == {}


def test_engine_core_with_the_uni_executor_and_its_hook_in_place_starts(engine_core, checkpoints):
    assert engine_core.records["core.hosted.worker"].state in ("applied", "not_imported")
    engine_core.run_config_stage(_uni(checkpoints))
    assert engine_core.process.error is None


def test_a_hook_that_could_not_be_installed_where_the_worker_will_run_stops_start_up(engine_core, checkpoints):
    rec = engine_core.records["core.hosted.worker"]
    rec.set("failed", "fingerprint", "signature changed (simulated)", "(self, vllm_config)", "(self, cfg)")
    with pytest.raises(RequiredPatchFailed, match="will run worker's code too.*distributed_executor_backend=uni"):
        engine_core.run_config_stage(_uni(checkpoints))
    assert rec.required and "core.hosted.worker" in engine_core.process.error


def test_the_same_failed_hook_does_not_matter_when_the_worker_is_a_process_of_its_own(engine_core, checkpoints):
    engine_core.records["core.hosted.worker"].set("failed", "fingerprint", "signature changed (simulated)")
    engine_core.run_config_stage(build_config(checkpoints["LlamaForCausalLM"]))  # mp: nothing hosted here
    assert engine_core.process.error is None


def test_a_front_end_without_multiprocessing_needs_its_engine_core_hook(tmp_path, checkpoints, monkeypatch):
    cfg = build_config(checkpoints["LlamaForCausalLM"])
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    loader = process_loader("frontend", status_dir=tmp_path / "status")
    try:
        loader.records["core.hosted.engine-core"].set("refused", "verify", "refused (simulated)")
        with pytest.raises(RequiredPatchFailed, match="will run engine_core's code too"):
            loader.run_config_stage(cfg)
    finally:
        loader.unpatch()
        runtime.reset()

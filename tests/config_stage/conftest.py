"""Real VllmConfigs built by vLLM's own EngineArgs from tiny local checkpoints."""

from __future__ import annotations

import os

import pytest

from tests.conftest import process_loader

from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """One tiny checkpoint per architecture name (same weights, different config.json)."""
    base = tmp_path_factory.mktemp("ckpt")
    archs = ["LlamaForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM", "DeepSeekV4MTPModel"]
    return {a: build_tiny_model(base / a, architecture=a) for a in archs}


@pytest.fixture
def frontend(monkeypatch):
    """The shipped patch set, loaded as the front end's plugin entry point would; undone after."""
    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    loader = process_loader("frontend")
    yield loader
    loader.unpatch()
    runtime.reset()
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)


def build_config(model_dir, **kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model_dir), max_model_len=512, dtype="float32", **kw).create_engine_config()

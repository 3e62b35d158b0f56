"""Session fixtures for end-to-end tests: tiny offline checkpoints for real vLLM serves.

Why session scope: building is cheap (~2 s) but every test that serves should
reuse the same files; each serve itself costs ~30-60 s on a CPU.
"""

import importlib.util
import os

import pytest

from vllm_patchkit.tools.serve.tiny_model import build_tiny_model


def _need_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")


@pytest.fixture(autouse=True)
def _serve_env(monkeypatch):
    """Servers started here see installed plugins and log at INFO.

    The top-level conftest turns vLLM's plugin loading off (``VLLM_PLUGINS=""``)
    and quietens logs for in-process unit tests; a real server must not inherit that.
    """
    from tests.conftest import PRISTINE_ENV

    keep = {k: v for k, v in os.environ.items() if k.startswith("VLLM_PATCHKIT_STATUS_DIR")}
    for name in list(os.environ):
        if name not in PRISTINE_ENV:
            monkeypatch.delenv(name)
    for name, value in {**PRISTINE_ENV, **keep}.items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama checkpoint (architecture LlamaForCausalLM)."""
    _need_vllm()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def standin_model(tmp_path_factory):
    """The same checkpoint named DeepseekV4ForCausalLM, for the patchkit_standin plugin."""
    _need_vllm()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-standin-v4"), "DeepseekV4ForCausalLM")

"""Smoke tests that vLLM really serves the tiny model through the demo harness.

Why: every end-to-end patch test stands on this harness; if it cannot serve,
or leaves EngineCore/worker processes behind, all later results are suspect.
"""

import importlib.util

import pytest

from vllm_patchkit.tools.serve.server import pid_alive, serve

pytestmark = pytest.mark.e2e


def test_tiny_llama_serves_and_cleans_up(tiny_model, tmp_path):
    with serve(tiny_model, log_path=tmp_path / "server.log") as srv:
        procs = srv.processes()
        out = srv.complete("Hello, world!", max_tokens=8)
        choice = out["choices"][0]
        assert isinstance(choice["text"], str) and choice["text"]
        assert out["usage"]["completion_tokens"] == 8
        # A 1-token prompt given as ids, and a 129-token prompt twice (the second hits the prefix cache).
        assert srv.complete_tokens([5], max_tokens=4)["usage"]["prompt_tokens"] == 1
        ids = [(i * 7 + 3) % 500 + 3 for i in range(129)]
        first, second = (srv.complete_tokens(ids, max_tokens=4) for _ in range(2))
        assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert any(title.startswith("VLLM::EngineCor") for title in procs.values()), procs
    assert not [pid for pid in procs if pid_alive(pid)], "vLLM processes left behind"


@pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                    reason="pip install ./tests/plugins/standin")
def test_standin_v4_serves_with_out_of_tree_class(standin_model, tmp_path):
    log = tmp_path / "server.log"
    with serve(standin_model, env={"PATCHKIT_STANDIN": "1"}, log_path=log) as srv:
        out = srv.complete("Hello, world!", max_tokens=8)
        assert out["usage"]["completion_tokens"] == 8
    text = log.read_text()
    assert "Resolved architecture: DeepseekV4ForCausalLM" in text
    assert "model class patchkit_standin.model.StandinDeepseekV4ForCausalLM" in text

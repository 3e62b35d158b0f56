"""kv-config-hook end to end: in a real CPU serve, the hook is applied in EngineCore with its copy rebound.

The stand-in plugin (``patchkit_standin``, PATCHKIT_STANDIN=1) serves a tiny Llama
as an out-of-tree ``DeepseekV4ForCausalLM``: the patch's ``when`` holds, so the
config stage in EngineCore (at ``Executor.__init__``, before KV sizing) wraps
``get_kv_cache_configs`` in ``kv_cache_utils`` and EngineCore's by-value copy.
The stand-in has no proxy layer, so the one start-up call passes through and the
server serves as usual. The records say all of that: places, one call, the decision.
(The proxy path itself is shown on vLLM's real functions in tests/patches/test_kv_config_hook.py.)
"""

from __future__ import annotations

import importlib.util

import pytest

from vllm_patchkit.tools.serve.server import serve
from vllm_patchkit.reporting.run_folder import load_run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                       reason="pip install ./tests/plugins/standin"),
]

PATCH = "kv-config-hook@1"


def _rec(proc):
    return next(r for r in proc["patches"] if r["patch"] == PATCH)


def test_hook_is_active_in_engine_core_and_passes_the_standin_through(standin_model, tmp_path, monkeypatch):
    status_dir = tmp_path / "status"
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "PATCHKIT_STANDIN": "1"}
    with serve(standin_model, env=env, extra_args=["--enable-prefix-caching"],
               log_path=tmp_path / "server.log") as srv:
        out = srv.complete("The quick brown fox", max_tokens=8)
        assert out["usage"]["completion_tokens"] == 8
    run = load_run(status_dir)
    assert run is not None, "no records"
    roles = {}
    for proc in run.processes:
        roles.setdefault(proc["role"], []).append(proc)
    (ec,) = roles["engine_core"]
    rec = _rec(ec)
    assert ec["config"]["architectures"] == ["DeepseekV4ForCausalLM"]
    assert rec["state"] == "applied" and rec["stage"] == "config", rec
    assert rec["detail"]["places"] == ["vllm.v1.core.kv_cache_utils:get_kv_cache_configs",
                                       "vllm.v1.engine.core:get_kv_cache_configs"]
    assert rec["calls"] == 1, rec  # EngineCore's one sizing call went through the rebound copy
    assert rec["detail"]["decisions"] == {"passthrough": 1}
    assert rec["detail"]["last_call"]["reason"].startswith("no registered adapter's proxy layer")
    for role in ("frontend", "worker"):
        other = _rec(roles[role][0])
        assert (other["state"], other["code"], other["calls"]) == ("skipped", "process", 0), other

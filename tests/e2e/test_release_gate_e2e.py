"""The release gate end to end, on whichever vLLM release is installed (CI: 0.31.0 and 0.32.0).

What a model needs decides whether it serves on the installed release:

- a model that needs no patch (the tiny Llama) serves on every release, and
  `vllm-patchkit status --json` says OK;
- the DeepSeek-V4 stand-in (tests/plugins/standin; prefix caching on) needs every
  required patch whose preconditions can hold for it. When the installed release's
  manifest lists them all (0.31.0) it serves, a prefix hit and a 1-token prompt
  complete, and status says OK. When one is missing (0.32.0: batch-dispatch-override
  is `not_applicable` there; a release without a manifest misses them all) start-up
  is refused before the server is ever ready, with the loader's message naming the
  patch, the release and `vllm-patchkit pin`, and status exits 1 naming the patch.

The expectation is read from the YAML files themselves (patches/*.yaml and
manifests/vllm-<release>.yaml), not from the loader under test, so a manifest that
drops a patch flips this test to the refusal branch instead of passing silently.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from vllm_patchkit.tools.serve.server import ServerError, serve

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ARCH = "DeepseekV4ForCausalLM"
# The required patches aimed at the stand-in that the gate must find (a sanity check on the
# reading below: if one of them is no longer selected, the reading is wrong, not the release).
EXPECTED_NEEDED = {"batch-dispatch-override@1", "kv-config-hook@1", "breakable-cudagraph-opt-out@1"}
PROMPT_129 = [(i * 7 + 3) % 250 + 3 for i in range(129)]  # one 128-token block plus one token
READY_TIMEOUT = 240.0


@pytest.fixture(autouse=True)
def _deployment_defaults(monkeypatch):
    """Start servers as a deployment would (see test_batch_dispatch_e2e): a fresh run id, and none
    of the vLLM switches an in-process test may have left behind."""
    for name in ("VLLM_PATCHKIT_RUN_ID", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_V2_MODEL_RUNNER"):
        monkeypatch.delenv(name, raising=False)


def _installed_release() -> str:
    import vllm

    return vllm.__version__


def _manifest(release: str) -> dict | None:
    """The manifest pinning the installed release (matched as the loader does), or None."""
    installed = Version(release)
    for path in sorted((ROOT / "manifests").glob("vllm-*.yaml")):
        data = yaml.safe_load(path.read_text())
        pinned = Version(str(data["vllm"]))
        if pinned in (installed, Version(installed.base_version)):
            return data
    return None


def _needed_required_patches(release: str, env: dict[str, str]) -> set[str]:
    """id@version of every required patch (framework observers aside) whose preconditions can hold
    when the stand-in is served here: architecture DeepseekV4ForCausalLM served by an out-of-tree
    class, V1 runner (V2 cannot start on this CPU), prefix caching on, no speculative decoding,
    cudagraph mode NONE (the CPU's only one), the server's environment ``env``."""
    needed = set()
    for path in sorted((ROOT / "patches").glob("*.yaml")):
        p = yaml.safe_load(path.read_text())
        if not p.get("required") or p.get("observer"):
            continue
        w = p.get("when") or {}
        holds = (
            ARCH in w.get("architectures", [ARCH])
            and w.get("served_by") in (None, "out_of_tree")
            and w.get("runner") in (None, "v1")
            and w.get("prefix_caching") in (None, True)
            and w.get("speculative") in (None, False)
            and "NONE" in w.get("cudagraph_mode", ["NONE"])
            and "cpu" in w.get("platform", ["cpu"])
            and (w.get("vllm") is None or Version(release) in SpecifierSet(w["vllm"]))
            and all(env.get(name) == value for name, value in (w.get("env") or {}).items())
        )
        if holds:
            needed.add(f"{p['id']}@{p['version']}")
    return needed


def _status_json(status_dir: Path) -> tuple[int, dict]:
    """`vllm-patchkit status --json` as a subprocess, reading the server's status directory."""
    script = Path(sys.executable).with_name("vllm-patchkit")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_patchkit.tools.cli"]
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir)}
    done = subprocess.run([*cmd, "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"status --json printed no JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.returncode, report


def _server_env(status_dir: Path, **extra: str) -> dict[str, str]:
    return {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "1", **extra}


def test_tiny_llama_serves_and_status_is_ok_on_any_release(tiny_model, tmp_path):
    status_dir = tmp_path / "status"
    with serve(tiny_model, env=_server_env(status_dir), log_path=tmp_path / "server.log",
               timeout=READY_TIMEOUT) as srv:
        out = srv.complete("Hello, world!", max_tokens=8)
        assert out["usage"]["completion_tokens"] == 8
        time.sleep(2.0)  # a periodic flush of EngineCore's and the worker's counts
    code, report = _status_json(status_dir)
    print(f"\nvLLM {_installed_release()}: status exit {code}; warnings: {report['warnings']}")
    assert (code, report["problems"]) == (0, []), report["problems"]
    assert {p["role"] for p in report["processes"]} == {"frontend", "engine_core", "worker"}


@pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                    reason="pip install ./tests/plugins/standin")
def test_standin_serves_only_when_the_release_manifest_lists_what_it_needs(standin_model, tmp_path):
    release = _installed_release()
    manifest = _manifest(release)
    status_dir = tmp_path / "status"
    log = tmp_path / "server.log"
    env = _server_env(status_dir, PATCHKIT_STANDIN="1")
    needed = _needed_required_patches(release, {**os.environ, **env})
    assert EXPECTED_NEEDED <= needed, f"the reading of patches/*.yaml lost a patch: {sorted(needed)}"
    listed = {entry["patch"] for entry in (manifest or {}).get("patches", [])}
    missing = sorted(needed - listed)
    print(f"\nvLLM {release}: manifest {'none' if manifest is None else manifest['vllm']}; "
          f"needed {sorted(needed)}; missing {missing}")

    if not missing:
        with serve(standin_model, env=env, extra_args=["--enable-prefix-caching"], log_path=log,
                   timeout=READY_TIMEOUT) as srv:
            first = srv.complete_tokens(PROMPT_129, max_tokens=4)
            second = srv.complete_tokens(PROMPT_129, max_tokens=4)  # a prefix hit, 1-token tail
            tiny = srv.complete_tokens([42], max_tokens=4)
            assert first["choices"][0]["text"] == second["choices"][0]["text"]
            assert tiny["usage"]["prompt_tokens"] == 1
            time.sleep(2.0)  # a periodic flush of the worker's counts
        assert "model class patchkit_standin.model.StandinDeepseekV4ForCausalLM" in log.read_text()
        code, report = _status_json(status_dir)
        assert (code, report["problems"]) == (0, []), report["problems"]
        return

    started = time.monotonic()
    with pytest.raises(ServerError) as refused:
        with serve(standin_model, env=env, extra_args=["--enable-prefix-caching"], log_path=log,
                   timeout=READY_TIMEOUT):
            pytest.fail(f"the stand-in became ready on vLLM {release} without {missing}")
    print(f"refused after {time.monotonic() - started:.0f} s")
    exited = re.search(r"exited with code (-?\d+) before it was ready", str(refused.value))
    assert exited is not None, f"not an exit (a hang?): {refused.value}"
    assert int(exited.group(1)) != 0, str(refused.value)
    text = log.read_text(errors="replace")
    named = [p for p in missing
             if f"required patch {p} is needed here but cannot be applied on vLLM {release}" in text]
    assert named, f"no refusal naming one of {missing} on vLLM {release}; log tail:\n{text[-4000:]}"
    assert "vllm-patchkit pin" in text, text[-4000:]
    code, report = _status_json(status_dir)
    assert code == 1, report
    assert any(named[0] in p and "refused" in p for p in report["problems"]), report["problems"]

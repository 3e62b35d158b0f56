"""A third party's patch set, as its own distribution, in a real serve (issue 12).

tests/plugins/otherset is installed with pip into a folder of its own and put on the server's
PYTHONPATH: `importlib.metadata` sees a real distribution with a `vllm_patchkit.patch_sets`
entry point, while the project's virtualenv (and every other test) stays without it. The set
must be found in every process, pinned by its own manifests, applied in EngineCore, counted,
and shown by `vllm-patchkit status` under its own name; `--set other` narrows to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_patchkit import status
from vllm_patchkit.demo.server import serve

pytestmark = pytest.mark.e2e

OTHERSET = Path(__file__).resolve().parents[1] / "plugins" / "otherset"


@pytest.fixture(scope="module")
def otherset_site(tmp_path_factory):
    target = tmp_path_factory.mktemp("otherset-site")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(OTHERSET)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(target.glob("vllm_patchkit_otherset-*.dist-info")), list(target.iterdir())
    return target


def test_a_third_party_set_is_found_applied_counted_and_shown_under_its_name(tiny_model, tmp_path, otherset_site):
    status_dir = tmp_path / "status"
    path = os.pathsep.join(x for x in (str(otherset_site), os.environ.get("PYTHONPATH", "")) if x)
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5", "PYTHONPATH": path}
    with serve(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        for i in range(6):
            assert server.complete(f"Count {i}:", max_tokens=10)["choices"][0]["text"] is not None
        time.sleep(2.0)  # EngineCore is force-killed on shutdown: let a periodic flush land
    run = status.load_run(status_dir)
    rows = {(p["role"], r["patch"]): r for p in run.processes for r in p["patches"]}
    other = {k: r for k, r in rows.items() if r.get("patch_set") == "other"}
    assert {role for role, _ in other} == {"frontend", "engine_core", "worker"}  # found in every process
    ec = other[("engine_core", "other.schedule-counter@1")]
    assert ec["state"] == "applied" and ec["calls"] > 0, ec
    assert other[("worker", "other.schedule-counter@1")]["code"] == "process"
    assert rows[("engine_core", "core.steps.engine-core@1")]["patch_set"] == "core"
    assert rows[("worker", "batch-dispatch-override@1")]["patch_set"] == "deepseek-v4"
    cli = subprocess.run([sys.executable, "-m", "vllm_patchkit.cli", "status", "--dir", str(status_dir), "--json",
                          "--set", "other"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    shown = {r["patch_set"] for p in json.loads(cli.stdout)["processes"] for r in p["patches"]}
    assert shown == {"other"}
    table = subprocess.run([sys.executable, "-m", "vllm_patchkit.cli", "status", "--dir", str(status_dir)],
                           capture_output=True, text=True, timeout=120).stdout
    assert "other.schedule-counter@1" in table and "deepseek-v4" in table

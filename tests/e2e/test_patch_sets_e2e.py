"""A third party's patch set, as its own distribution, in a real serve (issue 12).

tests/plugins/otherset is installed with pip into a folder of its own and put on the server's
PYTHONPATH: `importlib.metadata` sees a real distribution with a `vllm_patchkit.patch_sets`
entry point, while the project's virtualenv (and every other test) stays without it. The set
must be found in every process, pinned by its own manifests, applied in EngineCore, counted,
and shown by `vllm-patchkit status` under its own name; `--set other` narrows to it. Its own
pytest run (tests/plugins/otherset/pytest.ini: `patchkit_sets = other`) must get the framework's
lifecycle permutations and its manifest's contract items, and fail on a wrong pin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.releases import INSTALLED
from vllm_patchkit.reporting import run_folder
from vllm_patchkit.tools.serve.server import serve

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


def run_set_tests(site: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m pytest` in the set's own folder, the set on PYTHONPATH; outcomes by junit
    "classname::name" (junit writes a node id's `::` parts but the last as dots)."""
    junit = tmp_path / f"junit-{len(list(tmp_path.glob('junit-*')))}.xml"
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONPATH": path, "VLLM_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                           f"--junitxml={junit}", *args], cwd=OTHERSET, env=env, capture_output=True, text=True,
                          timeout=900)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = "failed" if failed else (
            "skipped" if case.find("skipped") is not None else "passed")
    return proc, outcomes


def test_the_sets_own_pytest_run_gets_lifecycle_and_contract_items(otherset_site, tmp_path):
    proc, outcomes = run_set_tests(otherset_site, tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    lifecycle = {k: v for k, v in outcomes.items() if k.startswith("vllm-patchkit.other.lifecycle::")}
    contracts = {k: v for k, v in outcomes.items() if k.startswith(f"vllm-patchkit.other.vllm-{INSTALLED}.yaml")}
    # one patch (engine_core only) x 2 import orders x 4 steps; its pin + the completeness item
    assert len(lifecycle) == 8 and set(lifecycle.values()) == {"passed"}, lifecycle
    assert len(contracts) == 2 and set(contracts.values()) == {"passed"}, contracts
    assert f"vllm-patchkit.other.vllm-{INSTALLED}.yaml.other.schedule-counter@1::vllm.v1.core.sched.scheduler:" \
           "Scheduler.schedule" in contracts, contracts
    assert "PASSED vllm-patchkit::other::lifecycle::other.schedule-counter[engine_core][import-after]::unpatch" \
        in proc.stdout
    proc, marked = run_set_tests(otherset_site, tmp_path, "-m", "patchkit_contract")
    assert proc.returncode == 0 and set(marked) == set(contracts), marked


def test_a_wrong_pin_of_the_set_fails_its_contract_and_lifecycle(otherset_site, tmp_path):
    import yaml

    manifest = yaml.safe_load((OTHERSET / "patchkit_otherset" / "manifests" / f"vllm-{INSTALLED}.yaml").read_text())
    pin = manifest["patches"][0]["targets"]["vllm.v1.core.sched.scheduler:Scheduler.schedule"]
    pin["signature"] = pin["signature"][:-1] + ", *, extra_required)"  # wrong on purpose
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / f"vllm-{INSTALLED}.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    # the `=` form: a space-separated value would be taken for a path by pytest's early rootdir search
    proc, outcomes = run_set_tests(otherset_site, tmp_path, f"--patchkit-manifest-dir={mdir}",
                                   "-k", "import-before and ::patch and not twice and not unpatch or yaml")
    assert proc.returncode == 1, proc.stdout[-6000:]
    failed = sorted(k for k, v in outcomes.items() if v == "failed")
    assert len(failed) == 2, outcomes  # the pin item and the first lifecycle step
    assert "parameter 'extra_required' removed" in proc.stdout
    assert "RequiredPatchFailed: vllm-patchkit: required patch other.schedule-counter@1 failed" in proc.stdout
    assert outcomes[f"vllm-patchkit.other.vllm-{INSTALLED}.yaml::complete"] == "passed", outcomes


def test_a_third_party_set_is_found_applied_counted_and_shown_under_its_name(tiny_model, tmp_path, otherset_site):
    status_dir = tmp_path / "status"
    path = os.pathsep.join(x for x in (str(otherset_site), os.environ.get("PYTHONPATH", "")) if x)
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5", "PYTHONPATH": path}
    with serve(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        for i in range(6):
            assert server.complete(f"Count {i}:", max_tokens=10)["choices"][0]["text"] is not None
        time.sleep(2.0)  # EngineCore is force-killed on shutdown: let a periodic flush land
    run = run_folder.load_run(status_dir)
    rows = {(p["role"], r["patch"]): r for p in run.processes for r in p["patches"]}
    other = {k: r for k, r in rows.items() if r.get("patch_set") == "other"}
    assert {role for role, _ in other} == {"frontend", "engine_core", "worker"}  # found in every process
    ec = other[("engine_core", "other.schedule-counter@1")]
    assert ec["state"] == "applied" and ec["calls"] > 0, ec
    assert other[("worker", "other.schedule-counter@1")]["code"] == "process"
    assert rows[("engine_core", "core.steps.engine-core@1")]["patch_set"] == "core"
    assert rows[("worker", "batch-dispatch-override@1")]["patch_set"] == "deepseek-v4"
    cli = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--dir", str(status_dir), "--json",
                          "--set", "other"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    shown = {r["patch_set"] for p in json.loads(cli.stdout)["processes"] for r in p["patches"]}
    assert shown == {"other"}
    table = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--dir", str(status_dir)],
                           capture_output=True, text=True, timeout=120).stdout
    assert "other.schedule-counter@1" in table and "deepseek-v4" in table

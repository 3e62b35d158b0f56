"""`check`/`pin` never import a target in the checking process; `--live` does, in a child whose death is a
finding. The target here is real: vLLM's ROCm platform (`vllm.platforms.rocm` imports `vllm._C`), under the
simulated CPU without AVX-512 of tests/cpu_sim (an import of `vllm._C` aborts the process, as the illegal
instruction does on such a CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TARGET = "vllm.platforms.rocm:RocmPlatform.check_and_update_config"


@pytest.fixture
def rocm_set(tmp_path):
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir(), mdir.mkdir()
    (pdir / "rocm-config.yaml").write_text(yaml.safe_dump({
        "id": "rocm-config", "version": 1, "summary": "a passthrough on the ROCm platform's config hook",
        "why": "a plugin for ROCm observes the platform's config hook", "upstream": "none: test",
        "retire_when": {"manual": "test"}, "kind": "wrap", "target": TARGET, "processes": ["frontend"],
        "required": True, "when": {"platform": ["rocm"]}}))
    return pdir, mdir


def _run(args, simulate: bool):
    env = {**os.environ}
    if simulate:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests" / "cpu_sim"), env.get("PYTHONPATH")]))
        env["PATCHKIT_SIMULATE_NO_AVX512"] = "1"
    return subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


def test_the_simulated_cpu_kills_an_import_of_the_rocm_platform():
    """The guard bites: without isolation the process dies by SIGABRT with no exception to catch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "cpu_sim"), "PATCHKIT_SIMULATE_NO_AVX512": "1"}
    died = subprocess.run([sys.executable, "-c", "import vllm.platforms.rocm"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert died.returncode == -6, (died.returncode, died.stderr[-500:])


def test_pin_and_check_read_a_rocm_target_statically_on_a_cpu_without_avx512(rocm_set):
    pdir, mdir = rocm_set
    pinned = _run(["pin", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)], simulate=True)
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    manifest = next(mdir.glob("vllm-*.yaml"))
    assert TARGET in manifest.read_text()
    checked = _run(["check", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)], simulate=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 ok" in checked.stdout and "(static" in checked.stdout


def test_check_live_reports_the_module_whose_import_killed_the_child(rocm_set):
    pdir, mdir = rocm_set
    assert _run(["pin", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)], simulate=False).returncode == 0
    live = _run(["check", "--live", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)], simulate=True)
    assert live.returncode == 1, live.stdout + live.stderr
    assert "died by SIGABRT while importing vllm.platforms.rocm" in live.stderr, live.stderr[-800:]
    assert "without --live" in live.stderr

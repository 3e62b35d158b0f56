"""The pytest plugin: off by default; enabled, one test per pin of the installed vLLM's manifest.

Each run is a fresh `python -m pytest` in an empty folder, so the only items are
the plugin's (it is loaded through the installed `pytest11` entry point).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from vllm_patchkit.contracts import installed_root, installed_version
from vllm_patchkit.declare import builtin_patch_dirs, manifest_dirs

pytestmark = pytest.mark.skipif(installed_root() is None, reason="vLLM is not installed")


def run_pytest(folder, *args, timeout=300):
    env = {**os.environ, "VLLM_PLUGINS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def shipped_manifest() -> dict:
    """The installed release's manifest as the plugin sees it: every patch set's, merged."""
    merged = {"vllm": installed_version(), "generated_by": "test (merged)", "patches": [], "not_applicable": []}
    for d in manifest_dirs(builtin_patch_dirs()):
        path = d / f"vllm-{installed_version()}.yaml"
        if path.exists():
            doc = yaml.safe_load(path.read_text())
            merged["patches"] += doc["patches"]
            merged["not_applicable"] += doc.get("not_applicable", [])
    return merged


def test_disabled_by_default(tmp_path):
    r = run_pytest(tmp_path, "--collect-only", "-q")
    assert r.returncode == 5, r.stdout + r.stderr  # no tests collected
    assert "vllm-patchkit" not in r.stdout


def test_enabled_one_item_per_pinned_target(tmp_path):
    m = shipped_manifest()
    pins = [(e["patch"], spec) for e in m["patches"] for spec in e["targets"]]
    r = run_pytest(tmp_path, "--patchkit-contracts", "--collect-only", "-q")
    ids = [line for line in r.stdout.splitlines() if line.startswith("vllm-patchkit::")]
    assert len(ids) == len(pins) + 1, r.stdout
    stem = f"vllm-{installed_version()}.yaml"
    assert f"vllm-patchkit::{stem}::complete" in ids
    for patch, spec in pins:
        assert f"vllm-patchkit::{stem}::{patch}::{spec}" in ids


def test_enabled_by_ini_option_and_all_pass(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\npatchkit_contracts = true\n")
    r = run_pytest(tmp_path, "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    n = sum(len(e["targets"]) for e in shipped_manifest()["patches"]) + 1
    assert f"{n} passed" in r.stdout


def test_a_wrong_pin_fails_with_the_explanation(tmp_path):
    m = shipped_manifest()
    entry, spec, pin = next((e, spec, pin) for e in m["patches"] for spec, pin in e["targets"].items()
                            if "*" not in pin.get("signature", "*"))
    pin["signature"] = pin["signature"][:-1] + ", *, extra_required)"  # a pin that is wrong on purpose
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / f"vllm-{installed_version()}.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    r = run_pytest(tmp_path, "--patchkit-contracts", "--patchkit-manifest-dir", str(mdir), "-q",
                   "-m", "patchkit_contract")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed" in r.stdout
    assert f"{spec}: parameter 'extra_required' removed" in r.stdout
    assert f"FAILED vllm-patchkit::vllm-{installed_version()}.yaml::{entry['patch']}::{spec}" in r.stdout


def test_an_incomplete_manifest_fails(tmp_path):
    m = shipped_manifest()
    dropped = m["patches"].pop()["patch"].split("@")[0]
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / f"vllm-{installed_version()}.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    r = run_pytest(tmp_path, "--patchkit-contracts", "--patchkit-manifest-dir", str(mdir), "-q", "-k", "complete")
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert f"neither lists nor marks not applicable: {dropped}" in r.stdout


def test_no_manifest_for_the_installed_vllm_is_one_failure(tmp_path):
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    r = run_pytest(tmp_path, "--patchkit-contracts", "--patchkit-manifest-dir", str(mdir), "-q")
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert f"no manifest pins vLLM {installed_version()}" in r.stdout

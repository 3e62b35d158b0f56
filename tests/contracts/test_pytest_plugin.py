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

from vllm_patchkit.upstream.installed import installed_root, installed_version
from vllm_patchkit.declaration.declare import installed_sources, manifest_dirs

pytestmark = pytest.mark.skipif(installed_root() is None, reason="vLLM is not installed")


def run_pytest(folder, *args, timeout=300):
    env = {**os.environ, "VLLM_PLUGINS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def shipped_manifest() -> dict:
    """The installed release's manifest as the plugin sees it: every patch set's, merged."""
    merged = {"vllm": installed_version(), "generated_by": "test (merged)", "patches": [], "not_applicable": []}
    for d in manifest_dirs(installed_sources()):
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


# -- patchkit_sets: a set's lifecycle permutations and its own contracts, by entry-point name ------


def test_disabled_imports_neither_vllm_nor_the_harness(tmp_path):
    """The plugin is loaded in every pytest session of anyone with vllm-patchkit installed."""
    (tmp_path / "test_probe.py").write_text(
        "import sys\n\ndef test_probe():\n"
        "    assert 'vllm' not in sys.modules and 'vllm_patchkit.tools.testing' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith('vllm'))\n")
    r = run_pytest(tmp_path, "-q")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_the_runtime_does_not_import_pytest():
    code = ("import sys, vllm_patchkit.runtime.plugin, vllm_patchkit.tools.testing, vllm_patchkit.runtime.loader; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest', 'hypothesis')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _ids(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("vllm-patchkit::")]


def test_one_ini_line_generates_lifecycle_and_contract_items(tmp_path):
    from vllm_patchkit.tools.testing import STEPS, lifecycle_cases

    (tmp_path / "pytest.ini").write_text("[pytest]\npatchkit_sets = deepseek-v4\n")
    cases = lifecycle_cases(["deepseek-v4"])
    assert cases and {c.set for c in cases} == {"deepseek-v4"}
    r = run_pytest(tmp_path, "--collect-only", "-q", "-m", "patchkit_lifecycle")
    ids = _ids(r.stdout)
    assert len(ids) == len(cases) * len(STEPS), r.stdout + r.stderr
    assert all(i.startswith("vllm-patchkit::deepseek-v4::lifecycle::") for i in ids)
    case = cases[0]
    assert {f"vllm-patchkit::deepseek-v4::lifecycle::{case.id}::{s}" for s in STEPS} <= set(ids)
    r = run_pytest(tmp_path, "--collect-only", "-q", "-m", "patchkit_contract")
    ids = _ids(r.stdout)
    own = [e for e in shipped_manifest()["patches"] if not e["patch"].startswith("core.")]
    assert len(ids) == sum(len(e["targets"]) for e in own) + 1, r.stdout  # the set's own pins only
    assert f"vllm-patchkit::deepseek-v4::vllm-{installed_version()}.yaml::complete" in ids


def test_the_option_names_the_set_and_an_unknown_one_fails_once(tmp_path):
    r = run_pytest(tmp_path, "--patchkit-set", "core", "--collect-only", "-q")
    ids = _ids(r.stdout)
    assert any("::core::lifecycle::" in i for i in ids) and any("::core::vllm-" in i for i in ids), r.stdout
    r = run_pytest(tmp_path, "--patchkit-set", "no-such-set", "-q")
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert "no such patch set" in r.stdout and "installed: core" in r.stdout


def test_a_manifest_dir_replaces_one_sets_manifests_only(tmp_path):
    r = run_pytest(tmp_path, "--patchkit-set", "core", "--patchkit-set", "deepseek-v4",
                   f"--patchkit-manifest-dir={tmp_path}", "--collect-only", "-q")
    assert r.returncode != 0 and "name one set" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_lifecycle_items_of_one_patch_run_and_pass(tmp_path):
    """One import-stage patch through the plugin: its cases run in forked children and pass."""
    r = run_pytest(tmp_path, "--patchkit-set", "core", "-q", "-rA", "-m", "patchkit_lifecycle",
                   "-k", "core.steps.engine-core[", timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "8 passed" in r.stdout

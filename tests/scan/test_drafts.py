"""`scan --write` on a real registry plugin: every draft validates with the real schema, stubs forward, and
`vllm-patchkit pin --dry-run` runs on the drafted folder (its implementations imported from DIR)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import validate, write
from vllm_patchkit.tools.scan.recall import fetch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def flash_head():
    path, why = fetch("flash-head", "0.1.10")
    if path is None:
        pytest.skip(why)
    return path


def test_write_validates_and_pins(tmp_path, flash_head, upstream):
    result = scan(str(flash_head), upstream=upstream)
    folder, written, rejected = write(result, tmp_path)
    assert not rejected
    yamls = sorted(folder.glob("*.yaml"))
    assert len(yamls) == sum(1 for s in result.sites if s.declare) == 6
    for y in yamls:
        p = validate(y.read_text())
        assert p.why.startswith("TODO") and p.required is True and p.draft is True
    assert (folder / "manifests").is_dir() and not any((folder / "manifests").iterdir())
    ps = load_patch_set([folder])  # valid files; the loader, pin and check refuse the marker
    assert len(ps.patches) == 6
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        for p in ps.patches.values():
            mod, _, func = p.implementation.partition(":")
            impl = getattr(importlib.import_module(mod), func)
            assert impl(lambda *a, **k: (a, k), None, (1,), {"x": 2}) == ((1,), {"x": 2})  # forwards verbatim
    finally:
        sys.path.remove(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "pin", "--dry-run", "--patch-dir", str(folder),
                          "--manifest-dir", str(folder / "manifests")], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 1, out.stderr  # the plan is shown; unreviewed drafts are refused by name
    assert out.stdout.count("  list ") == 6 and "n/a" not in out.stdout, out.stdout
    assert out.stderr.count(": draft: drafted by `vllm-patchkit scan --write` and not reviewed") == 6, out.stderr


def test_drafts_of_every_kind_validate(tmp_path, upstream):
    """set (literal, value_from), env_default, replace (calls the plugin's function), subclass, instances."""
    from .conftest import write_plugin

    write_plugin(tmp_path / "src", {"myplug/__init__.py": '''
import os, types
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

class MySched(Scheduler):
    def schedule(self):
        return super().schedule()

def update_from_output(self, *a, **k):
    return {}

def _exec(self, *a, **k):
    return None

def attach(runner: GPUModelRunner):
    runner.execute_model = types.MethodType(_exec, runner)

def register(config):
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    Scheduler.update_from_output = update_from_output
    Scheduler.max_num_running_reqs = 3
    gpu_model_runner.GPUModelRunner = GPUModelRunner
    config.scheduler_config.scheduler_cls = MySched
'''})
    result = scan(str(tmp_path / "src"), upstream=upstream)
    folder, written, rejected = write(result, tmp_path / "out")
    assert not rejected
    docs = {y.stem: yaml.safe_load(y.read_text()) for y in folder.glob("*.yaml")}
    kinds = sorted(d["kind"] for d in docs.values())
    assert kinds == ["env_default", "replace", "set", "set", "subclass", "wrap"], kinds
    sets = sorted(((d.get("value"), d.get("value_from")) for d in docs.values() if d["kind"] == "set"), key=str)
    assert sets == [(3, None), (None, "vllm.v1.worker.gpu_model_runner:GPUModelRunner")], sets
    sub = next(d for d in docs.values() if d["kind"] == "subclass")
    assert sub["implementation"] == "myplug:MySched" and sub["overrides"] == ["schedule"]
    assert sub["config_field"] == "scheduler_config.scheduler_cls"
    assert next(d for d in docs.values() if d["kind"] == "wrap")["instances"] is True
    rep = next(d for d in docs.values() if d["kind"] == "replace")
    sys.path[:0] = [str(tmp_path / "out"), str(tmp_path / "src")]
    try:
        import importlib

        mod, _, func = rep["implementation"].partition(":")
        assert getattr(importlib.import_module(mod), func)(None) == {}  # calls the plugin's own function
    finally:
        del sys.path[:2]

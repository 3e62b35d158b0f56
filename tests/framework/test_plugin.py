"""The entry point as vLLM calls it, in a fresh process: env vars registered, one log line, records."""

from __future__ import annotations

from tests.releases import INSTALLED

import json
import os
import subprocess
import sys

SCRIPT = r"""
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import vllm.envs as venvs
import vllm.v1.engine.core  # as in EngineCore.__init__, which loads the plugins: targets not imported wait for their import
from vllm_patchkit.runtime import plugin, state as runtime
plugin.register()
loader = runtime.current()
print("REGISTERED", sorted(n for n in venvs.environment_variables if n.startswith("VLLM_PATCHKIT_")))
print("STATES", {k: r.state for k, r in loader.records.items()})
"""


def _run(env_extra):
    env = {**os.environ, "VLLM_PATCHKIT_ROLE": "engine_core", **env_extra}
    env.pop("VLLM_PATCHKIT_RUN_ID", None)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)


def test_register_declares_env_vars_logs_one_line_and_writes_a_record(tmp_path):
    out = _run({"VLLM_PATCHKIT_STATUS_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    registered = eval(out.stdout.split("REGISTERED ", 1)[1].splitlines()[0])
    for name in ("VLLM_PATCHKIT_STATUS_DIR", "VLLM_PATCHKIT_FLUSH_SECONDS", "VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS"):
        assert name in registered  # the last one is declared by the KV hook's YAML
    summary = [line for line in (out.stdout + out.stderr).splitlines() if "vllm-patchkit: role=engine_core" in line]
    assert len(summary) == 1 and f"stage=import manifest=vllm-{INSTALLED}.yaml applied=" in summary[0]
    [run] = list(tmp_path.iterdir())
    [record] = list(run.iterdir())
    data = json.loads(record.read_text())
    assert data["role"] == "engine_core" and record.name == f"engine_core-{data['pid']}.json"
    states = {p["patch"].split("@")[0]: p["state"] for p in data["patches"]}
    assert states["core.config-ready.engine-core"] == "applied"
    assert states["kv-config-hook"] == "pending"  # config stage: judged when EngineCore builds its executor


def test_disable_switch_applies_nothing(tmp_path):
    out = _run({"VLLM_PATCHKIT_STATUS_DIR": str(tmp_path), "VLLM_PATCHKIT_DISABLE": "1"})
    assert "disabled by VLLM_PATCHKIT_DISABLE=1" in out.stdout + out.stderr
    assert not list(tmp_path.iterdir())


def test_counting_can_be_turned_off_globally(tmp_path, monkeypatch):
    from .helpers import make_loader, patch_doc, pinned_entry

    import vllm.v1.core.kv_cache_utils as kvu

    spec = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    monkeypatch.setenv("VLLM_PATCHKIT_COUNT_CALLS", "0")
    loader = make_loader(tmp_path, {"kv": patch_doc(id="kv", kind="wrap", target=spec, processes=["frontend"])},
                         [pinned_entry("kv@1", spec)])
    loader.run_import_stage()
    try:
        try:
            kvu.get_kv_cache_configs()
        except TypeError:
            pass
        loader.sync_calls()
        assert loader.records["kv"].state == "applied" and loader.records["kv"].calls == 0
    finally:
        loader.unpatch()


COMPILE_KEY = r"""
import os, sys
os.environ["VLLM_PATCHKIT_RUN_ID"] = sys.argv[1]
os.environ["VLLM_PATCHKIT_STATUS_DIR"] = sys.argv[2]
import vllm.envs as venvs
from vllm_patchkit.declaration import envs
from vllm_patchkit.declaration.knobs import KNOBS
envs.register(KNOBS, constant=True)
print("FACTORS", sorted((k, repr(v)) for k, v in venvs.compile_factors().items() if "PATCHKIT" in k))
"""


def test_framework_knobs_never_change_vllms_compile_cache_key(tmp_path):
    """Regression: registering VLLM_PATCHKIT_RUN_ID with its real value put a value that is new for
    every server start into vLLM's torch.compile cache key, so every start recompiled the model."""
    outs = []
    for run_id, status in (("run-a", str(tmp_path / "a")), ("run-b", str(tmp_path / "b"))):
        out = subprocess.run([sys.executable, "-c", COMPILE_KEY, run_id, status], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        outs.append(out.stdout.split("FACTORS ", 1)[1].splitlines()[0])
    assert outs[0] == outs[1]
    assert "VLLM_PATCHKIT_RUN_ID" in outs[0]  # registered (vLLM knows it), but constant


def test_role_detection_relies_only_on_pinned_callers():
    """Issue 12: every caller process.py recognises a role by is a pinned `uses` of the framework's
    config-ready hooks, and every shipped manifest pins it (so its drift is caught by check)."""
    from vllm_patchkit.tools.manifest_files import read_manifests
    from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
    from vllm_patchkit.declaration.patchsets import core_set
    from vllm_patchkit.runtime.process import CALLERS

    core = core_set()
    ps = load_patch_set([core])
    used = {u for p in ps.patches.values() if p.config_ready for u in p.uses}
    assert {spec for spec, _ in CALLERS} == used
    manifests, _ = read_manifests(manifest_dirs([core]), ps)
    for version, m in manifests.items():
        pinned = {spec for e in m.patches for spec in e.targets}
        assert used <= pinned, (version, used - pinned)


def test_every_framework_knob_is_a_valid_env_var_declaration():
    """The knobs are made without the validating schema (start-up never runs it): each must still be what the
    schema accepts for an `EnvVar` (a name of the declared pattern, a text), and none is declared twice."""
    import msgspec

    from vllm_patchkit.declaration import validation
    from vllm_patchkit.declaration.knobs import KNOBS
    from vllm_patchkit.declaration.schema import EnvVar

    names = [validation.validate(EnvVar, msgspec.to_builtins(k)).name for k in KNOBS]
    assert len(names) == len(set(names)) and all(n.startswith("VLLM_PATCHKIT_") for n in names)

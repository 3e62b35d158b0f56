"""Lazy targets: a target module not imported when its stage runs is verified, applied and recorded when vLLM
imports it, never imported early; a required fix applied nowhere never reads as OK.

Import order is process state, so each case runs in a fresh interpreter (the real vLLM 0.31 modules; none of
the targets below is imported by `import vllm`). The pins are taken from the installed release here, in the
test process, and written into a manifest the child reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

from vllm_patchkit.reporting.run_folder import load_run
from vllm_patchkit.reporting.verdict import BAD, OK, assess

from .helpers import patch_doc, pinned_entry, write_manifest, write_patch

KVU = "vllm.v1.core.kv_cache_utils"
KV = f"{KVU}:get_kv_cache_configs"
KV_COPY = "vllm.v1.engine.core:get_kv_cache_configs"

CHILD = r"""
import json, sys
from pathlib import Path
import vllm
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.runtime.lazy import HOOK

tmp = Path(sys.argv[1])
ps = load_patch_set([tmp / "patches"])
loader = Loader(ps, load_manifests([tmp / "manifests"], ps), role="frontend", status_dir=tmp / "status",
                vllm_version="0.31.0", lazy=True)
out = {}
def state(pid="kv"):
    r = loader.records[pid]
    return {"state": str(r.state), "code": r.code, "reason": r.reason, "detail": {k: str(v) for k, v in r.detail.items()},
            "warning": r.warning}
loader.run_import_stage()
out["at_stage"] = state()
out["imported_at_stage"] = "%(kvu)s" in sys.modules
out["hooked"] = HOOK in sys.meta_path
%(action)s
print("RESULT" + json.dumps(out))
"""


def _child(tmp_path, action: str, run_id: str) -> dict:
    script = CHILD % {"kvu": KVU, "action": textwrap.dedent(action)}
    env = {**os.environ, "VLLM_PATCHKIT_RUN_ID": run_id, "VLLM_PATCHKIT_CACHE_DIR": str(tmp_path / "cache"),
           "VLLM_PATCHKIT_FLUSH_SECONDS": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _write(tmp_path, required: bool = True, entry: dict | None = None) -> None:
    doc = patch_doc(id="kv", kind="wrap", target=KV, copies=[KV_COPY], processes=["frontend"], required=required,
                    expected_calls="per_step")
    write_patch(tmp_path / "patches", "kv", doc)
    write_manifest(tmp_path / "manifests", [entry or pinned_entry("kv@1", KV, KV_COPY)])


def _status(tmp_path):
    run = load_run(tmp_path / "status")
    return run, assess(run)


def _run_id() -> str:
    return f"lazy-{uuid.uuid4().hex[:8]}"


IMPORT_AND_CALL = """
import vllm.v1.engine.core as core   # imports kv_cache_utils first: the hook patches it, core takes the wrapper
import vllm.v1.core.kv_cache_utils as kvu
fn = kvu.get_kv_cache_configs
out["after_import"] = state()
out["marked"] = getattr(fn, "__vllm_patchkit__", None)
out["wraps_upstream"] = getattr(fn.__wrapped__, "__module__", None) == "vllm.v1.core.kv_cache_utils"
out["copy_is_wrapper"] = core.get_kv_cache_configs is fn
out["loader_restored"] = type(kvu.__loader__).__name__ + "/" + type(kvu.__spec__.loader).__name__
out["hooked_after"] = HOOK in sys.meta_path
try:
    core.get_kv_cache_configs()      # vLLM's own arity error, counted on the way through
except TypeError:
    pass
loader.flush()
out["calls"] = loader.records["kv"].calls
"""


def test_module_imported_after_register_is_patched_verified_and_counted_then(tmp_path):
    _write(tmp_path)
    out = _child(tmp_path, IMPORT_AND_CALL, _run_id())
    assert out["imported_at_stage"] is False  # the loader did not import the target
    assert out["at_stage"]["state"] == "not_imported" and KVU in out["at_stage"]["reason"]
    assert out["hooked"] is True
    after = out["after_import"]
    assert after["state"] == "applied", after
    assert after["detail"]["lazy"] == f"applied when {KVU} was imported"
    assert out["marked"] == "kv@1" and out["wraps_upstream"] is True
    assert out["copy_is_wrapper"] is True  # the copy's module imported after the patch: it holds the wrapper
    assert out["loader_restored"] == "SourceFileLoader/SourceFileLoader"  # the module looks normally imported
    assert out["hooked_after"] is False  # nothing left to watch: the finder is gone
    assert out["calls"] == 1
    run, (code, problems) = _status(tmp_path)
    [proc] = run.processes
    [rec] = proc["patches"]
    assert rec["state"] == "applied" and rec["calls"] == 1  # flushed: the file says what the process did
    assert code == OK, problems


def test_never_imported_required_patch_is_not_imported_and_fails_the_status(tmp_path):
    _write(tmp_path)
    out = _child(tmp_path, "loader.flush()\nout['end'] = state()\nout['imported_end'] = %r in sys.modules" % KVU,
                 _run_id())
    assert out["end"]["state"] == "not_imported" and out["imported_end"] is False
    run, (code, problems) = _status(tmp_path)
    [rec] = run.processes[0]["patches"]
    assert rec["state"] == "not_imported"
    assert code == BAD
    assert any("kv@1" in p and "applied in no process" in p for p in problems), problems
    from vllm_patchkit.reporting.status import render

    assert "not_imported, APPLIED NOWHERE" in render(run)


def test_not_imported_in_one_process_applied_in_another_is_ok_and_optional_never_fails(tmp_path):
    _write(tmp_path)
    rid = _run_id()
    _child(tmp_path, "loader.flush()", rid)  # a process that never imports the module
    _child(tmp_path, IMPORT_AND_CALL, rid)  # one that does: the fix is in effect where the code runs
    run, (code, problems) = _status(tmp_path)
    assert sorted(p["patches"][0]["state"] for p in run.processes) == ["applied", "not_imported"]
    assert code == OK, problems

    optional = tmp_path / "optional"
    _write(optional, required=False)
    _child(optional, "loader.flush()", _run_id())
    run, (code, problems) = _status(optional)
    assert run.processes[0]["patches"][0]["state"] == "not_imported" and code == OK, problems


WRONG_PIN_IMPORT = """
errors = []
for attempt in range(2):   # a caller that catches the error and imports again must fail again
    try:
        import vllm.v1.core.kv_cache_utils
        errors.append(None)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
out["errors"] = errors
out["in_sys_modules"] = %r in sys.modules
out["after_import"] = state()
out["error"] = loader.process.error
""" % KVU


def _wrong_pin() -> dict:
    entry = pinned_entry("kv@1", KV, KV_COPY)
    entry["targets"][KV]["signature"] = "(vllm_config, kv_cache_specs)"  # as if upstream had dropped a parameter
    return entry


def test_wrong_pin_fails_the_import_with_the_refusal_and_the_status(tmp_path):
    _write(tmp_path, entry=_wrong_pin())
    out = _child(tmp_path, WRONG_PIN_IMPORT, _run_id())
    assert out["at_stage"]["state"] == "not_imported"  # not verifiable before the module exists
    first, second = out["errors"]
    for err in (first, second):
        assert err is not None and err.startswith("RequiredPatchFailed: vllm-patchkit: required patch kv@1 failed")
    assert "vLLM start-up stopped" in first
    assert out["in_sys_modules"] is False  # the failed import left no half-patched module behind
    assert out["after_import"]["state"] == "failed" and out["after_import"]["code"] == "fingerprint"
    assert out["error"] and "kv@1" in out["error"]
    run, (code, problems) = _status(tmp_path)
    [rec] = run.processes[0]["patches"]
    assert rec["state"] == "failed" and code == BAD
    assert any("kv@1" in p and "required patch failed" in p for p in problems), problems


def test_wrong_pin_of_an_optional_patch_warns_and_the_import_succeeds(tmp_path):
    _write(tmp_path, required=False, entry=_wrong_pin())
    out = _child(tmp_path, WRONG_PIN_IMPORT, _run_id())
    assert out["errors"] == [None, None] and out["in_sys_modules"] is True
    assert out["after_import"]["state"] == "failed" and "failed when" in out["after_import"]["warning"]
    run, (code, problems) = _status(tmp_path)
    assert run.processes[0]["patches"][0]["state"] == "failed" and code == OK, problems


def test_unpatch_drops_the_pending_hook(tmp_path):
    _write(tmp_path)
    out = _child(tmp_path, """
loader.unpatch()
out["hooked_after_unpatch"] = HOOK in sys.meta_path
out["after_unpatch"] = state()
import vllm.v1.core.kv_cache_utils as kvu
out["marked"] = getattr(kvu.get_kv_cache_configs, "__vllm_patchkit__", None)
out["after_import"] = state()
""", _run_id())
    assert out["hooked_after_unpatch"] is False
    assert out["after_unpatch"]["state"] == out["after_import"]["state"] == "pending"
    assert out["marked"] is None


def test_plugin_in_a_worker_patches_the_gpu_worker_when_the_cpu_worker_imports_it(tmp_path):
    """The production path: register() as vLLM calls it in a worker imports no GPU worker stack."""
    script = r"""
import json, sys
import vllm, vllm.engine.arg_utils, vllm.v1.worker.worker_base
from vllm_patchkit.runtime import plugin, state as runtime
before = set(sys.modules)
plugin.register()
loader = runtime.current()
out = {"new_vllm": sorted(m for m in set(sys.modules) - before if m.startswith("vllm.")),
       "steps_at_register": str(loader.records["core.steps.worker"].state)}
import vllm.v1.worker.cpu_worker
from vllm.v1.worker.gpu_worker import Worker
out["steps_after"] = str(loader.records["core.steps.worker"].state)
out["marked"] = getattr(Worker.__dict__["execute_model"], "__vllm_patchkit__", None)
print("RESULT" + json.dumps(out))
"""
    env = {**os.environ, "VLLM_PATCHKIT_ROLE": "worker", "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status"),
           "VLLM_PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), "VLLM_PATCHKIT_FLUSH_SECONDS": "0"}
    env.pop("VLLM_PATCHKIT_RUN_ID", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
    assert out["new_vllm"] == []  # no vLLM module imported by register() itself
    assert out["steps_at_register"] == "not_imported"
    assert out["steps_after"] == "applied" and out["marked"] == "core.steps.worker@1"


# -- declared copies whose module imports later and still holds the original --------------------------------------
def test_late_copy_holding_the_original_is_patched_when_its_module_imports(tmp_path, monkeypatch):
    """vLLM has no such place (a copy imported later takes the wrapper by value), so this one is built: a
    registry captures the original when the target module executes, a later module copies it from there."""
    from vllm_patchkit.runtime.lazy import HOOK
    from vllm_patchkit.runtime.loader import Loader
    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.declaration.manifest import load_manifests

    tag = uuid.uuid4().hex[:8]
    reg, tgt, cp = f"lz_reg_{tag}", f"lz_tgt_{tag}", f"lz_copy_{tag}"
    (tmp_path / f"{reg}.py").write_text("FUNCS = {}\n")
    (tmp_path / f"{tgt}.py").write_text(f"def f(x):\n    return x + 1\n\nimport {reg}\n{reg}.FUNCS['f'] = f\n")
    (tmp_path / f"{cp}.py").write_text(f"import {reg}\nf = {reg}.FUNCS['f']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = pinned_entry("t@1", f"{tgt}:f", f"{cp}:f")  # imports both to take the pins ...
    for m in (reg, tgt, cp):
        sys.modules.pop(m)  # ... then this process is back to "not imported yet"
    write_patch(tmp_path / "patches", "t", patch_doc(id="t", kind="wrap", target=f"{tgt}:f", copies=[f"{cp}:f"],
                                                     processes=["frontend"]))
    write_manifest(tmp_path / "manifests", [entry])
    ps = load_patch_set([tmp_path / "patches"])
    loader = Loader(ps, load_manifests([tmp_path / "manifests"], ps), role="frontend", status_dir=tmp_path / "st",
                    vllm_version="0.31.0", lazy=True)
    try:
        loader.run_import_stage()
        assert loader.records["t"].state == "not_imported"
        import importlib

        target = importlib.import_module(tgt)
        assert loader.records["t"].state == "applied"
        copy = importlib.import_module(cp)
        assert copy.f is target.f and copy.f.__vllm_patchkit__ == "t@1" and copy.f(1) == 2
        assert f"{cp}:f" in loader.records["t"].detail["places"]
        loader.sync_calls()
        assert loader.records["t"].calls == 1
        loader.unpatch()
        assert copy.f is sys.modules[reg].FUNCS["f"]  # the copy is put back too
        assert HOOK not in sys.meta_path
    finally:
        loader.unpatch()
        for m in (reg, tgt, cp):
            sys.modules.pop(m, None)


def test_a_dependent_waits_for_its_dependency_module(tmp_path):
    """`requires` on a patch still waiting for its module: the dependent waits too, then applies after it."""
    dep = patch_doc(id="dep", kind="wrap", target=KV, processes=["frontend"])
    user = patch_doc(id="kv", kind="wrap", target="vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups",
                     processes=["frontend"], requires=["dep"])
    write_patch(tmp_path / "patches", "dep", dep)
    write_patch(tmp_path / "patches", "kv", user)
    write_manifest(tmp_path / "manifests", [pinned_entry("dep@1", KV),
                                            pinned_entry("kv@1", user["target"])])
    out = _child(tmp_path, """
import vllm.v1.core.kv_cache_utils
out["after_import"] = state()
out["dep_after"] = state("dep")
""", _run_id())
    assert out["at_stage"]["state"] == "not_imported" and "requires dep" in out["at_stage"]["reason"]
    assert out["dep_after"]["state"] == "applied" and out["after_import"]["state"] == "applied"


def test_a_use_in_a_waiting_module_imports_nothing_and_both_are_judged_when_vllm_imports_it(tmp_path):
    """`kv` waits for kv_cache_utils; `zz` pins a `uses` there. Verifying `zz` no longer imports the module (it used
    to, and `kv` then had to be judged right away): `zz` applies with that use pending, `kv` waits with its hook,
    and when vLLM imports the module both are judged: `kv` applied, `zz`'s use verified (test_late_uses.py)."""
    envs_fn = "vllm.envs:get_default_cache_root"  # imported by `import vllm`
    write_patch(tmp_path / "patches", "kv", patch_doc(id="kv", kind="wrap", target=KV, processes=["frontend"],
                                                      required=True))
    write_patch(tmp_path / "patches", "zz", patch_doc(id="zz", kind="wrap", target=envs_fn, uses=[KV],
                                                      processes=["frontend"]))
    write_manifest(tmp_path / "manifests", [pinned_entry("kv@1", KV), pinned_entry("zz@1", envs_fn, KV)])
    action = """
out['zz'] = state('zz')
import %s
out['kv_after'] = state('kv')
out['zz_after'] = state('zz')
""" % KVU
    out = _child(tmp_path, action, _run_id())
    assert out["imported_at_stage"] is False and out["zz"]["state"] == "applied"
    assert out["at_stage"]["state"] == "not_imported" and out["hooked"] is True
    assert out["kv_after"]["state"] == "applied"
    assert out["kv_after"]["detail"]["lazy"] == f"applied when {KVU} was imported"
    assert KV in out["zz_after"]["detail"]["uses_verified_on_import"]

"""A `uses` place whose module vLLM has not imported is verified when vLLM imports it, not imported early for the
check (the front end's config-ready hook pins the model registry, which vLLM imports itself while it builds the
config). A pin that no longer matches then takes the patch back and fails it: a required one fails that import,
naming the patch; the status is never left reading `applied` over a callable that changed.

Import order is process state: each case runs in a fresh interpreter on the real vLLM (`import vllm` imports
neither the KV-cache utilities nor the model registry); the pins are taken here and written into a manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from .helpers import patch_doc, pinned_entry, write_manifest, write_patch

TARGET = "vllm.plugins:load_general_plugins"  # imported by `import vllm`
USES_MODULE = "vllm.v1.core.kv_cache_utils"  # not imported by `import vllm`
USES = f"{USES_MODULE}:get_kv_cache_configs"

CHILD = r"""
import json, sys
from pathlib import Path
import vllm, vllm.plugins
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.upstream.targets import resolve

tmp = Path(sys.argv[1])
ps = load_patch_set([tmp / "patches"])
loader = Loader(ps, load_manifests([tmp / "manifests"], ps), role="frontend", status_dir=tmp / "status",
                vllm_version="0.31.0", lazy=True)
def state():
    r = loader.records["uses-late"]
    return {"state": str(r.state), "code": r.code, "reason": r.reason, "detail": {k: str(v) for k, v in r.detail.items()}}
def patched():
    return getattr(resolve("%(target)s").get_raw(), "__vllm_patchkit__", None)
loader.run_import_stage()
out = {"at_stage": state(), "imported_at_stage": "%(module)s" in sys.modules, "patched_at_stage": patched()}
try:
    import %(module)s
    out["import_error"] = None
except Exception as exc:
    out["import_error"] = f"{type(exc).__name__}: {exc}"
out["after_import"] = state()
out["patched_after_import"] = patched()
print("RESULT" + json.dumps(out))
"""


def _run(tmp_path, *, wrong_pin: bool, required: bool = True) -> dict:
    doc = patch_doc(id="uses-late", kind="wrap", target=TARGET, uses=[USES], processes=["frontend"], required=required)
    write_patch(tmp_path / "patches", "uses_late", doc)
    entry = pinned_entry("uses-late@1", TARGET, USES)
    if wrong_pin:
        entry["targets"][USES]["signature"] = "(vllm_config, kv_cache_specs)"  # as if upstream had dropped one
    write_manifest(tmp_path / "manifests", [entry])
    script = CHILD % {"target": TARGET, "module": USES_MODULE}
    env = {**os.environ, "VLLM_PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), "VLLM_PATCHKIT_FLUSH_SECONDS": "0"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


def test_a_use_in_a_module_not_imported_is_verified_when_vllm_imports_it(tmp_path):
    out = _run(tmp_path, wrong_pin=False)
    assert out["imported_at_stage"] is False  # verifying did not import it
    assert out["at_stage"]["state"] == "applied" and out["patched_at_stage"] == "uses-late@1"
    assert out["import_error"] is None
    assert out["after_import"]["state"] == "applied"
    assert USES in out["after_import"]["detail"]["uses_verified_on_import"]


def test_a_changed_use_takes_the_patch_back_and_fails_the_import_that_reveals_it(tmp_path):
    out = _run(tmp_path, wrong_pin=True)
    assert out["at_stage"]["state"] == "applied"
    assert out["import_error"].startswith("RequiredPatchFailed: vllm-patchkit: required patch uses-late@1 failed")
    assert out["after_import"]["state"] == "failed" and out["after_import"]["code"] == "uses"
    assert "taken back" in out["after_import"]["reason"]
    assert out["patched_after_import"] is None  # vLLM's own function stands again


def test_a_changed_use_of_an_optional_patch_takes_it_back_and_the_import_succeeds(tmp_path):
    out = _run(tmp_path, wrong_pin=True, required=False)
    assert out["import_error"] is None
    assert out["after_import"]["state"] == "failed" and out["patched_after_import"] is None

"""Another plugin's object at a target: named as a conflict with its distribution and file:line (issue 21, item 5).

Real vLLM targets; the other plugin is a fake distribution written to tmp_path (`otherplug 1.2`: a package and
its dist-info with a RECORD), put on sys.path, so `importlib.metadata` finds it as an installed distribution.

- At start-up, a target another plugin replaced with `setattr` and a different signature was reported as
  "fingerprint: parameter 'extra' added ... re-pin the release" (naming neither the plugin nor its file, and
  `pin` would write the same pin): now a `conflict` naming the distribution and the file and line.
- A target replaced *after* the loader applied its patch (a plugin loaded later) stayed `applied` with 0 calls
  and `status` exit 0: now the next flush finds the wrapper gone and the row becomes `failed` /
  `replaced_after_apply` naming what stands there; `status` exits 1 for a required patch.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.declaration.errors import RequiredPatchFailed
from vllm_patchkit.runtime.flush import Flusher

from .helpers import make_loader, patch_doc, pinned_entry

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
KV_COPY = "vllm.v1.engine.core:get_kv_cache_configs"

PLUGIN = """
import vllm.v1.core.kv_cache_utils as kvu


def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, extra=None):
    return "theirs"


def register():
    kvu.get_kv_cache_configs = get_kv_cache_configs
"""


@pytest.fixture
def kvu():
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.engine.core as core

    before = (kvu.get_kv_cache_configs, core.get_kv_cache_configs)
    yield kvu
    kvu.get_kv_cache_configs, core.get_kv_cache_configs = before


@pytest.fixture
def otherplug(tmp_path, monkeypatch):
    """A third party's plugin, installed as distribution `otherplug 1.2` in a folder on sys.path."""
    site = tmp_path / "site"
    pkg = site / "otherplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "otherplug-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: otherplug\nVersion: 1.2\n")
    (info / "RECORD").write_text("otherplug/__init__.py,,\notherplug-1.2.dist-info/METADATA,,\n"
                                 "otherplug-1.2.dist-info/RECORD,,\n")
    (info / "top_level.txt").write_text("otherplug\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "otherplug", raising=False)
    import otherplug

    yield otherplug
    sys.modules.pop("otherplug", None)


def kv_patch(required: bool):
    return patch_doc(id="kv", kind="wrap", target=KV, copies=[KV_COPY], processes=["frontend"], required=required)


def _line_of_def(path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("def get_kv"))


def test_a_replacement_by_another_distribution_is_a_conflict_naming_it(tmp_path, kvu, otherplug):
    """Before: `fingerprint` "parameter 'extra' added (...)" and a remedy to re-pin the release."""
    entry = pinned_entry("kv@1", KV, KV_COPY)
    otherplug.register()  # loaded before vllm-patchkit: its object is at the target
    loader = make_loader(tmp_path, {"kv": kv_patch(required=True)}, [entry])
    with pytest.raises(RequiredPatchFailed) as ei:
        loader.run_import_stage()
    rec = loader.records["kv"]
    file = otherplug.__file__
    site = f"otherplug:get_kv_cache_configs at {file}:{_line_of_def(tmp_path / 'site/otherplug/__init__.py')} " \
           "(distribution otherplug 1.2)"
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.found == site and rec.expected == f"vLLM's {KV}"
    assert rec.reason.startswith(f"{KV} was replaced by code outside vLLM: {site}; another plugin put its own object")
    msg = str(ei.value)
    assert "distribution otherplug 1.2" in msg and f"{file}:" in msg
    assert "fingerprint" not in msg and "parameter 'extra'" not in msg and "re-pin" not in msg
    assert "pin --vllm" not in msg  # a new pin reads the same vLLM source: no way out
    assert "VLLM_PLUGINS" in msg
    assert kvu.get_kv_cache_configs is otherplug.get_kv_cache_configs  # never patched over


def test_a_replacement_from_no_installed_distribution_says_so(tmp_path, kvu, monkeypatch):
    (tmp_path / "loose_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "loose_plugin", raising=False)
    import loose_plugin

    entry = pinned_entry("kv@1", KV, KV_COPY)
    loose_plugin.register()
    loader = make_loader(tmp_path / "run", {"kv": kv_patch(required=False)}, [entry])
    loader.run_import_stage()
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.found == (f"loose_plugin:get_kv_cache_configs at {loose_plugin.__file__}:"
                         f"{_line_of_def(tmp_path / 'loose_plugin.py')} (in no installed distribution)")
    sys.modules.pop("loose_plugin", None)


def _status(tmp_path):
    run = run_folder.load_run(tmp_path / "status")
    return verdict.assess(run), json.loads(status.to_json(run))


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_a_target_replaced_after_apply_is_a_failure_at_the_next_flush(tmp_path, kvu, otherplug, required):
    """Before: the row stayed `applied` with 0 calls and `status` exited 0."""
    entry = pinned_entry("kv@1", KV, KV_COPY)
    loader = make_loader(tmp_path, {"kv": kv_patch(required)}, [entry])
    loader.run_import_stage()
    assert loader.records["kv"].state == "applied"
    flusher = Flusher(loader, interval=0)
    assert flusher.tick()  # the first flush: nothing replaced
    (code, _), _ = _status(tmp_path)
    assert code == 0
    otherplug.register()  # a plugin loaded after vllm-patchkit
    assert flusher.tick()  # the next flush notices and writes
    rec = loader.records["kv"]
    assert (rec.state, rec.code) == ("failed", "replaced_after_apply")
    assert rec.found.startswith(f"otherplug:get_kv_cache_configs at {otherplug.__file__}:")
    assert rec.found.endswith("(distribution otherplug 1.2)")
    assert rec.reason.startswith(f"{KV} no longer holds this patch's wrapper: after it was applied, something "
                                 "replaced it with otherplug:get_kv_cache_configs")
    (code, problems), js = _status(tmp_path)
    row = next(r for p in js["processes"] for r in p["patches"] if r["patch"] == "kv@1")
    assert (row["state"], row["code"]) == ("failed", "replaced_after_apply")
    if required:
        assert code == 1 and any("required patch failed" in p and "otherplug" in p for p in problems), problems
    else:
        assert code == 0 and any("replaced_after_apply" in w for w in js["warnings"])
    assert not flusher.tick()  # reported once
    loader.unpatch()
    assert kvu.get_kv_cache_configs is otherplug.get_kv_cache_configs  # unpatch never puts vLLM's back over it


def test_a_layer_stacked_on_the_wrapper_is_not_a_replacement(tmp_path, kvu):
    import functools

    entry = pinned_entry("kv@1", KV, KV_COPY)
    loader = make_loader(tmp_path, {"kv": kv_patch(True)}, [entry])
    loader.run_import_stage()
    ours = kvu.get_kv_cache_configs

    @functools.wraps(ours)
    def on_top(*a, **k):  # someone decorating the patched function: the patch still runs inside it
        return ours(*a, **k)

    kvu.get_kv_cache_configs = on_top
    assert loader.check_in_place() == 0
    assert loader.records["kv"].state == "applied"
    loader.unpatch()


CHECK_CHILD_ENV = ("VLLM_PATCHKIT_LIVE_CHILD", "VLLM_PATCHKIT_LIVE_PROGRESS")


def test_check_live_names_the_other_plugin_and_the_static_check_cannot_see_it(tmp_path, otherplug):
    """`check --live` runs the other general plugins (as vLLM does) before reading the targets: the foreign
    object is a breaking `foreign_replacement` naming the distribution and file:line. Before, `check` said ok
    (and `pin` would have written the same pin). The static check reads vLLM's source only: ok, as documented."""
    import os
    import subprocess

    import yaml

    (tmp_path / "site" / "otherplug-1.2.dist-info" / "entry_points.txt").write_text(
        "[vllm.general_plugins]\notherplug = otherplug:register\n")
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir()
    mdir.mkdir()
    (pdir / "kv.yaml").write_text(yaml.safe_dump(kv_patch(required=True)))
    from vllm_patchkit.runtime.loader import installed_vllm_version

    version = installed_vllm_version()
    (mdir / f"vllm-{version}.yaml").write_text(yaml.safe_dump(
        {"vllm": version, "generated_by": "test", "patches": [pinned_entry("kv@1", KV, KV_COPY)]}))
    env = {k: v for k, v in os.environ.items() if k not in CHECK_CHILD_ENV}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), env.get("PYTHONPATH", "")]),
               VLLM_PLUGINS="otherplug")
    args = [sys.executable, "-m", "vllm_patchkit.tools.cli", "check", "--patch-dir", str(pdir), "--manifest-dir", str(mdir)]
    static = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert static.returncode == 0, static.stdout + static.stderr
    live = subprocess.run([*args, "--live"], env=env, capture_output=True, text=True, timeout=600)
    out = live.stdout + live.stderr
    assert live.returncode == 1, out
    line = _line_of_def(tmp_path / "site/otherplug/__init__.py")
    assert (f"{KV}: replaced at run time by code outside vLLM: otherplug:get_kv_cache_configs at "
            f"{tmp_path / 'site/otherplug/__init__.py'}:{line} (distribution otherplug 1.2)") in out, out
    assert "parameter 'extra'" not in out, out  # the other plugin's signature is not reported as vLLM's change

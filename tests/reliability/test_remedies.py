"""Every remedy a required patch's failure offers is one the code honours (issue 21, item 4).

Before: every failure of a needed required patch (conflict, fingerprint, implementation, convention, target, ...)
ended with "use a vLLM release it is pinned for (0.31.0)" -- the installed release -- and "set
VLLM_PATCHKIT_ALLOW_UNPATCHED=ID to serve without it"; setting it, even to `all`, changed nothing (it was read only
for an unavailable patch): start-up stopped again.

Here each failure class a user can hit is produced on real vLLM targets, and the test does what the message says:
it takes the `VLLM_PATCHKIT_ALLOW_UNPATCHED=...` the message offers, sets it (and `all`), starts a new loader,
and finds the patch skipped (`unpatched_allowed`) with a warning, listed under `warnings` by `status`, whose exit
code stays 0 (docs/troubleshooting.md: warnings never change it). The release named by "use a vLLM release it
is pinned for" is never the installed one.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import RequiredPatchFailed, RequiredPatchUnavailable
from vllm_patchkit.runtime.flush import Flusher
from vllm_patchkit.runtime.loader import Loader, installed_vllm_version
from vllm_patchkit.declaration.manifest import load_manifests

from ..framework.helpers import live_pin, patch_doc

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
FROM_GROUPS = "vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups"
STEP = "vllm.v1.engine.core:EngineCore.step"
ENGINE = "vllm.v1.engine.core:EngineCore"
ALLOW = "VLLM_PATCHKIT_ALLOW_UNPATCHED"


@pytest.fixture
def restore():
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.engine.core as core

    saved = (kvu.get_kv_cache_configs, core.get_kv_cache_configs, core.EngineCore.__dict__["step"])
    loaders: list[Loader] = []
    yield loaders
    for lo in reversed(loaders):
        lo.unpatch()
    kvu.get_kv_cache_configs, core.get_kv_cache_configs = saved[:2]
    core.EngineCore.step = saved[2]


def _write(tmp: Path, docs: list[dict], entries: list[dict], other_release: bool) -> tuple[Path, Path]:
    pdir, mdir = tmp / "patches", tmp / "manifests"
    pdir.mkdir(parents=True, exist_ok=True)
    mdir.mkdir(parents=True, exist_ok=True)
    for d in docs:
        (pdir / f"{d['id']}.yaml").write_text(yaml.safe_dump(d))
    version = installed_vllm_version()
    (mdir / f"vllm-{version}.yaml").write_text(yaml.safe_dump({"vllm": version, "generated_by": "test",
                                                                  "patches": entries}))
    if other_release:  # an older release whose manifest pins the same patches (pins as taken here)
        (mdir / "vllm-0.30.0.yaml").write_text(yaml.safe_dump({"vllm": "0.30.0", "generated_by": "test",
                                                                "patches": entries}))
    return pdir, mdir


def _loader(tmp: Path, pdir: Path, mdir: Path, made: list) -> Loader:
    ps = load_patch_set([pdir])
    lo = Loader(ps, load_manifests([mdir], ps), role="engine_core", status_dir=tmp / "status")
    made.append(lo)
    return lo


def _status(status_dir: Path):
    run = run_folder.load_run(status_dir)
    (code, problems) = verdict.assess(run)
    return code, problems, json.loads(status.to_json(run))


def _entry(key: str, pins: dict) -> dict:
    return {"patch": key, "targets": pins}


# each case: (patch docs, manifest entries, the failing patch id, its code); built lazily (pins read live)
def _fingerprint():
    pin = live_pin(KV)
    pin["signature"] = "(vllm_config, kv_cache_specs)"  # what the manifest's release had
    return [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True)], \
        [_entry("faulty@1", {KV: pin})], "fingerprint"


def _conflict():
    import functools

    import vllm.v1.core.kv_cache_utils as kvu

    upstream = kvu.get_kv_cache_configs
    pin = live_pin(KV)

    @functools.wraps(upstream)
    def someone_elses(*a, **k):  # another plugin's wrapper layer
        return upstream(*a, **k)

    kvu.get_kv_cache_configs = someone_elses
    return [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True)], \
        [_entry("faulty@1", {KV: pin})], "conflict"


def _foreign():
    import vllm.v1.core.kv_cache_utils as kvu

    def theirs(vllm_config, kv_cache_specs, available_memory, extra=None):  # another plugin's setattr
        return None

    pin = live_pin(KV)
    kvu.get_kv_cache_configs = theirs
    return [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True)], \
        [_entry("faulty@1", {KV: pin})], "conflict"


def _target():
    missing = "vllm.v1.core.kv_cache_utils:no_such_function"
    return [patch_doc(id="faulty", kind="wrap", target=missing, processes=["engine_core"], required=True)], \
        [_entry("faulty@1", {missing: {"kind": "function", "signature": "(a)"}})], "target"


def _kind():
    return [patch_doc(id="faulty", kind="wrap", target=ENGINE, processes=["engine_core"], required=True)], \
        [_entry("faulty@1", {ENGINE: live_pin(ENGINE)})], "kind"


def _copy():
    return [patch_doc(id="faulty", kind="wrap", target=KV, copies=[FROM_GROUPS], processes=["engine_core"],
                      required=True)], \
        [_entry("faulty@1", {KV: live_pin(KV), FROM_GROUPS: live_pin(FROM_GROUPS)})], "copy"


def _uses():
    pin = live_pin(FROM_GROUPS)
    pin["signature"] = "(vllm_config, kv_cache_groups)"
    return [patch_doc(id="faulty", kind="wrap", target=KV, uses=[FROM_GROUPS], processes=["engine_core"],
                      required=True)], \
        [_entry("faulty@1", {KV: live_pin(KV), FROM_GROUPS: pin})], "uses"


def _implementation(tmp: Path, monkeypatch):
    (tmp / "remedy_impl_broken.py").write_text("raise ImportError(\"No module named 'atom_kernels' (simulated)\")\n")
    monkeypatch.syspath_prepend(str(tmp))
    monkeypatch.delitem(__import__("sys").modules, "remedy_impl_broken", raising=False)
    return [patch_doc(id="faulty", kind="wrap", target=KV, implementation="remedy_impl_broken:wrap",
                      processes=["engine_core"], required=True)], [_entry("faulty@1", {KV: live_pin(KV)})], \
        "implementation"


def _convention(tmp: Path, monkeypatch):
    (tmp / "remedy_impl_shape.py").write_text(textwrap.dedent("""
        def wrap(vllm_config, kv_cache_specs, available_memory):  # the target's shape, not a wrap's
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp))
    monkeypatch.delitem(__import__("sys").modules, "remedy_impl_shape", raising=False)
    return [patch_doc(id="faulty", kind="wrap", target=KV, implementation="remedy_impl_shape:wrap",
                      processes=["engine_core"], required=True)], [_entry("faulty@1", {KV: live_pin(KV)})], \
        "convention"


def _requires():
    bad = live_pin(STEP)
    bad["signature"] = "(self, changed)"
    return [patch_doc(id="base", kind="wrap", target=STEP, processes=["engine_core"], required=False),
            patch_doc(id="faulty", kind="wrap", target=KV, requires=["base"], processes=["engine_core"],
                      required=True)], \
        [_entry("base@1", {STEP: bad}), _entry("faulty@1", {KV: live_pin(KV)})], "requires"


CASES = {"fingerprint": _fingerprint, "conflict (a wrapper layer)": _conflict, "conflict (a setattr)": _foreign,
         "target": _target, "kind": _kind, "copy": _copy, "uses": _uses, "implementation": _implementation,
         "convention": _convention, "requires": _requires}


@pytest.mark.parametrize("allow", ["id", "all"])
@pytest.mark.parametrize("other_release", [True, False], ids=["pinned-elsewhere", "pinned-nowhere-else"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_class_offers_remedies_that_work(tmp_path, monkeypatch, restore, case, other_release, allow):
    make = CASES[case]
    docs, entries, code = make(tmp_path, monkeypatch) if case in ("implementation", "convention") else make()
    pdir, mdir = _write(tmp_path, docs, entries, other_release)
    installed = installed_vllm_version()
    monkeypatch.delenv(ALLOW, raising=False)

    first = _loader(tmp_path / "first", pdir, mdir, restore)
    with pytest.raises(RequiredPatchFailed) as ei:
        first.run_import_stage()
    rec = first.records["faulty"]
    assert (rec.state, rec.code) == ("failed", code)
    msg = str(ei.value)
    # "use a vLLM release it is pinned for" never names the installed release
    named = re.findall(r"use a vLLM release it is pinned for \(([^)]*)\)", msg)
    assert all(installed not in n.split(", ") for n in named), msg
    if code in ("fingerprint", "target", "kind", "copy", "uses"):  # another release could fit
        assert (named == ["0.30.0"]) if other_release else (f"No vLLM release other than {installed} pins it" in msg)
    else:  # the plugin's own code or someone else's: another release is no remedy
        assert not named and "pinned for" not in msg
    if code == "conflict":
        assert "pin --vllm" not in msg  # a new pin would read the same vLLM: the advice must not go in a circle
    code0, _, _ = _status(tmp_path / "first" / "status")
    assert code0 == 1

    # do what the message says
    offered = re.search(rf"set {ALLOW}=(\S+) ", msg)
    assert offered is not None, msg
    monkeypatch.setenv(ALLOW, offered.group(1) if allow == "id" else "all")
    again = _loader(tmp_path / "again", pdir, mdir, restore)
    again.run_import_stage()  # start-up goes on
    rec = again.records["faulty"]
    assert (rec.state, rec.code) == ("skipped", "unpatched_allowed"), rec
    assert rec.detail["failure"] == code
    assert rec.warning.startswith(f"REQUIRED patch faulty@1 is needed here but failed ({code}): ")
    assert "serving WITHOUT it because VLLM_PATCHKIT_ALLOW_UNPATCHED names it" in rec.warning
    code1, problems, js = _status(tmp_path / "again" / "status")
    assert (code1, problems) == (0, [])
    assert any(w.startswith("faulty@1 in engine_core") and "WITHOUT it" in w for w in js["warnings"])


def test_an_install_that_raises_honours_the_allowance_too(tmp_path, monkeypatch, restore):
    """`apply`: installing raised (a bug); the message offers the allowance, and it works."""
    import vllm_patchkit.runtime.kinds.base as kinds_base  # where the kinds that change a target install

    def broken(*a, **k):
        raise RuntimeError("simulated install failure")

    monkeypatch.setattr(kinds_base, "install", broken)
    docs = [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True)]
    pdir, mdir = _write(tmp_path, docs, [_entry("faulty@1", {KV: live_pin(KV)})], False)
    with pytest.raises(RequiredPatchFailed) as ei:
        _loader(tmp_path / "first", pdir, mdir, restore).run_import_stage()
    assert "report a bug" in str(ei.value) and f"{ALLOW}=faulty" in str(ei.value)
    monkeypatch.setenv(ALLOW, "faulty")
    again = _loader(tmp_path / "again", pdir, mdir, restore)
    again.run_import_stage()
    assert (again.records["faulty"].state, again.records["faulty"].code) == ("skipped", "unpatched_allowed")
    assert _status(tmp_path / "again" / "status")[0] == 0


@pytest.mark.parametrize("other_release", [True, False], ids=["pinned-elsewhere", "pinned-nowhere-else"])
def test_unavailable_names_only_other_releases(tmp_path, monkeypatch, restore, other_release):
    """Not listed in the installed release's manifest: the release it names is 0.30.0, or none."""
    docs = [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True),
            patch_doc(id="other", kind="wrap", target=STEP, processes=["engine_core"])]
    pdir, mdir = _write(tmp_path, docs, [_entry("other@1", {STEP: live_pin(STEP)})], False)
    if other_release:
        (mdir / "vllm-0.30.0.yaml").write_text(yaml.safe_dump({"vllm": "0.30.0", "generated_by": "test",
                                                                "patches": [_entry("faulty@1", {KV: live_pin(KV)})]}))
    monkeypatch.delenv(ALLOW, raising=False)
    with pytest.raises(RequiredPatchUnavailable) as ei:
        _loader(tmp_path / "first", pdir, mdir, restore).run_import_stage()
    msg = str(ei.value)
    installed = installed_vllm_version()
    if other_release:
        assert "use a vLLM release it is pinned for (0.30.0)" in msg
    else:
        assert f"No vLLM release other than {installed} pins it." in msg and "pinned for" not in msg
    assert f"`vllm-patchkit pin --vllm {installed}`" in msg
    monkeypatch.setenv(ALLOW, re.search(rf"set {ALLOW}=(\S+) ", msg).group(1))
    again = _loader(tmp_path / "again", pdir, mdir, restore)
    again.run_import_stage()
    assert (again.records["faulty"].state, again.records["faulty"].code) == ("skipped", "unpatched_allowed")
    assert _status(tmp_path / "again" / "status")[0] == 0


def test_replaced_after_apply_honours_the_allowance(tmp_path, monkeypatch, restore):
    """A required patch whose wrapper a later plugin replaced: failed (exit 1), or with the allowance a
    warning (exit 0)."""
    import vllm.v1.core.kv_cache_utils as kvu

    docs = [patch_doc(id="faulty", kind="wrap", target=KV, processes=["engine_core"], required=True)]
    pdir, mdir = _write(tmp_path, docs, [_entry("faulty@1", {KV: live_pin(KV)})], False)
    upstream = kvu.get_kv_cache_configs
    for allowed in (False, True):
        kvu.get_kv_cache_configs = upstream
        if allowed:
            monkeypatch.setenv(ALLOW, "faulty")
        else:
            monkeypatch.delenv(ALLOW, raising=False)
        where = tmp_path / ("allowed" if allowed else "plain")
        lo = _loader(where, pdir, mdir, restore)
        lo.run_import_stage()
        flusher = Flusher(lo, interval=0)
        flusher.tick()

        def later_plugin(vllm_config, kv_cache_specs, available_memory):
            return None

        kvu.get_kv_cache_configs = later_plugin
        assert flusher.tick()
        rec = lo.records["faulty"]
        code, problems, js = _status(where / "status")
        if allowed:
            assert (rec.state, rec.code, code) == ("skipped", "unpatched_allowed", 0)
            assert rec.detail["failure"] == "replaced_after_apply"
            assert any("WITHOUT it" in w for w in js["warnings"])
        else:
            assert (rec.state, rec.code, code) == ("failed", "replaced_after_apply", 1)
            assert f"{ALLOW}=faulty" in rec.detail["remedy"] and "pin --vllm" not in rec.detail["remedy"]
        lo.unpatch()
        restore.remove(lo)


@pytest.mark.parametrize("allowed", [False, True], ids=["plain", "allowed"])
def test_a_lazy_target_failing_at_its_import_honours_the_allowance(tmp_path, monkeypatch, allowed):
    """A target applied when its module is imported (the plugin's lazy loader): before, the import raised
    RequiredPatchFailed whatever VLLM_PATCHKIT_ALLOW_UNPATCHED said; with it, the import goes on and the patch
    is skipped with a warning."""
    import importlib
    import sys
    import uuid

    name = f"remedy_lazy_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def f(a):\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = f"{name}:f"
    docs = [patch_doc(id="faulty", kind="wrap", target=target, processes=["engine_core"], required=True)]
    pdir, mdir = _write(tmp_path, docs, [_entry("faulty@1", {target: {"kind": "function", "signature": "(a, b)"}})],
                        False)
    if allowed:
        monkeypatch.setenv(ALLOW, "faulty")
    else:
        monkeypatch.delenv(ALLOW, raising=False)
    ps = load_patch_set([pdir])
    lo = Loader(ps, load_manifests([mdir], ps), role="engine_core", status_dir=tmp_path / "status", lazy=True)
    try:
        lo.run_import_stage()
        assert lo.records["faulty"].state == "not_imported"
        if allowed:
            importlib.import_module(name)
            rec = lo.records["faulty"]
            assert (rec.state, rec.code, rec.detail["failure"]) == ("skipped", "unpatched_allowed", "fingerprint")
            assert _status(tmp_path / "status")[0] == 0
        else:
            with pytest.raises(RequiredPatchFailed) as ei:
                importlib.import_module(name)
            assert f"set {ALLOW}=faulty " in str(ei.value)
            assert _status(tmp_path / "status")[0] == 1
    finally:
        lo.unpatch()
        sys.modules.pop(name, None)

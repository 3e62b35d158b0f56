"""Counts reach the status directory: no call lost on clean exit, bounded loss on SIGKILL, no torn files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, {tmp!r})
    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.declaration.manifest import load_manifests
    from vllm_patchkit.runtime.loader import Loader
    from vllm_patchkit.runtime.flush import Flusher
    import counted_mod
    ps = load_patch_set([Path({tmp!r}) / "patches"])
    loader = Loader(ps, load_manifests([Path({tmp!r}) / "manifests"], ps), role={role!r},
                    vllm_version="0.31.0", platform="cpu")
    Flusher(loader, interval={interval}).start()
    loader.run_import_stage()
    assert loader.records["count"].state == "applied", loader.records["count"]
    for _ in range({calls}):
        counted_mod.f(1)
    {after}
''')


def _setup(tmp: Path) -> None:
    from ..framework.helpers import patch_doc, pinned_entry, write_manifest, write_patch

    (tmp / "counted_mod.py").write_text("def f(x):\n    return x + 1\n")
    sys.path.insert(0, str(tmp))
    try:
        write_patch(tmp / "patches", "count", patch_doc(id="count", kind="wrap", target="counted_mod:f",
                                                         processes=["worker"], expected_calls="per_step"))
        write_manifest(tmp / "manifests", [pinned_entry("count@1", "counted_mod:f")])
    finally:
        sys.path.remove(str(tmp))
        sys.modules.pop("counted_mod", None)


def _run(tmp: Path, calls: int, interval: float, after: str = "", role: str = "worker", wait: bool = True):
    code = SCRIPT.format(tmp=str(tmp), calls=calls, interval=interval, after=after, role=role)
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp / "status"), "VLLM_PATCHKIT_RUN_ID": "run1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    if wait:
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err
    return proc


def _calls(tmp: Path) -> list[int]:
    run = run_folder.load_run(tmp / "status", "run1")
    return [p["patches"][0]["calls"] for p in run.processes]


def test_127_calls_then_clean_exit_records_127(tmp_path):
    """The seed flushed every 64 steps and lost the tail; here the exit flush keeps every call."""
    _setup(tmp_path)
    rc, err = _run(tmp_path, calls=127, interval=3600)
    assert rc == 0, err
    assert _calls(tmp_path) == [127]
    [proc] = run_folder.load_run(tmp_path / "status", "run1").processes
    assert proc["exited"] is True


def test_sigkill_loses_at_most_one_interval(tmp_path):
    _setup(tmp_path)
    rc, err = _run(tmp_path, calls=500, interval=0.2,
                   after="time.sleep(1.0); [counted_mod.f(1) for _ in range(10)]; os.kill(os.getpid(), 9)")
    assert rc == -9, err
    [calls] = _calls(tmp_path)
    assert 500 <= calls <= 510


def test_eight_processes_writing_at_once_no_torn_or_lost_record(tmp_path):
    _setup(tmp_path)
    procs = [_run(tmp_path, calls=20000, interval=0.01, after="time.sleep(0.3)", wait=False) for _ in range(8)]
    torn = 0
    reads = 0
    deadline = time.time() + 120
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        folder = tmp_path / "status" / "run1"
        for f in folder.glob("*.json") if folder.exists() else []:
            try:
                json.loads(f.read_text())
                reads += 1
            except FileNotFoundError:
                pass
            except ValueError:
                torn += 1
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    assert torn == 0 and reads > 0
    assert _calls(tmp_path) == [20000] * 8
    assert not [f for f in (tmp_path / "status" / "run1").iterdir() if f.name.startswith(".")]


def _one_record(tmp: Path) -> Path:
    _setup(tmp)
    rc, err = _run(tmp, calls=3, interval=3600)
    assert rc == 0, err
    return next((tmp / "status" / "run1").glob("*.json"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_record_owned_by_another_user_is_ignored_with_warning(tmp_path):
    path = _one_record(tmp_path)
    os.chown(path, 65534, 65534)
    run = run_folder.load_run(tmp_path / "status", "run1")
    assert run.processes == []
    assert any("owned by uid 65534" in w for w in verdict.warnings_of(run))


def test_group_writable_status_dir_is_ignored_with_warning(tmp_path):
    _one_record(tmp_path)
    os.chmod(tmp_path / "status", 0o777)
    run = run_folder.load_run(tmp_path / "status", "run1")
    assert run.processes == [] and any("world-writable" in w for w in run.warnings)
    code, problems = verdict.assess(run)
    assert code == verdict.NONE


def test_status_exit_codes_and_inert(tmp_path):
    """0 all good; 1 inert per-step patch after enough steps; 2 no records."""
    from vllm_patchkit.tools.cli import main

    assert main(["status", "--dir", str(tmp_path / "nothing")]) == 2
    path = _one_record(tmp_path)
    assert main(["status", "--dir", str(tmp_path / "status")]) == 0
    data = json.loads(path.read_text())
    data["steps"] = 50
    data["patches"][0]["calls"] = 0
    path.write_text(json.dumps(data))
    assert main(["status", "--dir", str(tmp_path / "status"), "--json"]) == 1
    run = run_folder.load_run(tmp_path / "status")
    assert verdict.assess(run)[1] == [f"count@1 in worker (pid {data['pid']}): inert (0 calls after 50 steps)"]
    assert "INERT" in status.render(run)


def test_required_patch_never_judged_in_a_process_that_stepped_is_a_problem(tmp_path):
    """A config-stage patch stays `pending` when its process's config-ready point never ran; once that
    process has stepped, a required one is silently absent, so status says so (exit 1)."""
    path = _one_record(tmp_path)
    data = json.loads(path.read_text())
    data["patches"][0].update(state="pending", required=True, calls=0)
    data["steps"] = 0
    path.write_text(json.dumps(data))
    run = run_folder.load_run(tmp_path / "status")
    assert verdict.assess(run) == (0, [])  # not stepped yet: still starting
    data["steps"] = 12
    path.write_text(json.dumps(data))
    code, problems = verdict.assess(run_folder.load_run(tmp_path / "status"))
    assert code == 1 and problems == [f"count@1 in worker (pid {data['pid']}): required patch never judged: the "
                                      "process ran 12 steps but its config-ready point never ran (check the "
                                      "core.config-ready.* row)"]
    # the table says it too (rendering it raised NameError before: regression)
    table = status.render(run_folder.load_run(tmp_path / "status"))
    assert "pending, NEVER JUDGED" in table and "required patch never judged" in table

"""Records that cannot be written are a state (issue 33, item 2).

Before: the flusher marked counts as written when the write failed and never retried, so after a transient
ENOSPC a required patch found `replaced_after_apply` stayed `applied` on disk (status exit 0) until the
process exited; nothing said the records were stale; a disk full before start gave "no records" and no hint.
ENOSPC is injected at the record file's write (as test_faults.py does), or a real 16 kB tmpfs is filled where
this process may mount one.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_patchkit.reporting import run_folder, status, storage, verdict
from vllm_patchkit.runtime import record as record_mod
from vllm_patchkit.runtime.flush import Flusher
from vllm_patchkit.tools.cli import main

from ..framework.helpers import live_pin, patch_doc
from .test_faults import POOL, FullDisk, _fill, _tmpfs, _umount, build_loader


@pytest.fixture
def disk(monkeypatch):
    """disk.full() / disk.free(): ENOSPC at the record file's write, on and off."""
    real = os.fdopen

    def full():
        monkeypatch.setattr(record_mod.os, "fdopen", lambda fd, *a, **kw: FullDisk(real(fd, *a, **kw)))

    def free():
        monkeypatch.setattr(record_mod.os, "fdopen", real)

    return SimpleNamespace(full=full, free=free)


@pytest.fixture
def pool(vllm_modules, tmp_path):
    """A required wrap applied on vLLM's real _pool_bytes_per_block, with the plugin's flusher (no thread)."""
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=True)
    loader = build_loader(tmp_path, doc, pins={POOL: live_pin(POOL)}, status_dir=tmp_path / "status")
    flusher = Flusher(loader, interval=2.0).start()
    flusher._stop.set()  # the ticks below are the test's; no thread, no exit flush into a later test
    flusher._thread.join(5)
    loader.run_import_stage()
    yield loader, flusher
    loader.unpatch()


from .test_faults import vllm_modules  # noqa: E402,F401 - the fixture restoring vLLM's functions


def _on_disk(loader) -> dict:
    return json.loads(record_mod.process_file(loader.status_dir, loader.process).read_text())


def test_a_finding_made_while_the_disk_is_full_is_written_when_space_returns(pool, disk, vllm_modules,
                                                                               patchkit_log, capsys):
    loader, flusher = pool
    kvu, _ = vllm_modules
    assert flusher.tick() and _on_disk(loader)["patches"][0]["state"] == "applied"
    disk.full()
    kvu._pool_bytes_per_block = lambda kv_cache_groups: 0  # another plugin's plain setattr over our wrap
    assert flusher.tick() is False  # found, but not written
    assert flusher.tick() is False  # retried (and still failing): logged once
    rec = loader.records["faulty"]
    assert (rec.state, rec.code) == ("failed", "replaced_after_apply")
    since = loader.process.unpersisted_since
    assert since is not None and loader.process.write_failures == 2
    assert "No space left on device" in loader.process.write_error
    warned = [r.getMessage() for r in patchkit_log.records if "cannot write records to" in r.getMessage()]
    assert len(warned) == 1 and "No space left on device" in warned[0] and "retried at every flush" in warned[0]
    # the file still says applied; the in-memory record (what a gather answers) says it is not persisted
    assert _on_disk(loader)["patches"][0]["state"] == "applied"
    memory = run_folder.Run(loader.process.run_id, [loader.process.to_json()])
    code, problems = verdict.assess(memory)
    assert code == 1 and any(p.startswith(f"records of engine_core (pid {os.getpid()}) not persisted since ")
                             and "2 failed write(s)" in p and "No space left on device" in p for p in problems)
    # time passes while it cannot write: the record on disk, of a live process, is older than its promise
    path = record_mod.process_file(loader.status_dir, loader.process)
    old = json.loads(path.read_text())
    old["updated"] -= 100  # as if written 100 s ago (the flusher promises a write every 30 s)
    path.write_text(json.dumps(old))
    assert main(["status", "--dir", str(loader.status_dir)]) == 1
    out = capsys.readouterr().out
    assert "record STALE" in out
    code, problems = verdict.assess(run_folder.load_run(loader.status_dir))
    [stale] = [p for p in problems if "is stale" in p]
    assert stale.startswith(f"record of engine_core (pid {os.getpid()}) is stale: last written 10") and \
        "it rewrites it at least every 30 s" in stale
    # space returns: the next tick writes the finding (before the fix: nothing changed, nothing written)
    disk.free()
    assert flusher.tick() is True
    data = _on_disk(loader)
    row = {p["patch"]: p for p in data["patches"]}["faulty@1"]
    assert (row["state"], row["code"]) == ("failed", "replaced_after_apply")
    assert data["unpersisted_since"] is None and data["write_failures"] == 2 and loader.process.unpersisted_since is None
    assert any("records written again to" in r.getMessage() for r in patchkit_log.records)
    code, problems = verdict.assess(run_folder.load_run(loader.status_dir))
    assert code == 1 and not any("stale" in p or "not persisted" in p for p in problems)
    assert any("required patch failed" in p for p in problems), problems


def test_the_flusher_refreshes_an_idle_record_within_its_promise(pool, monkeypatch):
    """Nothing changed: no write, until `refresh_seconds` passed; then one (what lets status judge staleness)."""
    loader, flusher = pool
    assert flusher.tick() is True and flusher.tick() is False
    data = _on_disk(loader)
    assert (data["flush_seconds"], data["refresh_seconds"]) == (2.0, 30.0)
    loader.process.updated -= 31
    assert flusher.tick() is True


def test_a_record_that_stays_fresh_is_not_stale(pool):
    loader, flusher = pool
    flusher.tick()
    assert verdict.assess(run_folder.load_run(loader.status_dir)) == (0, [])


def test_the_end_record_is_written_by_the_first_flush_that_can(pool, disk):
    """A signal's end noted while the disk is full reaches the disk at the next tick once there is space."""
    from vllm_patchkit.runtime import process as process_mod

    loader, flusher = pool
    flusher.tick()
    disk.full()
    process_mod._loader, saved = loader, process_mod._loader
    try:
        process_mod._note_signal(15)  # SIGTERM noted; its flush fails
    finally:
        process_mod._loader = saved
    assert _on_disk(loader)["end"] is None
    disk.free()
    assert flusher.tick() is True
    assert (_on_disk(loader)["end"], _on_disk(loader)["end_signal"]) == ("signal", 15)


def test_full_disk_at_start_is_one_log_line(tmp_path, vllm_modules, disk, patchkit_log):
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=True)
    loader = build_loader(tmp_path, doc, pins={POOL: live_pin(POOL)}, status_dir=tmp_path / "status")
    disk.full()
    try:
        loader.run_import_stage()
        for _ in range(3):
            assert loader.flush() is None
    finally:
        loader.unpatch()
    warned = [r.getMessage() for r in patchkit_log.records if "records" in r.getMessage()
              and r.levelname in ("WARNING", "ERROR")]
    assert len(warned) == 1 and "No space left on device" in warned[0], warned


@pytest.mark.parametrize("how", ["tmpfs-16k", "injected-statvfs"])
def test_a_full_status_file_system_is_named_by_status(tmp_path, monkeypatch, capsys, how):
    base = tmp_path / "disk" / "status"
    mounted = how == "tmpfs-16k"
    if mounted and not _tmpfs(tmp_path / "disk", "size=16k"):
        pytest.skip("mount not permitted here (the injected variant covers this)")
    try:
        # no record at all: exit 2 as before, now with why
        if mounted:
            _fill(tmp_path / "disk")
        else:
            (tmp_path / "disk").mkdir()
            real = os.statvfs

            def statvfs(path):
                st = real(path)
                return SimpleNamespace(f_bavail=0, f_bfree=0, f_frsize=st.f_frsize, f_files=st.f_files,
                                       f_ffree=st.f_ffree)

            monkeypatch.setattr(storage.os, "statvfs", statvfs)
        assert main(["status", "--dir", str(base)]) == 2
        out = capsys.readouterr().out
        assert "no records" in out and "full file system" in " ".join(out.split())
        # a record of an older run exists (written before the disk filled): not shown as the newest state
        if mounted:
            os.unlink(tmp_path / "disk" / "filler")
        proc = record_mod.ProcessRecord(run_id="older", role="frontend", pid=1, ppid=0, vllm_version="0.31.0",
                                        started=1.0, end="clean")
        record_mod.write_atomic(record_mod.process_file(base, proc), proc.to_json())
        if mounted:
            _fill(tmp_path / "disk")
        code, problems = verdict.assess(run_folder.load_run(base))
        assert code == 1 and problems[0].startswith(f"the status folder {base} is on a full file system")
    finally:
        if mounted:
            _umount(tmp_path / "disk")

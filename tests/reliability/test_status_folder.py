"""The status folder read defensively (issue 21, item 2): each hostile file is created for real.

`status`, GET /patchkit/status and /metrics read records only as regular files, opened with O_NOFOLLOW |
O_NONBLOCK, owner checked on the descriptor, at most VLLM_PATCHKIT_MAX_RECORD_BYTES each, with a known
schema_version; every refused file is a warning naming it and why (and listed under `refused`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_patchkit.reporting import metrics, route as http_status, run_folder, verdict
from vllm_patchkit.tools.cli import main as cli_main
from vllm_patchkit.runtime.record import ProcessRecord, process_file, write_atomic

RUN = "20260101T000000-1-abcdef"


def _record(base: Path, role: str = "worker", pid: int = 4242, run: str = RUN) -> Path:
    proc = ProcessRecord(run_id=run, role=role, pid=pid, ppid=1, vllm_version="0.31.0", started=time.time())
    path = process_file(base, proc)
    write_atomic(path, proc.to_json())
    return path


def _load(base: Path, timeout: float = 5.0):
    """load_run in a daemon thread: code that hangs on a record fails the test instead of hanging it."""
    out: dict = {}

    def go():
        t0 = time.perf_counter()
        out["run"] = run_folder.load_run(base, RUN)
        out["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"run_folder.load_run still reading after {timeout} s (blocked on a record)"
    return out["run"], out["seconds"]


def _refused(run, name: str) -> str:
    lines = [r for r in run.refused if f"/{name} refused" in r]
    assert len(lines) == 1, run.refused
    return lines[0]


def test_fifo_named_like_a_record_is_refused_at_once(tmp_path):
    """Before: `status` hung forever in read_text() on the FIFO (and the route and /metrics with it)."""
    base = tmp_path / "status"
    _record(base)
    os.mkfifo(base / RUN / "worker-999.json")
    run, seconds = _load(base)
    assert seconds < 1.0
    assert "worker-999.json refused: not a regular file but a FIFO (named pipe)" in _refused(run, "worker-999.json")
    assert [p["pid"] for p in run.processes] == [4242]
    assert verdict.assess(run)[0] == verdict.OK
    assert any("worker-999.json" in w and "FIFO" in w for w in verdict.warnings_of(run))


def test_symlink_to_a_record_of_the_same_user_is_refused(tmp_path):
    """Before: followed and accepted as a process of the run."""
    base = tmp_path / "status"
    elsewhere = _record(tmp_path / "other", pid=777)
    (base / RUN).mkdir(parents=True, mode=0o700)
    os.symlink(elsewhere, base / RUN / "worker-777.json")
    run, _ = _load(base)
    assert run.processes == []
    assert f"a symlink (to {elsewhere})" in _refused(run, "worker-777.json")
    assert "symlinks are never followed" in _refused(run, "worker-777.json")
    assert verdict.assess(run)[0] == verdict.NONE  # the only record was refused: no records


def test_symlink_to_etc_passwd_is_refused_without_reading_it(tmp_path):
    """Before: /etc/passwd was read, then reported only as "unreadable record ... Expecting value"."""
    base = tmp_path / "status"
    _record(base)
    os.symlink("/etc/passwd", base / RUN / "frontend-1.json")
    run, _ = _load(base)
    line = _refused(run, "frontend-1.json")
    assert "a symlink (to /etc/passwd)" in line and "Expecting value" not in line


def test_symlink_to_dev_zero_is_refused(tmp_path):
    """Before: read_text() of /dev/zero grew until MemoryError: a traceback (here under a 1 GiB address-space
    limit, so the old code fails fast instead of eating the machine's memory)."""
    base = tmp_path / "status"
    _record(base)
    os.symlink("/dev/zero", base / RUN / "engine_core-5.json")
    code = ("import json, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from vllm_patchkit.reporting import run_folder; run = run_folder.load_run(__import__('pathlib').Path(sys.argv[1]), "
            f"{RUN!r}); print(json.dumps(run.refused))")
    proc = subprocess.run([sys.executable, "-c", code, str(base)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = json.loads(proc.stdout)
    assert "engine_core-5.json refused: a symlink (to /dev/zero)" in line


def test_200_mb_valid_record_is_refused_by_size_without_reading_it(tmp_path):
    """Before: read whole (5.4 s, 650 MB RSS in the issue's measurement) and accepted."""
    base = tmp_path / "status"
    _record(base)
    good = json.loads(next((base / RUN).glob("*.json")).read_text())
    big = base / RUN / "worker-31337.json"
    head = json.dumps({**good, "pid": 31337, "notes": ["x"]})[:-3] + '"'  # ... "notes": ["<the huge string>"]}
    size = 200 * 1024 * 1024
    with open(big, "w") as fh:
        fh.write(head)
        chunk = "A" * (16 << 20)
        left = size - len(head) - 3
        while left > 0:
            fh.write(chunk[:left])
            left -= len(chunk)
        fh.write('"]}')
    os.chmod(big, 0o600)
    assert big.stat().st_size == size
    try:
        run, seconds = _load(base)
        assert seconds < 1.0, f"{seconds:.2f} s: the record was read"
        line = _refused(run, "worker-31337.json")
        assert f"{size} bytes, over the limit of {4 * 1024 * 1024} bytes per record" in line
        assert "VLLM_PATCHKIT_MAX_RECORD_BYTES" in line
        assert [p["pid"] for p in run.processes] == [4242]
    finally:
        big.unlink()


def test_record_size_limit_is_env_overridable(tmp_path, monkeypatch):
    base = tmp_path / "status"
    path = _record(base)
    monkeypatch.setenv("VLLM_PATCHKIT_MAX_RECORD_BYTES", "100")
    run, _ = _load(base)
    assert run.processes == [] and "over the limit of 100 bytes" in _refused(run, path.name)


def test_unknown_schema_version_is_refused_with_a_message(tmp_path):
    """Before: schema_version 99 was accepted without a word."""
    base = tmp_path / "status"
    path = _record(base)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema_version": 99}))
    run, _ = _load(base)
    assert run.processes == []
    line = _refused(run, path.name)
    assert "unknown schema_version 99" in line and "reads versions 1-" in line
    assert cli_main(["status", "--dir", str(base), "--run", RUN]) == verdict.NONE


def test_deeply_nested_json_is_refused_not_a_traceback(tmp_path):
    """Before: json.loads raised RecursionError, which load_run did not catch: a traceback."""
    base = tmp_path / "status"
    _record(base)
    (base / RUN / "worker-8.json").write_text("[" * 200000 + "]" * 200000)
    os.chmod(base / RUN / "worker-8.json", 0o600)
    run, _ = _load(base)
    assert "not valid JSON" in _refused(run, "worker-8.json")


def test_symlinked_0700_status_folder_is_accepted(tmp_path):
    """Before: rejected as "group/world-writable directory" (the symlink's own mode, 0777, was checked)."""
    real = tmp_path / "real-status"
    _record(real)
    os.chmod(real, 0o700)
    link = tmp_path / "status-link"
    os.symlink(real, link)
    run, _ = _load(link)
    assert [p["pid"] for p in run.processes] == [4242] and run.warnings == [] and run.refused == []
    assert cli_main(["status", "--dir", str(link)]) == 0


def test_symlinked_status_folder_to_a_world_writable_folder_is_refused(tmp_path):
    real = tmp_path / "real-status"
    _record(real)
    os.chmod(real, 0o777)
    link = tmp_path / "status-link"
    os.symlink(real, link)
    run = run_folder.load_run(link)
    assert run.processes == [] and any("a symlink to" in w and "group/world-writable" in w for w in run.warnings)


def _hostile_folder(tmp_path: Path) -> Path:
    base = tmp_path / "status"
    _record(base, role="frontend", pid=4242)
    folder = base / RUN
    os.mkfifo(folder / "worker-1.json")
    os.symlink("/etc/passwd", folder / "worker-2.json")
    os.symlink("/dev/zero", folder / "worker-3.json")
    with open(folder / "worker-4.json", "wb") as fh:  # sparse: refused by its size, so never read
        fh.truncate(200 * 1024 * 1024)
    os.chmod(folder / "worker-4.json", 0o600)
    return base


def test_route_and_metrics_answer_within_a_second_with_a_message_per_file(tmp_path):
    """Before: the route and /metrics timed out on the FIFO (and read /dev/zero until MemoryError)."""
    base = _hostile_folder(tmp_path)
    snap = http_status.Snapshot(base, RUN, ttl=0)
    result: dict = {}

    def route():
        t0 = time.perf_counter()
        result["route"] = asyncio.run(snap.read())
        collector = metrics.PatchStatusCollector(base, RUN)
        result["metrics"] = list(collector.collect())
        result["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=route, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the route or /metrics blocked on a record"
    assert result["seconds"] < 1.0
    body, code = result["route"]
    data = json.loads(body)
    assert code == 0 and data["exit_code"] == 0 and [p["pid"] for p in data["processes"]] == [4242]
    for name, why in (("worker-1.json", "FIFO"), ("worker-2.json", "to /etc/passwd"), ("worker-3.json", "/dev/zero"),
                      ("worker-4.json", "over the limit")):
        assert any(name in w and why in w for w in data["warnings"]), (name, data["warnings"])
        assert any(name in w and why in w for w in data["refused"]), (name, data["refused"])
    values = {f.name: f.samples[0].value for f in result["metrics"] if f.samples}
    assert values["vllm_patchkit_refused_records"] == 4 and values["vllm_patchkit_scrape_error"] == 0
    assert values["vllm_patchkit_status_exit_code"] == 0 and values["vllm_patchkit_warnings"] == 4


def test_route_body_is_bounded():
    """A run whose JSON is larger than the bound is served as a short body that says it was cut."""
    procs = [{"role": "worker", "pid": i, "patches": [{"patch": "x" * 1000}] * 50} for i in range(400)]
    body = json.dumps({"run_id": "r", "exit_code": 1, "problems": ["p"] * 5000, "warnings": [], "refused": [],
                       "processes": procs})
    assert len(body) > http_status.MAX_BODY_BYTES
    out = http_status.bounded(body)
    assert len(out.encode()) <= http_status.MAX_BODY_BYTES
    data = json.loads(out)
    assert data["exit_code"] == 1 and "over" in data["truncated"]
    assert len(data["problems"]) == http_status.MAX_LINES + 1 and data["problems"][-1] == "... and 4800 more"
    assert http_status.bounded('{"a": 1}') == '{"a": 1}'


def test_metrics_series_are_bounded(tmp_path):
    from vllm_patchkit.runtime.record import PatchRecord

    rows = [PatchRecord(patch=f"p{i}@1", kind="wrap", required=False, stage="import").set("applied")
            for i in range(metrics.MAX_PATCH_ROWS + 1)]
    proc = ProcessRecord(run_id=RUN, role="worker", pid=1, ppid=1, vllm_version="0.31.0", started=time.time(),
                         patches=rows)
    run = run_folder.Run(RUN, [proc.to_json()])
    fams = {f.name: f for f in metrics.families(run)}
    assert fams["vllm_patchkit_series_truncated"].samples[0].value == 1
    assert fams["vllm_patchkit_patch_state"].samples == []

"""A crash is a state (issue 21, item 1), on synthetic record folders with real processes: every record says how
its process ended (clean, signal, unknown) and a process that vanished while the run served is a problem."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from vllm_patchkit.runtime import process
from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.runtime.record import ProcessRecord, process_file, write_atomic

RUN = "20260101T000000-1-abcdef"


def _write(base: Path, role: str, pid: int, ticks, **kw) -> dict:
    proc = ProcessRecord(run_id=RUN, role=role, pid=pid, ppid=kw.pop("ppid", 1), vllm_version="0.31.0",
                         started=time.time(), hostname=process.HOSTNAME, boot_id=process.boot_id(),
                         start_ticks=ticks, **kw)
    write_atomic(process_file(base, proc), proc.to_json())
    return proc.to_json()


def _dead_pid(sig=signal.SIGKILL) -> tuple[int, int]:
    """A real process that was killed by `sig` and reaped: its pid and start ticks."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ticks = process.start_ticks(child.pid)
    os.kill(child.pid, sig)
    child.wait(10)
    return child.pid, ticks


def test_engine_core_vanished_while_serving_is_a_problem(tmp_path):
    """Before: the record had exited=false, as after a clean stop: `3 processes; ... OK`, exit 0."""
    pid, ticks = _dead_pid()
    _write(tmp_path, "frontend", os.getpid(), process.start_ticks(os.getpid()))
    _write(tmp_path, "engine_core", pid, ticks, ppid=os.getpid())
    code, problems = verdict.assess(run_folder.load_run(tmp_path, RUN))
    assert code == verdict.BAD
    assert problems == [f"engine_core (pid {pid}) vanished without writing its end (killed by a signal it cannot "
                        "catch, e.g. SIGKILL, or crashed), while the run was serving (no clean stop of the server "
                        "was recorded)"]
    doc = json.loads(status.to_json(run_folder.load_run(tmp_path, RUN)))
    assert [p["ended"]["state"] for p in doc["processes"]] == ["running", "unknown"]


def test_processes_killed_after_a_clean_stop_began_are_fine(tmp_path):
    pid, ticks = _dead_pid()
    fe_pid, fe_ticks = _dead_pid(signal.SIGTERM)
    _write(tmp_path, "frontend", fe_pid, fe_ticks, end="clean", end_signal=15, exited=True,
           shutdown={"signal": 15, "at": time.time(), "alive": [fe_pid, pid]})
    _write(tmp_path, "engine_core", pid, ticks, ppid=fe_pid)
    run = run_folder.load_run(tmp_path, RUN)
    assert verdict.assess(run) == (verdict.OK, [])
    ended = [pv.end for pv in verdict.judge(run).processes]
    assert ended[0].state == "clean" and "after signal 15 (SIGTERM)" in ended[0].why
    assert ended[1].stopped_with_run and "alive when the clean stop by signal 15 (SIGTERM) began" in ended[1].why


def test_a_process_gone_before_the_clean_stop_is_still_a_crash(tmp_path):
    pid, ticks = _dead_pid()
    _write(tmp_path, "frontend", os.getpid(), process.start_ticks(os.getpid()),
           shutdown={"signal": 15, "at": time.time(), "alive": [os.getpid()]})
    _write(tmp_path, "worker", pid, ticks)
    code, problems = verdict.assess(run_folder.load_run(tmp_path, RUN))
    assert code == verdict.BAD and problems[0].endswith("before the clean stop of the server began")


def test_signal_noted_then_never_exited_names_the_signal(tmp_path):
    pid, ticks = _dead_pid()
    _write(tmp_path, "worker", pid, ticks, end="signal", end_signal=15)
    code, problems = verdict.assess(run_folder.load_run(tmp_path, RUN))
    assert code == verdict.BAD and f"worker (pid {pid}) received signal 15 (SIGTERM) and never reached its exit" in problems[0]


def test_clean_end_is_fine_and_reused_pid_is_unknown(tmp_path):
    pid, ticks = _dead_pid()
    _write(tmp_path, "worker", pid, ticks, end="clean", exited=True)
    _write(tmp_path, "engine_core", os.getpid(), (process.start_ticks(os.getpid()) or 0) + 1)  # our pid, not our start
    run = run_folder.load_run(tmp_path, RUN)
    code, problems = verdict.assess(run)
    assert code == verdict.BAD and len(problems) == 1
    assert "its pid now belongs to another process" in problems[0] and f"engine_core (pid {os.getpid()})" in problems[0]


def test_orphaned_worker_is_reported(tmp_path):
    pid, ticks = _dead_pid()
    _write(tmp_path, "engine_core", pid, ticks)
    _write(tmp_path, "worker", os.getpid(), process.start_ticks(os.getpid()), ppid=pid)
    code, problems = verdict.assess(run_folder.load_run(tmp_path, RUN))
    assert code == verdict.BAD
    assert any(p.startswith(f"worker (pid {os.getpid()}) is orphaned: it still runs while its parent engine_core "
                            f"(pid {pid}) is gone") for p in problems)


def test_records_without_identity_are_not_judged(tmp_path):
    """Records of loaders made by hand (tests) and of older versions carry no start time: never a crash."""
    proc = ProcessRecord(run_id=RUN, role="worker", pid=_dead_pid()[0], ppid=1, vllm_version="0.31.0",
                         started=time.time())
    write_atomic(process_file(tmp_path, proc), proc.to_json())
    assert verdict.assess(run_folder.load_run(tmp_path, RUN)) == (verdict.OK, [])


SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    from types import SimpleNamespace
    from pathlib import Path
    from vllm_patchkit.runtime.record import ProcessRecord, process_file, write_atomic, default_status_dir
    from vllm_patchkit.runtime import process
    from vllm_patchkit.runtime.flush import Flusher

    class L:
        status_dir = None
        def __init__(self):
            self.process = ProcessRecord(run_id="{run}", role=sys.argv[1], pid=os.getpid(), ppid=os.getppid(),
                                         vllm_version="0.31.0", started=time.time())
        def sync_calls(self):
            return 0
        def flush(self):
            write_atomic(process_file(default_status_dir(), self.process), self.process.to_json())

    loader = L()
    Flusher(loader, interval=0).start()
    process.install_end_handlers(loader)
    loader.flush()
    print("ready", flush=True)
    time.sleep(30)
''')


def _child(tmp_path, role):
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", SCRIPT.format(run=RUN), role], env=env, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_sigterm_is_recorded_by_the_chained_handler(tmp_path):
    """SIGTERM with the default disposition behind ours: the record says `signal` 15, the process still dies by
    it (the chained default), and status names the signal. Before: nothing was recorded (exited=false)."""
    child = _child(tmp_path, "worker")
    child.send_signal(signal.SIGTERM)
    assert child.wait(10) == -signal.SIGTERM
    [proc] = run_folder.load_run(tmp_path, RUN).processes
    assert (proc["end"], proc["end_signal"], proc["exited"]) == ("signal", 15, False)
    code, problems = verdict.assess(run_folder.load_run(tmp_path, RUN))
    assert code == verdict.BAD and "received signal 15 (SIGTERM) and never reached its exit" in problems[0]


def test_front_end_sigint_is_a_clean_stop_with_the_alive_snapshot(tmp_path):
    child = _child(tmp_path, "frontend")
    child.send_signal(signal.SIGINT)  # Python's default handler behind ours: KeyboardInterrupt, a normal exit
    child.wait(10)
    [proc] = run_folder.load_run(tmp_path, RUN).processes
    assert proc["end"] == "clean" and proc["end_signal"] == 2 and proc["exited"]
    assert proc["shutdown"]["signal"] == 2 and proc["shutdown"]["alive"] == [child.pid]
    assert verdict.assess(run_folder.load_run(tmp_path, RUN)) == (verdict.OK, [])

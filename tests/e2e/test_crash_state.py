"""A crash is a state, in a real serve of the tiny Llama (issue 21, item 1).

Before: `kill -9` of EngineCore left records identical to a clean stop (`exited=false`), and `vllm-patchkit
status` said OK, exit 0. Now SIGKILL of EngineCore or of a worker is exit 1 naming the process; a clean SIGTERM
of the server is exit 0 (vLLM force-kills EngineCore after the front end's clean stop began)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.tools.cli import main as cli_main
from vllm_patchkit.tools.serve.server import RequestError, pid_alive, serve

pytestmark = pytest.mark.e2e


def _serve(model, tmp_path):
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status"), "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5"}
    return serve(model, env=env, log_path=tmp_path / "server.log")


def _kill_and_wait(server, title: str):
    [victim] = [p for p, comm in server.processes().items() if title in comm]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:  # a request makes the front end meet the dead engine (EngineDeadError), then it exits
            server.complete("again", max_tokens=2, timeout=10)
        except (RequestError, OSError):
            pass
        time.sleep(1)
    return victim


@pytest.mark.parametrize("title,role", [("EngineCor", "engine_core"), ("Worker", "worker")])
def test_sigkill_during_serving_is_exit_1_naming_the_process(tiny_model, tmp_path, title, role):
    with _serve(tiny_model, tmp_path) as server:
        assert server.complete("The number 1 is", max_tokens=4)["choices"][0]["text"] is not None
        time.sleep(1.0)
        victim = _kill_and_wait(server, title)
    assert not pid_alive(victim)
    base = tmp_path / "status"
    run = run_folder.load_run(base)
    code, problems = verdict.assess(run)
    assert code == verdict.BAD, problems
    mine = [p for p in problems if p.startswith(f"{role} (pid {victim})")]
    assert mine and ("vanished" in mine[0] or "signal 9" in mine[0]), problems
    assert "while the run was serving" in mine[0] or "before the clean stop" in mine[0]
    assert cli_main(["status", "--dir", str(base)]) == 1


def test_clean_sigterm_of_the_server_is_exit_0(tiny_model, tmp_path):
    with _serve(tiny_model, tmp_path) as server:
        assert server.complete("The number 1 is", max_tokens=4)["choices"][0]["text"] is not None
        time.sleep(1.0)
        front = server.pid
        server.proc.send_signal(signal.SIGTERM)  # the API server only: vLLM stops EngineCore and the worker
        server.proc.wait(60)
    base = tmp_path / "status"
    run = run_folder.load_run(base)
    code, problems = verdict.assess(run)
    assert code == verdict.OK, problems
    fe = next(p for p in run.processes if p["role"] == "frontend")
    assert fe["pid"] == front and fe["end"] == "clean" and fe["shutdown"]["signal"] == signal.SIGTERM
    others = [pv.end for pv in verdict.judge(run).processes if pv.record.role != "frontend"]
    assert others and all(e.state == "clean" or e.stopped_with_run for e in others), others
    assert cli_main(["status", "--dir", str(base)]) == 0

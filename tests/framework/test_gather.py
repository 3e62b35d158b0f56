"""Merging the workers' answers (collective_rpc) into the directory's view of a run; the gather's failure path.

The real channel (a TP=2 serve whose workers answer through EngineCore's collective_rpc) is
tests/e2e/test_workers_gathered_e2e.py. Here: other host names, which one machine cannot produce, and an
engine client that fails (a stand-in for vLLM's AsyncLLM, which needs a running engine).
"""

from __future__ import annotations

import asyncio
import types

from vllm_patchkit.reporting import gather
from vllm_patchkit.runtime.record import PatchRecord, ProcessRecord
from vllm_patchkit.reporting.run_folder import Run
from vllm_patchkit.reporting.verdict import assess, warnings_of


def _record(pid: int, role: str = "worker", run_id: str = "r1", state: str = "applied", required=True) -> dict:
    rec = PatchRecord(patch="p@1", patch_set="s", kind="wrap", required=required, state=state,
                      expected_calls="at_startup", stage="import")
    return ProcessRecord(run_id=run_id, role=role, pid=pid, ppid=1, vllm_version="0.31.0", started=0.0,
                         patches=[rec]).to_json()


def test_an_answer_from_another_host_is_added_with_its_host():
    run = Run("r1", [_record(10, "frontend"), _record(11, "worker")], [])
    run, added = gather.merge(run, [{"host": "node-b", "record": _record(11)}], local_host="node-a")
    assert added == 1
    assert [(p.get("host"), p["pid"]) for p in run.processes] == [(None, 10), (None, 11), ("node-b", 11)]


def test_an_answer_already_in_the_directory_is_not_added_twice():
    run = Run("r1", [_record(10, "frontend"), _record(11)], [])
    run, added = gather.merge(run, [{"host": "node-a", "record": _record(11)}, None], local_host="node-a")
    assert added == 0 and len(run.processes) == 2


def test_a_failed_remote_patch_fails_the_run():
    """What only a remote worker knows must count: its required failure makes the exit code 1."""
    run = Run("r1", [_record(10, "frontend")], [])
    assert assess(run)[0] == 0
    run, _ = gather.merge(run, [{"host": "node-b", "record": _record(7, state="failed")}], local_host="node-a")
    code, problems = assess(run)
    assert code == 1 and "required patch failed" in problems[0]


def test_a_live_answer_whose_file_cannot_be_written_is_a_warning_not_a_problem():
    """The answer is the worker's state now; only the folder is behind, and the warning says so. The same
    record read from the folder (no host: not live) stays a problem: its rows may be old."""
    unwritten = {**_record(11), "unpersisted_since": 1.0, "write_failures": 3, "write_error": "IsADirectoryError"}
    run, _ = gather.merge(Run("r1", [_record(10, "frontend")], []), [{"host": "node-b", "record": unwritten}],
                          local_host="node-a")
    assert assess(run) == (0, [])
    [said] = [w for w in warnings_of(run) if "not persisted" in w]
    assert "worker (pid 11)" in said and "this answer is live" in said
    code, problems = assess(Run("r1", [_record(10, "frontend"), unwritten], []))
    assert code == 1 and "not persisted" in problems[0]
    failed = {**unwritten, "patches": [{**unwritten["patches"][0], "state": "failed"}]}
    run, _ = gather.merge(Run("r1", [_record(10, "frontend")], []), [{"host": "node-b", "record": failed}],
                          local_host="node-a")
    code, problems = assess(run)  # the warning never hides what the live rows say
    assert code == 1 and "required patch failed" in problems[0]


def test_answers_of_another_run_and_malformed_ones_are_left_out_with_a_warning():
    run = Run("r1", [_record(10, "frontend")], [])
    bad = _record(12)
    bad["pid"] = "not a pid"
    run, added = gather.merge(run, [{"host": "b", "record": _record(11, run_id="r0")}, {"host": "b", "record": bad}],
                              local_host="a")
    assert added == 0
    assert any("run r0, not r1" in w for w in run.warnings)
    assert any("unreadable record from b" in w for w in run.warnings)


def test_no_directory_records_at_all_still_shows_the_answers():
    run, added = gather.merge(None, [{"host": "b", "record": _record(11)}], local_host="a")
    assert added == 1 and run.run_id == "r1"


class _Client:
    def __init__(self, result=None, exc=None):
        self.result, self.exc, self.calls = result, exc, []

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, timeout))
        if self.exc:
            raise self.exc
        return self.result


def _app(client):
    return types.SimpleNamespace(state=types.SimpleNamespace(engine_client=client))


def test_the_gather_asks_for_the_attached_method_and_caches():
    client = _Client([{"host": "b", "record": _record(11)}])
    g = gather.Gatherer(_app(client), ttl=60)

    async def twice():
        await g.fetch()
        await g.fetch()

    asyncio.run(twice())
    assert client.calls == [(gather.RPC_METHOD, gather.TIMEOUT_SECONDS)]
    run = g.apply(Run("r1", [], []))
    assert [p["host"] for p in run.processes] == ["b"]


def test_a_failed_gather_is_a_warning_of_the_view_never_an_error():
    g = gather.Gatherer(_app(_Client(exc=TimeoutError("workers busy"))), ttl=0)
    asyncio.run(g.fetch())
    run = g.apply(Run("r1", [_record(10, "frontend")], []))
    assert any("not gathered over collective_rpc: TimeoutError: workers busy" in w for w in run.warnings)
    assert assess(run)[0] == 0  # a warning, not a problem: the directory's view stands


def test_a_worker_answers_with_its_current_record(monkeypatch):
    """The method `attach` puts on a worker object returns this process's record (flushed first)."""
    flushed = []
    rec = ProcessRecord.from_json(_record(33))
    loader = types.SimpleNamespace(process=rec, records={}, flush=lambda: flushed.append(1))
    monkeypatch.setattr(gather.runtime, "current", lambda: loader)
    worker = types.SimpleNamespace()
    gather.attach(worker)
    answer = getattr(worker, gather.RPC_METHOD)()
    assert flushed == [1]
    assert answer["host"] == gather.HOST and answer["record"]["pid"] == 33


def test_a_worker_without_a_loader_answers_none(monkeypatch):
    monkeypatch.setattr(gather.runtime, "current", lambda: None)
    assert gather.worker_records() is None


def test_an_app_without_an_engine_client_adds_nothing_and_warns_nothing():
    """The route of an app vLLM has not given an engine yet: the directory's view, unchanged."""
    g = gather.Gatherer(types.SimpleNamespace(state=types.SimpleNamespace()), ttl=0)
    asyncio.run(g.fetch())
    run = g.apply(Run("r1", [_record(10, "frontend")], []))
    assert run.warnings == [] and len(run.processes) == 1

"""Workers' records over vLLM's own channel: a real tensor-parallel serve with two workers on this machine.

With workers on other hosts their record files are not in the API server's status directory; the route and
/metrics then get them through EngineCore's `collective_rpc` (gather.py). Here both workers run on this host
(`--tensor-parallel-size 2` on the CPU build; `VLLM_CPU_OMP_THREADS_BIND="0|1"` gives each worker one core,
since vLLM's automatic binding wants one NUMA node per worker and this machine has one). So the test checks
the channel against the directory: every worker answered, each answer is the record the worker wrote to the
directory (same pid, role, states, calls at least as high), and the merged view adds nothing (the body is
exactly `status --json`'s). Then the workers' files are taken out of the directory (a directory sits at each
file's name, so their flushes cannot put them back), as on a host the API server cannot read: the route and
/metrics still show both workers, from their answers alone. Other host names: tests/framework/test_gather.py.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.test_operators_e2e import _get, _scrape, _status_json
from vllm_patchkit.reporting import gather
from vllm_patchkit.tools.serve import server as demo_server

pytestmark = pytest.mark.e2e


def test_tp2_workers_answer_over_collective_rpc_and_match_the_directory(tiny_model, tmp_path):
    status_dir = tmp_path / "status"
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    with demo_server.serve(tiny_model, extra_args=["--tensor-parallel-size", "2"], env=env,
                           log_path=tmp_path / "serve.log", timeout=420) as srv:
        for i in range(3):
            srv.complete(f"Prefix caching lets a later request {i}", max_tokens=8)
        roles = srv.processes()
        assert sum(1 for t in roles.values() if t.startswith("VLLM::Worker")) == 2, roles
        code, body = _get(srv.base_url + "/patchkit/status")
        assert code == 200, body
        with urllib_open(srv.base_url + "/patchkit/status") as resp:
            header = resp.headers.get("X-Patchkit-Workers")
        assert header == "2 answered, 0 not on disk here", header
        route = json.loads(body)
        cli_code, cli = _status_json(status_dir)
        assert cli_code == 0, cli["problems"]
        workers = {p["pid"]: p for p in cli["processes"] if p["role"] == "worker"}
        assert len(workers) == 2
        # the route's body: the directory's view, nothing added (both workers are on this host)
        assert {p["pid"] for p in route["processes"]} == {p["pid"] for p in cli["processes"]}
        assert not any("host" in p for p in route["processes"])
        assert not any("not gathered" in w for w in route["warnings"]), route["warnings"]

        # the workers' files gone from the directory, as if they ran elsewhere
        run_dir = status_dir / cli["run_id"]
        for pid in workers:
            path = run_dir / f"worker-{pid}.json"
            path.unlink()
            path.mkdir()
        time.sleep(1.5)  # past the route's cache
        srv.complete("A block is full when it holds", max_tokens=8)
        code, body = _get(srv.base_url + "/patchkit/status")
        with urllib_open(srv.base_url + "/patchkit/status") as resp:
            header = resp.headers.get("X-Patchkit-Workers")
        assert header == "2 answered, 2 not on disk here", header
        gathered = {p["pid"]: p for p in json.loads(body)["processes"] if p["role"] == "worker"}
        assert set(gathered) == set(workers)
        for pid, proc in gathered.items():
            assert proc["host"] == gather.HOST
            before = {r["patch"]: r for r in workers[pid]["patches"]}
            for r in proc["patches"]:
                assert r["state"] == before[r["patch"]]["state"], (pid, r["patch"])
                assert (r.get("calls") or 0) >= (before[r["patch"]].get("calls") or 0)
        assert (gathered[next(iter(gathered))].get("steps") or 0) > 0
        # /metrics: a scrape shows the last gather's answers (and starts the next one)
        metrics = _scrape(srv.base_url)
        assert metrics["vllm_patchkit_processes"][(("role", "worker"),)] == 2


def urllib_open(url: str):
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30)

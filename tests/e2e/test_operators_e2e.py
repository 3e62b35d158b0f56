"""Patch status where operators look, on a real server: /metrics and GET /patchkit/status.

One serve of the tiny Llama with `--api-key k` (the key guards our route as it guards
/v1; /metrics and /health stay open, as vLLM has them). What the server shows must be
what `vllm-patchkit status --json` reads from the same status directory: the gauge's
states per patch and role, the call counters (equal once the processes flushed), the
route's body and its 200/503. A bounded flood of the two endpoints (200 requests,
loopback) must not keep a completion from answering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_patchkit.tools.serve import server as demo_server

pytestmark = pytest.mark.e2e

KEY = "k"
FLOOD = 200
_PLAIN = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, no key


def _keyed_opener():
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.addheaders = [("Authorization", f"Bearer {KEY}")]
    return opener


def _get(url: str, opener=_PLAIN, timeout: float = 30.0) -> tuple[int, bytes]:
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _status_json(status_dir: Path) -> tuple[int, dict]:
    script = Path(sys.executable).with_name("vllm-patchkit")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_patchkit.tools.cli"]
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir)}
    done = subprocess.run([*cmd, "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


def _scrape(base_url: str) -> dict:
    code, body = _get(base_url + "/metrics")
    assert code == 200
    out: dict = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name.startswith("vllm_patchkit"):
            for s in fam.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _expected_states(report: dict) -> dict:
    """(patch, role, state) -> processes, from status --json alone (the run has no problems, so no
    row is inert or shadowed)."""
    out: dict = {}
    for proc in report["processes"]:
        for r in proc["patches"]:
            if r["state"] == "skipped" and r["code"] == "process":
                continue
            state = "not_applicable" if r["state"] == "skipped" and r["code"] in ("unavailable",
                                                                                 "unpatched_allowed") else r["state"]
            key = (r["patch"].split("@")[0], proc["role"], state)
            out[key] = out.get(key, 0) + 1
    return out


def _expected_calls(report: dict) -> dict:
    out: dict = {}
    for proc in report["processes"]:
        for r in proc["patches"]:
            if r["kind"] in ("wrap", "replace") and r["state"] == "applied":
                key = (r["patch"].split("@")[0], proc["role"])
                out[key] = out.get(key, 0) + r["calls"]
    return out


@pytest.fixture(autouse=True)
def _fresh_run(monkeypatch):
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def test_metrics_and_route_show_what_status_json_says(tiny_model, tmp_path, monkeypatch):
    status_dir = tmp_path / "status"
    # the harness's readiness check (/v1/models) and completions carry the key; our checks use _PLAIN
    monkeypatch.setattr(demo_server, "_OPENER", _keyed_opener())
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "1"}
    with demo_server.serve(tiny_model, env=env, extra_args=["--api-key", KEY], log_path=tmp_path / "server.log",
                           timeout=240) as srv:
        url = srv.base_url + "/patchkit/status"
        # the API key, as /v1 has it
        assert _get(srv.base_url + "/v1/models")[0] == 401
        code, body = _get(url)
        assert (code, json.loads(body)) == (401, {"error": "Unauthorized"})
        assert _get(url, _keyed_opener())[0] == 200
        t0 = time.perf_counter()
        assert srv.complete("Hello, world!", max_tokens=8)["usage"]["completion_tokens"] == 8
        idle = time.perf_counter() - t0

        # a bounded flood of both endpoints, while a completion must still answer
        codes: list[int] = []
        done = threading.Event()
        during: dict = {}

        def complete_meanwhile():
            t = time.perf_counter()
            during["tokens"] = srv.complete("The quick brown fox", max_tokens=8)["usage"]["completion_tokens"]
            during["seconds"] = time.perf_counter() - t
            done.set()

        opener = _keyed_opener()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            futs = [pool.submit(_get, url if i % 2 == 0 else srv.base_url + "/metrics", opener) for i in range(FLOOD)]
            side = threading.Thread(target=complete_meanwhile)
            side.start()
            codes = [f.result()[0] for f in futs]
            side.join(timeout=120)
        flood = time.perf_counter() - t0
        assert done.is_set() and during["tokens"] == 8
        assert codes == [200] * FLOOD
        print(f"\nflood: {FLOOD} requests in {flood:.2f} s; completion {idle:.2f} s idle, "
              f"{during['seconds']:.2f} s during the flood")

        time.sleep(3.0)  # every process flushed its last counts (interval 1 s); nothing runs now
        scraped = _scrape(srv.base_url)
        code_route, body_route = _get(url, _keyed_opener())
        t0 = time.perf_counter()
        _scrape(srv.base_url)
        scrape_seconds = time.perf_counter() - t0
        exit_code, report = _status_json(status_dir)  # while up: at exit the processes flush `exited: true`

    assert exit_code == 0 and report["problems"] == []
    assert {p["role"] for p in report["processes"]} == {"frontend", "engine_core", "worker"}
    # the route: the CLI's document and its exit code as 200/503
    assert code_route == 200 and json.loads(body_route) == report
    # the gauge: one series per (patch, role, state) the records show, valued in processes
    states = {(dict(k)["patch"], dict(k)["role"], dict(k)["state"]): v
              for k, v in scraped["vllm_patchkit_patch_state"].items()}
    assert states == _expected_states(report)
    # the counters: equal once everything flushed (during traffic: behind by at most one flush interval)
    calls = {(dict(k)["patch"], dict(k)["role"]): v for k, v in scraped["vllm_patchkit_patch_calls_total"].items()}
    assert calls == _expected_calls(report)
    assert calls[("core.steps.worker", "worker")] > 0 and calls[("core.operator-endpoints", "frontend")] == 1
    [(labels, one)] = scraped["vllm_patchkit_run_info"].items()
    assert one == 1 and dict(labels)["run_id"] == report["run_id"]
    assert dict(labels)["manifest"] == report["processes"][0]["manifest"]
    assert list(scraped["vllm_patchkit_status_exit_code"].values()) == [0]
    assert list(scraped["vllm_patchkit_scrape_error"].values()) == [0]
    front = next(p for p in report["processes"] if p["role"] == "frontend")
    [row] = [r for r in front["patches"] if r["patch"] == "core.operator-endpoints@1"]
    assert row["state"] == "applied"
    assert (row["detail"]["metrics"], row["detail"]["route"]) == ("on /metrics",
                                                                  "GET /patchkit/status (API key required)")
    print("operator-endpoints row:", row["detail"], row["findings"])
    print(f"/metrics scrape with {len(report['processes'])} records: {scrape_seconds * 1e3:.1f} ms "
          f"(collector: {list(scraped['vllm_patchkit_scrape_duration_seconds'].values())[0] * 1e3:.1f} ms)")

"""Patch status where operators look: the /metrics collector and GET /patchkit/status.

The collector reads record files written with the real record model (ProcessRecord,
write_atomic), so what it counts is what `vllm-patchkit status --json` reads; the route
is added to the app vLLM's own `build_app` makes, with vLLM's own API-key middleware.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_patchkit.reporting import metrics, status
from vllm_patchkit.runtime.record import PatchRecord, ProcessRecord, process_file, write_atomic

RUN = "20260101T000000-1-abcdef"


def _rec(patch, state, code=None, *, kind="wrap", required=False, calls=0, expected_calls="never_counted",
         findings=(), patch_set="core"):
    r = PatchRecord(patch=patch, patch_set=patch_set, kind=kind, required=required, stage="import",
                    expected_calls=expected_calls, calls=calls, findings=list(findings))
    return r.set(state, code)


def _write(base: Path, role: str, pid: int, patches, steps=None, manifest="vllm-0.31.0.yaml") -> Path:
    proc = ProcessRecord(run_id=RUN, role=role, pid=pid, ppid=1, vllm_version="0.31.0", manifest=manifest,
                         started=time.time(), steps=steps, patches=list(patches))
    path = process_file(base, proc)
    write_atomic(path, proc.to_json())
    return path


@pytest.fixture
def run_dir(tmp_path):
    """A run of four processes: one of each state the gauge knows, two workers."""
    base = tmp_path / "status"
    _write(base, "frontend", 100, [
        _rec("core.operator-endpoints@1", "applied", calls=1, expected_calls="at_startup"),
        _rec("core.steps.engine-core@1", "skipped", "process"),
        _rec("opt-probe@2", "skipped", "unavailable", patch_set="deepseek-v4"),
    ])
    _write(base, "engine_core", 101, [
        _rec("core.steps.engine-core@1", "applied", calls=40),
        _rec("gate@1", "skipped", "precondition", required=True, patch_set="deepseek-v4"),
        _rec("old-hook@1", "failed", "fingerprint", required=False, patch_set="deepseek-v4"),
    ], steps=40)
    for pid, calls in ((102, 37), (103, 0)):
        _write(base, "worker", pid, [
            _rec("core.steps.worker@1", "applied", calls=calls + 3, expected_calls="per_step"),
            _rec("runner-wrap@1", "applied", calls=calls, expected_calls="per_step", patch_set="deepseek-v4"),
            _rec("base-wrap@1", "applied", findings=[{"code": "shadowed", "by": "CPUModelRunner"}],
                 patch_set="deepseek-v4"),
        ], steps=calls + 3)
    return base


def _scrape(base: Path, run_id=RUN) -> dict:
    """Sample name -> {frozenset(labels.items()): value}, through a real registry and the text format."""
    reg = CollectorRegistry()
    reg.register(metrics.PatchStatusCollector(base, run_id))
    out: dict = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def _one(samples: dict, **labels) -> float:
    [value] = [v for k, v in samples.items() if set(labels.items()) <= set(k)] or [None]
    return value


def test_gauges_and_counters_say_what_status_json_says(run_dir):
    m = _scrape(run_dir)
    st = m["vllm_patchkit_patch_state"]
    assert _one(st, patch="core.operator-endpoints", version="1", role="frontend", state="applied") == 1
    assert _one(st, patch="opt-probe", version="2", set="deepseek-v4", role="frontend", state="not_applicable") == 1
    assert _one(st, patch="gate", role="engine_core", required="true", state="skipped") == 1
    assert _one(st, patch="old-hook", role="engine_core", state="failed") == 1
    # two workers: one ran the wrapper, one never did after 3 steps (< 8: not inert yet) -> 2 applied
    assert _one(st, patch="runner-wrap", role="worker", state="applied") == 2
    assert _one(st, patch="base-wrap", role="worker", state="shadowed") == 2
    # a patch that is not for a role has no series there (the table hides those rows too)
    assert _one(st, patch="core.steps.engine-core", role="frontend") is None
    calls = m["vllm_patchkit_patch_calls_total"]
    assert _one(calls, patch="runner-wrap", role="worker") == 37
    assert _one(calls, patch="core.steps.engine-core", role="engine_core") == 40
    assert _one(calls, patch="old-hook") is None  # not applied: not counted (status shows "-")
    assert _one(m["vllm_patchkit_processes"], role="worker") == 2
    assert _one(m["vllm_patchkit_run_info"], run_id=RUN, manifest="vllm-0.31.0.yaml", vllm_version="0.31.0") == 1

    text, code = status.report(run_dir, RUN)
    doc = json.loads(text)
    assert code == doc["exit_code"] == 1  # the shadowed rows
    assert _one(m["vllm_patchkit_status_exit_code"]) == code
    assert _one(m["vllm_patchkit_problems"]) == len(doc["problems"])
    assert _one(m["vllm_patchkit_warnings"]) == len(doc["warnings"])
    assert _one(m["vllm_patchkit_scrape_error"]) == 0
    # every (patch, role) row status --json shows is one gauge series, and no other
    rows = {(r["patch"].split("@")[0], p["role"]) for p in doc["processes"] for r in p["patches"]
            if not (r["state"] == "skipped" and r["code"] == "process")}
    assert rows == {(dict(k)["patch"], dict(k)["role"]) for k in st}


def test_inert_once_the_worker_stepped_enough(tmp_path):
    base = tmp_path / "status"
    _write(base, "worker", 5, [_rec("runner-wrap@1", "applied", calls=0, expected_calls="per_step")], steps=12)
    m = _scrape(base)
    assert _one(m["vllm_patchkit_patch_state"], patch="runner-wrap", state="inert") == 1
    assert _one(m["vllm_patchkit_status_exit_code"]) == status.report(base, RUN)[1] == 1


def test_a_malformed_record_does_not_break_the_scrape(run_dir):
    folder = run_dir / RUN
    (folder / "worker-999.json").write_text("{not json")
    (folder / "worker-998.json").write_text(json.dumps({"role": "worker", "pid": "x"}))
    m = _scrape(run_dir)
    assert _one(m["vllm_patchkit_scrape_error"]) == 0
    assert _one(m["vllm_patchkit_processes"], role="worker") == 2  # the two good workers, still counted
    assert _one(m["vllm_patchkit_patch_calls_total"], patch="runner-wrap", role="worker") == 37
    doc = json.loads(status.report(run_dir, RUN)[0])
    assert _one(m["vllm_patchkit_warnings"]) == len(doc["warnings"]) >= 2  # "unreadable record ..." each


def test_a_failed_read_is_a_metric_not_a_failed_scrape(run_dir, monkeypatch):
    def boom(*a, **k):
        raise PermissionError("denied")

    monkeypatch.setattr(metrics, "load_run", boom)
    m = _scrape(run_dir)
    assert _one(m["vllm_patchkit_scrape_error"]) == 1
    assert "vllm_patchkit_patch_state" not in m


def test_no_records_yet_reads_exit_code_2(tmp_path):
    m = _scrape(tmp_path / "nothing", "no-such-run")
    assert _one(m["vllm_patchkit_status_exit_code"]) == 2


def test_installed_once_per_registry(run_dir, tmp_path):
    reg = CollectorRegistry()
    first = metrics.install(reg, tmp_path / "a", "r1")
    again = metrics.install(reg, run_dir, RUN)
    assert first is again and again.base == run_dir
    assert b"vllm_patchkit_run_info" in generate_latest(reg)


def test_scrape_time_grows_with_records(tmp_path, capsys):
    """Figures for the docs: one scrape over N process records of 12 patches each."""
    for n in (4, 64):
        base = tmp_path / f"s{n}"
        for pid in range(n):
            _write(base, "worker", pid, [_rec(f"p{i}@1", "applied", calls=pid, expected_calls="per_step")
                                         for i in range(12)], steps=100)
        reg = CollectorRegistry()
        reg.register(metrics.PatchStatusCollector(base, RUN))
        t0 = time.perf_counter()
        for _ in range(5):
            generate_latest(reg)
        per = (time.perf_counter() - t0) / 5
        with capsys.disabled():
            print(f"\nscrape with {n} records x 12 patches: {per * 1e3:.1f} ms")
        assert per < 5.0


# -- the route, on the app vLLM's own build_app makes --------------------------------------


def _vllm_app(tmp_path, monkeypatch, run_dir, *cli):
    """vLLM's build_app through the patch's implementation, for the run in `run_dir`."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_patchkit.runtime.context import PatchContext
    from vllm_patchkit.hooks import api_server
    from vllm_patchkit.declaration.declare import load_patch_set

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("VLLM_PATCHKIT_STATUS_DIR", str(run_dir))
    monkeypatch.setenv("VLLM_PATCHKIT_RUN_ID", RUN)
    monkeypatch.setattr(api_server.runtime, "current", lambda: None)
    patch = load_patch_set([Path(api_server.__file__).parent]).patches["core.operator-endpoints@1"]
    ctx = PatchContext.detached(patch)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", str(tmp_path), *cli])
    app = api_server.after_build_app(build_app, None, (args, ("generate",)), {}, ctx)
    return app, ctx


def test_route_answers_status_json_with_the_exit_code(tmp_path, monkeypatch, run_dir):
    from fastapi.testclient import TestClient

    app, ctx = _vllm_app(tmp_path, monkeypatch, run_dir)
    client = TestClient(app)  # no lifespan: vLLM's needs an engine
    resp = client.get("/patchkit/status")
    assert resp.status_code == 503  # exit code 1 (shadowed rows)
    assert resp.json() == json.loads(status.report(run_dir, RUN)[0])
    assert client.post("/patchkit/status").status_code == 405  # read-only
    scraped = client.get("/metrics").text
    assert 'vllm_patchkit_patch_state{patch="runner-wrap"' in scraped
    assert ctx._notes == {"metrics": "on /metrics", "route": "GET /patchkit/status"}


def test_route_honours_the_api_key_as_v1_does(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    base = tmp_path / "status"
    _write(base, "frontend", 7, [_rec("core.operator-endpoints@1", "applied", calls=1)])
    app, ctx = _vllm_app(tmp_path, monkeypatch, base, "--api-key", "k")
    client = TestClient(app)
    assert client.get("/patchkit/status").status_code == 401
    assert client.get("/patchkit/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models").json() == client.get("/patchkit/status").json() == {"error": "Unauthorized"}
    resp = client.get("/patchkit/status", headers={"Authorization": "Bearer k"})
    assert resp.status_code == 200 and resp.json()["exit_code"] == 0
    assert ctx._notes["route"] == "GET /patchkit/status (API key required)"


def test_a_release_without_the_pin_serves_without_the_endpoints_and_says_so(tmp_path):
    """Not pinned for the release (or build_app gone): the row is skipped / unavailable with a warning,
    and vLLM's build_app is left exactly as it was."""
    import yaml
    import vllm.entrypoints.launchers.app as app_mod

    from vllm_patchkit.hooks import api_server

    from .helpers import make_loader

    doc = yaml.safe_load((Path(api_server.__file__).parent / "api_server.yaml").read_text())
    original = app_mod.build_app
    loader = make_loader(tmp_path, {"api_server": doc}, [], role="frontend")
    try:
        loader.run_import_stage()
        rec = loader.records["core.operator-endpoints"]
        assert (rec.state, rec.code) == ("skipped", "unavailable") and rec.warning
        assert app_mod.build_app is original
    finally:
        loader.unpatch()

"""A real CPU serve with the plugin auto-loaded: every process records, config stages run,
and a patch that can never run is caught twice — shadowed at start-up, inert after traffic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vllm_patchkit.reporting import status
from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.tools.cli import main as cli_main
from vllm_patchkit.tools.serve.server import serve

pytestmark = pytest.mark.e2e

PROBE = Path(__file__).parent / "patchsets" / "to_list"


def _serve_and_read(model, tmp_path, extra_env, prompts=6):
    status_dir = tmp_path / "status"
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_EXTRA_PATCHES": str(PROBE),
           "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5", **extra_env}
    with serve(model, env=env, log_path=tmp_path / "server.log") as server:
        for i in range(prompts):
            assert server.complete(f"The number {i} is", max_tokens=12)["choices"][0]["text"] is not None
        # On SIGTERM vLLM's API server force-kills EngineCore (and with it the worker), so
        # their last counts are those of the last periodic flush: wait a few intervals.
        time.sleep(2.0)
    run = run_folder.load_run(status_dir)
    assert run is not None, "no records written"
    return run, status_dir, (tmp_path / "server.log").read_text(errors="replace")


def _by_role(run):
    out = {}
    for proc in run.processes:
        out.setdefault(proc["role"], []).append(proc)
    return out


def _rec(proc, pid):
    return next(r for r in proc["patches"] if r["patch"].split("@")[0] == pid)


def test_records_from_every_process_shadowed_probe_and_config_stages(tiny_model, tmp_path):
    run, status_dir, log = _serve_and_read(tiny_model, tmp_path, {})
    roles = _by_role(run)
    assert set(roles) == {"frontend", "engine_core", "worker"}, roles.keys()
    assert len({p["pid"] for p in run.processes}) == 3
    fe, ec, wk = roles["frontend"][0], roles["engine_core"][0], roles["worker"][0]
    # config-ready hooks ran in every process, with that process's config
    for proc, hook in ((fe, "core.config-ready.frontend"), (ec, "core.config-ready.engine-core"),
                       (wk, "core.config-ready.worker")):
        rec = _rec(proc, hook)
        assert (rec["state"], rec["calls"]) == ("applied", 1), (proc["role"], rec)
        assert proc["config"]["architectures"] == ["LlamaForCausalLM"]
    # config-stage patches were judged in EngineCore and the worker (not left pending)
    assert all(r["state"] != "pending" for p in (ec, wk) for r in p["patches"])
    assert _rec(fe, "breakable-cudagraph-opt-out")["reason"].startswith("architectures: expected")
    # steps were counted and the processes said goodbye
    assert ec["steps"] > 0 and wk["steps"] > 0
    assert fe["exited"]  # the API server exits cleanly; EngineCore/worker are force-killed by it
    # the probe on GPUModelRunner._to_list is shadowed by the CPU runner, seen at start-up
    probe = _rec(wk, "test.to-list-probe")
    assert probe["state"] == "applied" and probe["calls"] == 0
    assert [f["by"] for f in probe["findings"]] == ["vllm.v1.worker.cpu_model_runner:CPUModelRunner"]
    assert "test.to-list-probe@1 is shadowed" in log
    # and `vllm-patchkit status` says so, with exit code 1
    assert cli_main(["status", "--dir", str(status_dir)]) == 1
    text = status.render(run)
    assert "SHADOWED" in text and "frontend" in text and "engine_core" in text and "worker" in text


def test_per_step_probe_reads_inert_by_counting_alone(tiny_model, tmp_path):
    run, status_dir, _ = _serve_and_read(tiny_model, tmp_path, {"VLLM_PATCHKIT_SHADOW_CHECK": "0"})
    wk = _by_role(run)["worker"][0]
    probe = _rec(wk, "test.to-list-probe")
    assert probe["findings"] == []  # shadow detection really was off
    steps = _rec(wk, "core.steps.worker")
    assert steps["calls"] > 0 and wk["steps"] == steps["calls"]
    [row] = [r for pv in verdict.judge(run, min_steps=8).processes for r in pv.rows
             if pv.record.pid == wk["pid"] and r.record.patch == probe["patch"]]
    assert row.state == "inert" and row.label == "applied, INERT"
    code, problems = verdict.assess(run)
    assert code == 1 and any("test.to-list-probe@1 in worker" in p and "inert" in p for p in problems)

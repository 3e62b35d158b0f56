"""batch-dispatch-override end to end: real vLLM servers, prefix caching on, records read back.

The stand-in: ATOM's DeepSeek-V4 cannot run on this CPU, so the test-only
general plugin `patchkit_standin` (PATCHKIT_STANDIN=1) registers an
out-of-tree class for `DeepseekV4ForCausalLM` that is vLLM's Llama unchanged,
and the tiny checkpoint names that architecture. It matches ATOM's model
exactly where the patch looks — the architecture name and the class vLLM's
registry serves it with — and nowhere else. With VLLM_PLUGINS unset both
general plugins load in every vLLM process.

Requests: a 129-token prompt (one 128-token block plus one token) twice — the
second is a prefix hit whose one remaining prompt token is scheduled alone, a
decode-shaped step that is still a prefill — and a 1-token prompt.

On the CPU vLLM dispatches every step to cudagraph mode NONE, so the override
cannot change what runs here; what the test shows is that the patch is applied
in the worker, runs on real steps, decides when to override, and that its
counts reach the records `vllm-patchkit status` reads.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from vllm_patchkit.tools.serve.server import serve
from vllm_patchkit.reporting.run_folder import load_run
from vllm_patchkit.reporting.status import render

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                       reason="pip install ./tests/plugins/standin"),
]

PATCH = "batch-dispatch-override@1"
PROMPT_129 = [(i * 7 + 3) % 250 + 3 for i in range(129)]


def _worker_record(status_dir: Path):
    run = load_run(status_dir)
    if run is None:
        return None, None
    workers = [p for p in run.processes if p["role"] == "worker"]
    if len(workers) != 1:
        return run, None
    return run, next((r for r in workers[0]["patches"] if r["patch"] == PATCH), None)


def _wait_for_counts(status_dir: Path, timeout: float = 30.0):
    """Until the worker's periodic flush has written an overridden step (bounded wait)."""
    deadline = time.monotonic() + timeout
    while True:
        _, rec = _worker_record(status_dir)
        if rec is not None and rec["detail"].get("steps_overridden", 0) >= 1:
            return rec
        if time.monotonic() > deadline:
            return rec
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def _deployment_defaults(monkeypatch):
    """The server starts as a deployment would: a fresh run id, and none of the vLLM switches an
    in-process test may have left in os.environ (vLLM's VllmConfig itself sets
    VLLM_USE_BREAKABLE_CUDAGRAPH=1 when it builds a config for a V4 name)."""
    for name in ("VLLM_PATCHKIT_RUN_ID", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_V2_MODEL_RUNNER"):
        monkeypatch.delenv(name, raising=False)


def _serve_env(status_dir: Path, **extra) -> dict:
    return {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_FLUSH_SECONDS": "1", **extra}


def test_override_applied_and_counted_in_the_worker(standin_model, tmp_path):
    status_dir = tmp_path / "status"
    env = _serve_env(status_dir, PATCHKIT_STANDIN="1")
    with serve(standin_model, env=env, extra_args=["--enable-prefix-caching"],
               log_path=tmp_path / "server.log") as srv:
        first = srv.complete_tokens(PROMPT_129, max_tokens=4)
        second = srv.complete_tokens(PROMPT_129, max_tokens=4)
        tiny = srv.complete_tokens([42], max_tokens=4)
        assert first["choices"][0]["text"] == second["choices"][0]["text"]
        assert tiny["usage"]["prompt_tokens"] == 1
        live = _wait_for_counts(status_dir)
        assert live is not None and live["detail"].get("steps_overridden", 0) >= 1, live
    log = (tmp_path / "server.log").read_text()
    assert "model class patchkit_standin.model.StandinDeepseekV4ForCausalLM" in log

    run, rec = _worker_record(status_dir)
    assert rec is not None, [p["role"] for p in run.processes] if run else "no records"
    assert (rec["state"], rec["stage"]) == ("applied", "config"), rec
    d = rec["detail"]
    print(f"\nworker counts: calls={rec['calls']} {d}")
    assert d["steps_seen"] > 0
    assert d["steps_overridden"] >= 1
    assert d["steps_overridden_decode_shaped"] >= 1  # the 1-token tail / 1-token prompt
    assert d["steps_overridden"] < d["steps_seen"]  # decode steps were left alone
    assert sum(d["cudagraph_modes"].values()) == d["steps_seen"]
    assert d["runners"] == ["CPUModelRunner: plugin (DeepseekV4ForCausalLM served by patchkit_standin.model)"]
    assert rec["calls"] >= d["steps_seen"]  # dummy/profile runs are called too, never counted as steps
    others = [p for p in run.processes if p["role"] != "worker"]
    for proc in others:
        other = next(r for r in proc["patches"] if r["patch"] == PATCH)
        assert (other["state"], other["code"]) == ("skipped", "process")
    assert PATCH in render(run)

    # image-slot-events (the same worker, the same V1 CPUModelRunner): applied, called on every step, and the
    # stand-in model's listener (patchkit_standin.model: count_slot_events) heard the finished requests
    # (the last one's finish reaches the runner only with a later step, so at least 2 of the 3).
    (worker,) = [p for p in run.processes if p["role"] == "worker"]
    events = next(r for r in worker["patches"] if r["patch"] == "image-slot-events@1")
    assert (events["state"], events["stage"]) == ("applied", "config"), events
    assert events["calls"] >= d["steps_seen"] and not [f for f in events["findings"] if f["code"] == "shadowed"]
    heard = worker["counters"]["patchkit_standin.slot_events"]
    assert heard["finished"] >= 2 and heard["steps"] == events["detail"]["deliveries"], (heard, events["detail"])
    assert events["detail"]["finished"] == heard["finished"], (heard, events["detail"])
    table = render(run)
    assert "image-slot-events" in table
    print("\n".join(line for line in table.splitlines() if "image-slot-events" in line))


def test_skipped_for_plain_llama_with_the_architecture_as_reason(tiny_model, tmp_path):
    status_dir = tmp_path / "status"
    with serve(tiny_model, env=_serve_env(status_dir), extra_args=["--enable-prefix-caching"],
               log_path=tmp_path / "server.log") as srv:
        srv.complete_tokens(PROMPT_129, max_tokens=2)
    run, rec = _worker_record(status_dir)
    assert rec is not None, [p["role"] for p in run.processes] if run else "no records"
    assert (rec["state"], rec["code"]) == ("skipped", "precondition"), rec
    assert rec["expected"] == ["DeepseekV4ForCausalLM"] and rec["found"] == ["LlamaForCausalLM"]
    assert rec["reason"].startswith("architectures:")
    assert rec["calls"] == 0 and "steps_seen" not in rec["detail"]

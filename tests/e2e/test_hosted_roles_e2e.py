"""One process hosting three roles: vLLM's offline `LLM` with VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the front
end, EngineCore and the worker (the `uni` executor, as on one GPU) in a single process, where vLLM loads the
plugins once. Regression: every EngineCore and worker patch was recorded "not for this process" there and the
status read OK, so a required worker patch (here batch-dispatch-override, for the V4 stand-in) was absent
unnoticed; now each role's config-ready point judges and applies that role's patches in the process
(runtime/hosting.py). The stand-in (`patchkit_standin`, PATCHKIT_STANDIN=1) stands in for ATOM's model, which
cannot run on this CPU (see test_batch_dispatch_e2e.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from vllm_patchkit.reporting.run_folder import load_run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("patchkit_standin") is None,
                       reason="pip install ./tests/plugins/standin"),
]

CHILD = """
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], max_model_len=256, enforce_eager=True, dtype="float32", gpu_memory_utilization=0.3,
          enable_prefix_caching=True, seed=0)
out = llm.generate([[5, 6, 7, 8] * 40, [9, 10, 11]], SamplingParams(max_tokens=4, ignore_eos=True))
print("GENERATED", sum(len(o.outputs[0].token_ids) for o in out))
"""


def test_one_process_hosting_engine_core_and_the_worker_applies_their_patches(standin_model, tmp_path):
    status_dir = tmp_path / "status"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATCHKIT_STANDIN": "1",
           "VLLM_PATCHKIT_STATUS_DIR": str(status_dir)}
    for name in ("VLLM_PATCHKIT_ROLE",):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(standin_model)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "GENERATED 8" in done.stdout, done.stderr[-3000:]
    run = load_run(status_dir)
    assert run is not None and len(run.processes) == 1
    [proc] = run.processes
    assert proc["role"] == "frontend" and proc["hosts"] == ["engine_core", "worker"]
    recs = {r["patch"]: r for r in proc["patches"]}
    override = recs["batch-dispatch-override@1"]  # a required worker patch, per step
    assert override["state"] == "applied" and override["calls"] >= 2, override
    assert recs["core.steps.worker@1"]["state"] == "applied" and recs["core.steps.engine-core@1"]["state"] == "applied"
    # one step is counted once, though both the EngineCore and the worker step counters ran here
    assert proc["steps"] == recs["core.steps.engine-core@1"]["calls"] + recs["core.steps.engine-core-batch-queue@1"]["calls"]
    assert proc["steps"] == recs["core.steps.worker@1"]["calls"]
    status = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--json"],
                            env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert not [r for r in proc["patches"] if r.get("reason") == "not for this process"
                and set(r.get("expected") or ()) & {"engine_core", "worker"}]

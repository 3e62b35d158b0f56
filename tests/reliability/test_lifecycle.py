"""Import / patch / unpatch permutations for every patch of the shipped set, each in a fresh process.

The cases are made from the patch set at collection time: a new patch (or a new
process role of one) gets them with no test to write. What each case checks is
described in lifecycle.py; how the processes are made, in lifecycle_runner.py
(one new interpreter, one forked child per case).

A case failing only on a check listed in lifecycle.KNOWN_BUGS (a framework bug
reported, not fixed here) is a strict xfail: when the bug is fixed the case
passes, and the xfail turns into a failure asking to remove the entry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_patchkit.declare import builtin_patch_dirs, load_patch_set

from .conftest import COUNTS, OPS
from .lifecycle import KNOWN_BUGS, ORDERS, STEPS

REPO = Path(__file__).resolve().parents[2]


def lifecycle_cases() -> list[dict]:
    ps = load_patch_set(builtin_patch_dirs())
    newest = {}
    for p in ps.patches.values():
        if p.id not in newest or p.version > newest[p.id].version:
            newest[p.id] = p
    return [{"id": f"{pid}[{role.value}][{order}]", "patch": pid, "role": role.value, "order": order}
            for pid, p in sorted(newest.items()) for role in p.processes for order in ORDERS]


CASES = lifecycle_cases()


@pytest.fixture(scope="module")
def lifecycle_run(tmp_path_factory):
    from vllm_patchkit.demo.tiny_model import build_tiny_model

    ps = load_patch_set(builtin_patch_dirs())
    archs = {"LlamaForCausalLM"} | {p.when.architectures[0] for p in ps.patches.values() if p.when.architectures}
    base = tmp_path_factory.mktemp("lifecycle")
    checkpoints = {a: str(build_tiny_model(base / "ckpt" / a, architecture=a)) for a in sorted(archs)}
    watch = sorted({s.partition(":")[0] for p in ps.patches.values()
                    for s in ([p.target] if p.target else []) + list(p.copies) + list(getattr(p, "uses", []))})
    out = base / "results"
    out.mkdir()
    job = {"cases": CASES, "checkpoints": checkpoints, "out": str(out), "status": str(base / "status"),
           "parallel": max(1, min(4, os.cpu_count() or 1)), "timeout": 300, "watch": watch}
    job_file = base / "job.json"
    job_file.write_text(json.dumps(job))
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    env.pop("PATCHKIT_STANDIN", None)
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "tests.reliability.lifecycle_runner", str(job_file)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.name.startswith("_")}
    runner = json.loads((out / "_runner.json").read_text())
    runner["seconds"] = round(time.time() - started, 1)
    return runner, results


def test_runner_forks_before_any_target_is_imported(lifecycle_run):
    """Otherwise "import-after" would not be what it says."""
    runner, _ = lifecycle_run
    print(f"lifecycle runner: {len(CASES)} cases in {runner['seconds']} s (import vllm {runner['import_seconds']} s)")
    assert runner["preloaded_targets"] == []
    assert runner["threads_at_fork"] == ["MainThread"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_patch_lifecycle(case, lifecycle_run):
    _, results = lifecycle_run
    r = results.get(case["id"])
    assert r is not None, f"no result for {case['id']}"
    checks = r["checks"]
    steps = [s for s in STEPS if any(c["step"] == s for c in checks)]
    failed = [c for c in checks if not c["ok"]]
    unexpected = [c for c in failed if c["code"] not in KNOWN_BUGS]
    COUNTS["lifecycle"] += len(steps)
    OPS["lifecycle"][case["order"]] += len(steps)
    COUNTS["lifecycle:checks"] += len(checks)
    failed_steps = {c["step"] for c in unexpected}
    COUNTS["lifecycle:failures"] += len(failed_steps)
    report = "\n".join(f"  [{c['step']}] {c['name']}: {c['detail']}" for c in unexpected)
    assert not unexpected, f"{case['id']} ({r.get('seconds')} s):\n{report}\nnotes: {r.get('notes')}"
    assert steps == list(STEPS), f"steps run: {steps}"
    if case["order"] == "import-after":
        assert not any(r["imported_before_loader"].values()), r["imported_before_loader"]
    if failed:
        known = sorted({c["code"] for c in failed})
        pytest.xfail("; ".join(f"known bug: {KNOWN_BUGS[k]}" for k in known)
                     + " | " + "; ".join(f"[{c['step']}] {c['name']}" for c in failed))
    if case["patch"] in {c for c in ()}:
        pass
    if any(c["code"] == "copy_imported_after_patch_restored" for c in checks):
        pytest.fail("KNOWN_BUGS['copy_imported_after_patch_restored'] no longer fails: remove it from lifecycle.py")

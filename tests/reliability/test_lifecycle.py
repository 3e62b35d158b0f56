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
from .lifecycle import KNOWN_BUGS, ORDERS, STEPS, KnownBug

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
    groups = [
        # import-after: children of a server that imported vLLM and nothing of the targets (transformers'
        # config code is the one heavy part of vLLM that imports none of them; the runner checks that)
        {"name": "import-after", "preload": ["vllm.transformers_utils.config"], "parallel": 2,
         "cases": [c for c in CASES if c["order"] == "import-after"]},
        # import-before: children of a server that imported every target module (and what builds a config)
        {"name": "import-before", "preload": [*watch, "vllm.engine.arg_utils", "vllm.model_executor.models",
                                              "patchkit_standin.model"], "parallel": 1,
         "cases": [c for c in CASES if c["order"] == "import-before"]},
    ]
    job = {"groups": groups, "checkpoints": checkpoints, "out": str(out), "status": str(base / "status"),
           "parallel": max(2, min(4, os.cpu_count() or 1)), "timeout": 300, "watch": watch}
    job_file = base / "job.json"
    job_file.write_text(json.dumps(job))
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    env.pop("PATCHKIT_STANDIN", None)
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "tests.reliability.lifecycle_runner", str(job_file)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.name.startswith("_")}
    runner = {p.stem.split("-", 1)[1]: json.loads(p.read_text()) for p in out.glob("_runner-*.json")}
    runner["seconds"] = round(time.time() - started, 1)
    runner["watch"] = watch
    return runner, results


def test_runner_forks_from_clean_processes(lifecycle_run, capsys):
    """The import-after server forks before any target is imported, else the order would not be
    what it says; both fork with no thread running (a fork copies only the calling thread)."""
    runner, _ = lifecycle_run
    with capsys.disabled():
        print(f"\nlifecycle runner: {len(CASES)} cases in {runner['seconds']} s")
    assert runner["import-after"]["preloaded_targets"] == []
    assert set(runner["import-before"]["preloaded_targets"]) == set(runner["watch"])
    for name in ("import-after", "import-before"):
        assert runner[name]["threads_at_fork"] == ["MainThread"], runner[name]


MATCHED: set[str] = set()  # known bugs seen in this run
DONE: list[str] = []


def classify(checks: list[dict]) -> tuple[list[dict], list[KnownBug]]:
    """(unexpected failures, known bugs behind the expected ones)."""
    failed = [c for c in checks if not c["ok"]]
    bugs: list[KnownBug] = []
    for bug in KNOWN_BUGS:
        if failed and bug.cascades and bug.matches(failed[0]):
            return [], [bug]
    unexpected = []
    for c in failed:
        bug = next((b for b in KNOWN_BUGS if b.matches(c)), None)
        if bug is None:
            unexpected.append(c)
        elif bug not in bugs:
            bugs.append(bug)
    return unexpected, bugs


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_patch_lifecycle(case, lifecycle_run):
    _, results = lifecycle_run
    r = results.get(case["id"])
    assert r is not None, f"no result for {case['id']}"
    DONE.append(case["id"])
    checks = r["checks"]
    steps = [s for s in STEPS if any(c["step"] == s for c in checks)]
    unexpected, bugs = classify(checks)
    MATCHED.update(b.key for b in bugs)
    COUNTS["lifecycle"] += len(steps)
    OPS["lifecycle"][case["order"]] += len(steps)
    COUNTS["lifecycle:checks"] += len(checks)
    COUNTS["lifecycle:failures"] += len({c["step"] for c in unexpected})
    if bugs and not unexpected:
        COUNTS["lifecycle:known-bug cases"] += 1
    report = "\n".join(f"  [{c['step']}] {c['name']}: {c['detail']}" for c in unexpected)
    assert not unexpected, f"{case['id']} ({r.get('seconds')} s):\n{report}\nnotes: {r.get('notes')}"
    if case["order"] == "import-after":
        assert not any(r["imported_before_loader"].values()), r["imported_before_loader"]
    if bugs:
        failed = [c for c in checks if not c["ok"]]
        pytest.xfail("; ".join(f"known bug {b.key}: {b.reason}" for b in bugs)
                     + " | first: " + f"[{failed[0]['step']}] {failed[0]['name']}")
    assert steps == list(STEPS), f"steps run: {steps}"


def test_known_bugs_still_reproduce():
    """Each KNOWN_BUGS entry must still explain some failure; a fixed bug's entry must go."""
    if len(DONE) < len(CASES):
        pytest.skip("not every lifecycle case ran in this session")
    stale = [b.key for b in KNOWN_BUGS if b.key not in MATCHED]
    assert not stale, f"known bugs no longer seen (fixed?): remove {stale} from tests/reliability/lifecycle.py"

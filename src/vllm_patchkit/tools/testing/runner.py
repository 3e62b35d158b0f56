"""Run lifecycle cases in fresh processes: one new interpreter, one forked child per case.

    python -m vllm_patchkit.tools.testing.runner JOB.json

Starting a new interpreter per case would cost ~10 s of `import vllm` each. So
this interpreter imports vLLM (which imports none of the patch targets: vLLM
imports its submodules lazily; the header of each group says what was imported)
and the framework, and then forks one child per case. Each child starts with the
state a plugin entry point sees in a new vLLM process before vLLM imported the
targets, runs one PatchLifecycle, writes its result as JSON and leaves with
os._exit (no atexit, no flush thread left behind). At most `parallel` children
run at once; a child that overruns `timeout` is killed and reported.

The job file (written by cases.py): {"sets": [name], "manifest_dirs": {set: dir}, "architectures":
[arch], "groups": [{"name", "preload": [module], "cases": [{"id", "patch", "role", "order"}],
"parallel": n}], "out": dir, "status": dir, "timeout": s, "watch": [module], "standin", "overrides"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path


def _child(case: dict, job: dict) -> None:
    from vllm_patchkit.tools.testing.lifecycle import PatchLifecycle

    status = Path(job["status"]) / case["id"]
    os.environ["VLLM_PATCHKIT_STATUS_DIR"] = str(status)
    os.environ.pop("VLLM_PATCHKIT_RUN_ID", None)
    started = time.time()
    try:
        result = PatchLifecycle(case, job, str(status)).run()
    except BaseException as exc:  # noqa: BLE001
        result = {"checks": [{"step": "setup", "name": "lifecycle set up", "ok": False, "code": "crashed",
                              "detail": "".join(traceback.format_exception(exc))[-3000:]}], "notes": []}
    result.update(id=case["id"], seconds=round(time.time() - started, 2), pid=os.getpid())
    _write(job, case["id"], result)


def _fork(work, *args) -> int:
    """Run `work(*args)` in a forked child that leaves with os._exit; return its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        work(*args)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(cases: list[dict], job: dict, parallel: int) -> None:
    """Fork one child per case, at most `parallel` at a time; kill overruns."""
    pending = list(cases)
    running: dict[int, tuple[dict, float]] = {}
    timeout = float(job.get("timeout", 300))
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            running[_fork(_child, case, job)] = (case, time.time())
        for cpid, (case, started) in list(running.items()):
            done, status = os.waitpid(cpid, os.WNOHANG)
            if done:
                running.pop(cpid)
                if not Path(job["out"], f"{case['id']}.json").exists():
                    _missing(job, case, f"child exited with status {status} and no result")
            elif time.time() - started > timeout:
                os.kill(cpid, signal.SIGKILL)
                os.waitpid(cpid, 0)
                running.pop(cpid)
                _missing(job, case, f"killed after {timeout:.0f} s")
        time.sleep(0.05)


def _serve_group(group: dict, job: dict, t0: float) -> None:
    import importlib

    t1 = time.time() if group.get("preload") else t0
    for module in group.get("preload") or []:
        importlib.import_module(module)
    header = {"group": group["name"], "import_seconds": round(time.time() - t1, 2),
              "preloaded_targets": sorted(m for m in job.get("watch", []) if m in sys.modules),
              "threads_at_fork": [t.name for t in threading.enumerate()], "python": sys.version.split()[0]}
    Path(job["out"], f"_runner-{group['name']}.json").write_text(json.dumps(header, indent=1))
    serve(group["cases"], job, int(group.get("parallel", 1)))


def _build_checkpoints(job: dict) -> None:
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

    for arch, path in job["checkpoints"].items():
        build_tiny_model(Path(path), architecture=arch)


def main(job_path: str) -> int:
    """Checkpoints first, in a child (their tokenizer starts threads a fork must not copy); then
    groups with a `preload` list get their own server, forked after it imported the list
    (import-before cases: their targets are imported anyway, so children start warm)."""
    job = json.loads(Path(job_path).read_text())
    os.environ.setdefault("VLLM_PLUGINS", "")  # no plugin is loaded behind the lifecycle's back
    t0 = time.time()
    if job.get("checkpoints"):
        _, status = os.waitpid(_fork(_build_checkpoints, job), 0)
        if status != 0:
            return 2
    import vllm  # noqa: F401  (lazy: imports no target module)
    import vllm_patchkit.declaration.declare  # noqa: F401
    import vllm_patchkit.runtime.loader  # noqa: F401
    import vllm_patchkit.declaration.manifest  # noqa: F401

    servers = [_fork(_serve_group, g, job, t0) for g in job["groups"] if g.get("preload")]
    for group in job["groups"]:
        if not group.get("preload"):
            _serve_group(group, job, t0)
    failed = 0
    for pid in servers:
        _, status = os.waitpid(pid, 0)
        failed |= status != 0
    return 1 if failed else 0


def _write(job: dict, case_id: str, result: dict) -> None:
    Path(job["out"], f"{case_id}.json").write_text(json.dumps(result, indent=1, default=repr))


def _missing(job: dict, case: dict, why: str) -> None:
    _write(job, case["id"], {"id": case["id"], "notes": [], "checks": [
        {"step": "run", "name": "child finished", "ok": False, "code": "crashed", "detail": why}]})


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

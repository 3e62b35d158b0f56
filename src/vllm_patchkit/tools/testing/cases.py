"""The permutations of a patch set, and one run of them in fresh processes.

`lifecycle_cases(sets)` lists, for every patch of the named sets that the installed
vLLM's manifest lists (or that is an observer, which applies unpinned), one case per
process role it belongs to and per import order. `run_lifecycle(cases, ...)` writes a
job and runs runner.py in a new interpreter; `LifecycleRun.problems(case_id, step)` says
what went wrong. Nothing here imports vLLM or pytest: the pytest plugin and a set's own
tests call it from the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.testing.lifecycle import ORDERS, STEPS, closure_of, load_sets
from vllm_patchkit.tools.testing.places import specs
from vllm_patchkit.tools.testing.recipe import STANDIN, architectures, recipe_for


@dataclass(frozen=True)
class Case:
    """One permutation: a patch (id@version) of a set, in one process role, one import order."""

    id: str
    set: str
    patch: str
    key: str
    role: str
    order: str


def lifecycle_cases(sets, manifest_dirs: Optional[dict] = None, version: Optional[str] = None) -> list[Case]:
    """Every case of the named sets' patches applicable on `version` (default: the installed vLLM)."""
    from vllm_patchkit.declaration.manifest import select
    from vllm_patchkit.tools.releases import installed_version

    ps, manifests = load_sets(sets, manifest_dirs)
    version = version or installed_version()
    chosen = select(manifests, version, "skip")[0] if version else None
    pinned = {e.patch for e in chosen.manifest.patches} if chosen else set()
    out = []
    for key, p in sorted(ps.patches.items()):
        name = ps.set_of.get(key)
        if name not in sets or not (key in pinned or (p.observer and not _newer_pinned(ps, p, pinned))):
            continue
        for role in p.processes:
            for order in ORDERS:
                out.append(Case(f"{p.id}[{role.value}][{order}]", name, p.id, key, role.value, order))
    return out


def _newer_pinned(ps, p, pinned) -> bool:
    return any(q.key in pinned for q in ps.by_id(p.id) if q is not p)


@dataclass
class LifecycleRun:
    """The results of one run: per case id, the case's checks; per group, the runner's header."""

    results: dict[str, dict] = field(default_factory=dict)
    runner: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    watch: list = field(default_factory=list)
    stderr: str = ""

    def group_problems(self, order: str) -> list[str]:
        """The fork server of an order started from the state it claims (no thread; for import-after,
        no target imported)."""
        head = self.runner.get(order)
        if head is None:
            return [f"the {order} runner wrote no header:\n{self.stderr[-3000:]}"]
        out = []
        if head["threads_at_fork"] != ["MainThread"]:
            out.append(f"{order} runner forked with threads running: {head['threads_at_fork']}")
        if order == "import-after" and head["preloaded_targets"]:
            out.append(f"import-after runner had target modules imported already: {head['preloaded_targets']}")
        return out

    def problems(self, case_id: str, step: Optional[str] = None) -> list[str]:
        """What failed in a case (or in one step of it), as lines; empty when it passed."""
        order = case_id.rsplit("[", 1)[-1].rstrip("]")
        out = self.group_problems(order)
        r = self.results.get(case_id)
        if r is None:
            return out + [f"no result for {case_id}:\n{self.stderr[-3000:]}"]
        wanted = [step] if step else list(STEPS)
        ran = {c["step"] for c in r["checks"]}
        for c in r["checks"]:
            if not c["ok"] and (step is None or c["step"] == step or c["code"] == "crashed"):
                out.append(f"[{c['step']}] {c['name']}: {c['detail']}")
        out += [f"[{s}] step did not run" for s in wanted if s not in ran and not any("crashed" in x for x in out)]
        if order == "import-after" and any(r.get("imported_before_loader", {}).values()):
            out.append(f"imported before the loader: {r['imported_before_loader']}")
        if out and r.get("notes"):
            out.append(f"notes: {r['notes']}")
        return out


def job_for(cases: list[Case], sets, work: Path, *, manifest_dirs: Optional[dict] = None, timeout: float = 300,
            standin: Optional[str] = None, overrides: Optional[str] = None) -> dict:
    """The runner's job: groups by import order, the modules to watch, the checkpoints to build."""
    ps, _ = load_sets(sets, manifest_dirs)
    closures = [closure_of(ps, ps.patches[c.key]) for c in cases]
    recipes = [recipe_for(cl) for cl in closures]
    watch = sorted({Target.parse(s).module for cl in closures for p in cl for s in specs(p)})
    needs_config = any(p.stage == "config" for cl in closures for p in cl)
    standin = standin or STANDIN
    warm = ["vllm.engine.arg_utils", "vllm.model_executor.models"] if needs_config else []
    if any(r.standin for r in recipes):
        warm.append(Target.parse(standin).module)
    plain = [asdict(c) for c in cases]
    return {
        "sets": list(sets), "manifest_dirs": manifest_dirs or {}, "standin": standin, "overrides": overrides,
        "checkpoints": {a: str(work / "ckpt" / a) for a in architectures(recipes)} if needs_config else {},
        "groups": [
            # import-after: children of a server that imported vLLM and nothing of the targets (transformers'
            # config code is the one heavy part of vLLM that imports none of them; its header says so)
            {"name": "import-after", "preload": ["vllm.transformers_utils.config"], "parallel": 2,
             "cases": [c for c in plain if c["order"] == "import-after"]},
            # import-before: children of a server that imported every target module (and what builds a config)
            {"name": "import-before", "preload": [*watch, *warm], "parallel": 1,
             "cases": [c for c in plain if c["order"] == "import-before"]},
        ],
        "out": str(work / "results"), "status": str(work / "status"), "timeout": timeout, "watch": watch,
    }


def run_lifecycle(cases: list[Case], sets, work: Path, *, env: Optional[dict] = None, **kw) -> LifecycleRun:
    """Run the cases (runner.py in a new interpreter); keyword arguments go to `job_for`."""
    work = Path(work)
    job = job_for(cases, sets, work, **kw)
    Path(job["out"]).mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(job, indent=1))
    run_env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.testing.runner", str(work / "job.json")], cwd=work,
                          env=run_env, capture_output=True, text=True, timeout=max(1200.0, 4 * job["timeout"]))
    out = Path(job["out"])
    run = LifecycleRun(seconds=round(time.time() - started, 1), watch=job["watch"], stderr=proc.stderr)
    for path in out.glob("*.json"):
        if path.name.startswith("_runner-"):
            run.runner[path.stem.split("-", 1)[1]] = json.loads(path.read_text())
        else:
            run.results[path.stem] = json.loads(path.read_text())
    if proc.returncode != 0:
        run.stderr = f"runner exited with {proc.returncode}:\n{proc.stderr}"
    return run

"""Start-up cost of the plugin's entry point in one process, and what it imports.

    python benchmarks/startup.py [--runs 5] [--roles frontend,engine_core,...] [--all-modules] [--profile N]
                                 [--cache DIR|off]

For each role (and baseline; see BASELINE below: `frontend+api_server` and
`worker+cpu_worker` tell what the plugin adds from what it only imports earlier),
after one warm-up process each, in fresh subprocesses (`--runs` per role, the
roles interleaved; bytecode cached as in an installed wheel):
1. import what vLLM has imported where it calls `load_general_plugins()` in that
   process (the baseline; see BASELINE below) and look the entry point up with
   `importlib.metadata`, as vLLM does;
2. snapshot `sys.modules`;
3. time `entry_point.load()` (importing `vllm_patchkit.runtime.plugin` and what it needs)
   and `register()` with VLLM_PATCHKIT_ROLE=<role>: load and validate the shipped
   patch set and manifests, verify, apply the import-stage patches, write the record;
4. list the modules that were not in `sys.modules` before.

Times are medians over the runs: load/register/total in wall-clock time, and
"total CPU" in this process's CPU time (`time.process_time`, which a busy machine
inflates far less); the goal is judged on CPU time. One more run
per role traces every new import to where it came from: the module whose code
imported it, the innermost vllm_patchkit line on the stack, and the patch being
handled there (when a `patch` is in scope); `--profile N` adds a cProfile top N.
The start-up caches (vllm_patchkit/upstream/cache.py) go to a fresh folder per benchmark, filled
by the warm-up run: the figures are those of every process after the first one of an
installation; `--cache off` measures a process computing everything itself.
Goal (issues 4, 15): <= 30 ms and no module vLLM would not have imported by then; the
verdict line names the worst role.
Figures measured on the project's machine and their reading: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import machine, median, table  # noqa: E402

GOAL_MS = 30.0
ENTRY_GROUP, ENTRY_NAME = "vllm.general_plugins", "vllm_patchkit"
# What vLLM has imported by the time it calls load_general_plugins() in each process:
# the front end calls it from EngineArgs (vllm.engine.arg_utils), EngineCore from
# EngineCore.__init__ (vllm.v1.engine.core), a worker from WorkerWrapperBase.init_worker
# (vllm.v1.worker.worker_base).
# Two more baselines separate what the plugin adds from what it only imports earlier:
# `frontend+api_server` is the front end of `python -m vllm.entrypoints.openai.api_server`,
# which has imported the whole HTTP server before it builds EngineArgs; `worker+cpu_worker`
# is a CPU worker once it has imported its worker class (right after the plugins load;
# CPUWorker subclasses vllm.v1.worker.gpu_worker.Worker, the CUDA worker).
BASELINE = {
    "frontend": ["vllm", "vllm.engine.arg_utils"],
    "frontend+api_server": ["vllm", "vllm.engine.arg_utils", "vllm.entrypoints.openai.api_server"],
    "engine_core": ["vllm", "vllm.engine.arg_utils", "vllm.v1.engine.core"],
    "worker": ["vllm", "vllm.engine.arg_utils", "vllm.v1.worker.worker_base"],
    "worker+cpu_worker": ["vllm", "vllm.engine.arg_utils", "vllm.v1.worker.worker_base", "vllm.v1.worker.cpu_worker"],
}
DEFAULT_ROLES = tuple(BASELINE)


CACHE_DIR = ""  # --cache: the start-up cache's folder for the children (default: a fresh one per benchmark)


def role_of(variant: str) -> str:
    return variant.split("+")[0]


# -- child ------------------------------------------------------------------------------------
class _Tracer:
    """A meta-path finder that finds nothing and notes who asked for each new module."""

    def __init__(self, ours: str):
        self.ours = ours
        self.seen: dict[str, dict] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.seen:
            self.seen[name] = self._who(sys._getframe(1))
        return None

    def _who(self, frame) -> dict:
        importer = site = patch = None
        while frame is not None:
            fname = frame.f_code.co_filename
            if importer is None and not fname.startswith("<frozen") and "importlib" not in fname:
                importer = f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}"
            if site is None and fname.startswith(self.ours):
                site = f"{os.path.relpath(fname, self.ours)}:{frame.f_lineno} {frame.f_code.co_name}"
            if patch is None and fname.startswith(self.ours):
                p = frame.f_locals.get("patch")
                patch = getattr(p, "key", None)
            frame = frame.f_back
        return {"importer": importer, "site": site, "patch": patch}


def child(variant: str, out: Path, trace: bool, profile: int) -> None:
    import importlib

    t0 = time.perf_counter()
    for name in BASELINE[variant]:
        importlib.import_module(name)
    from importlib.metadata import entry_points

    ep = next(e for e in entry_points(group=ENTRY_GROUP) if e.name == ENTRY_NAME)
    t1 = time.perf_counter()
    # vLLM's imports leave a full collection due (hundreds of thousands of new long-lived objects); whoever
    # allocates next pays it (300-600 ms CPU after the API server import), with or without the plugin. It is
    # run here, before the snapshot, so it is not charged to the plugin; GC pauses inside the window are shown.
    import gc

    gc.collect()
    pauses = {"cpu": 0.0, "n": 0}

    def on_gc(phase, info, pauses=pauses):
        if phase == "start":
            pauses["t"] = time.process_time()
        elif "t" in pauses:
            pauses["cpu"] += time.process_time() - pauses.pop("t")
            pauses["n"] += 1

    gc.callbacks.append(on_gc)
    before = set(sys.modules)
    tracer = None
    if trace:
        import importlib.util

        spec = importlib.util.find_spec("vllm_patchkit")  # a top-level find_spec imports nothing
        src = Path(next(iter(spec.submodule_search_locations))).resolve().parent
        tracer = _Tracer(str(src) + os.sep)
        sys.meta_path.insert(0, tracer)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c2, t2 = time.process_time(), time.perf_counter()
    register = ep.load()
    c3, t3 = time.process_time(), time.perf_counter()
    error = None
    try:
        register()
    except Exception as exc:  # a refusal or failed patch is a result to print, not a crash
        error = f"{type(exc).__name__}: {exc}"
    c4, t4 = time.process_time(), time.perf_counter()
    gc.callbacks.remove(on_gc)
    profile_text = None
    if prof is not None:
        import io
        import pstats

        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(profile)
        profile_text = buf.getvalue()
    if tracer:
        sys.meta_path.remove(tracer)
    new = sorted(set(sys.modules) - before)
    from vllm_patchkit.runtime import state as runtime

    loader = runtime.current()
    counts = loader.counts() if loader else {}
    applied = sorted(r.patch for r in loader.records.values() if r.state == "applied") if loader else []
    failed = [f"{r.patch} ({r.code}): {r.reason}" for r in loader.records.values() if r.state in ("failed", "refused")] \
        if loader else []
    result = {
        "role": variant, "profile": profile_text, "baseline_s": t1 - t0, "load_s": t3 - t2, "register_s": t4 - t3,
        "load_cpu_s": c3 - c2, "register_cpu_s": c4 - c3, "gc_cpu_s": pauses["cpu"], "error": error,
        "new": new, "counts": counts, "applied": applied, "failed": failed,
        "who": {m: tracer.seen.get(m) for m in new} if tracer else None,
    }
    out.write_text(json.dumps(result))


# -- parent -----------------------------------------------------------------------------------
def run_child(variant: str, status_dir: Path, trace: bool = False, profile: int = 0) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    env = {**os.environ, "VLLM_PATCHKIT_ROLE": role_of(variant), "VLLM_PATCHKIT_STATUS_DIR": str(status_dir),
           "VLLM_PATCHKIT_CACHE_DIR": CACHE_DIR or str(status_dir / ".startup-cache"),
           "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("VLLM_PATCHKIT_RUN_ID", None)
    # Bytecode as an installed wheel has it (pip compiles at install): without this, a
    # PYTHONDONTWRITEBYTECODE=1 environment recompiles vllm_patchkit in every process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, __file__, "--child", variant, "--out", str(out)]
    cmd += (["--trace"] if trace else []) + (["--profile", str(profile)] if profile else [])
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0 or not out.stat().st_size:
            raise SystemExit(f"child for {variant} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def group(name: str) -> str:
    """Report unit: the top-level package, or two levels for vllm / vllm_patchkit."""
    parts = name.split(".")
    return ".".join(parts[:3]) if parts[0] == "vllm" else ".".join(parts[:2]) if parts[0] == "vllm_patchkit" else parts[0]


def report_imports(traced: dict, all_modules: bool) -> None:
    new = traced["new"]
    who = traced["who"] or {}
    ours = [m for m in new if m == "vllm_patchkit" or m.startswith("vllm_patchkit.")]
    others = [m for m in new if m not in ours]
    print(f"  new modules: {len(new)} ({len(ours)} vllm_patchkit.*, {len(others)} others)")
    groups: dict[str, list[str]] = defaultdict(list)
    for m in others:
        groups[group(m)].append(m)
    rows = []
    for g, mods in sorted(groups.items(), key=lambda kv: (not kv[0].startswith("vllm"), kv[0])):
        head = min(mods, key=len)  # the first module of the group to be asked for
        w = who.get(head) or {}
        rows.append((g, len(mods), w.get("importer") or "?", w.get("site") or "-", w.get("patch") or "-"))
    if rows:
        table(("module (group)", "n", "imported by", "vllm_patchkit site", "patch"), rows)
    if all_modules:
        for m in others:
            w = who.get(m) or {}
            print(f"    {m}  <- {w.get('importer')}  [{w.get('site')}] {w.get('patch') or ''}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per role (default 5)")
    ap.add_argument("--roles", default=",".join(DEFAULT_ROLES),
                    help="comma-separated, from: " + ", ".join(BASELINE) + " (default: all)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the top N functions (cProfile, cumulative) of one extra run per role")
    ap.add_argument("--all-modules", action="store_true", help="list every new module, not only the groups")
    ap.add_argument("--cache", default="", metavar="DIR|off",
                    help="VLLM_PATCHKIT_CACHE_DIR of the children: `off` measures every process computing everything "
                         "(the first process of an installation); default: a fresh folder, filled by the warm-up run "
                         "(every later process)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.out, args.trace, args.profile)
        return 0

    global CACHE_DIR
    CACHE_DIR = args.cache
    roles = [r for r in args.roles.split(",") if r]
    print(f"startup: {machine()}")
    results: dict[str, list[dict]] = {r: [] for r in roles}
    traced: dict[str, dict] = {}
    profiles: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-patchkit-bench-status-") as status:
        for role in roles:  # warm-up: bytecode written, page cache filled
            run_child(role, Path(status))
        for i in range(args.runs):
            for role in roles:
                results[role].append(run_child(role, Path(status)))
                r = results[role][-1]
                print(f"  run {i + 1}/{args.runs} {role}: load {r['load_s'] * 1e3:.0f} ms, "
                      f"register {r['register_s'] * 1e3:.0f} ms", flush=True)
        for role in roles:
            traced[role] = run_child(role, Path(status), trace=True)
            if args.profile:
                profiles[role] = run_child(role, Path(status), profile=args.profile)["profile"]
    print(f"\n{args.runs} fresh processes per role (after one warm-up each); medians in ms. baseline: the imports "
          "of BASELINE[role], before the snapshot; load: entry_point.load(); register: register()\n")
    rows = []
    totals = {}
    for role in roles:
        rs = results[role]

        def med(key, rs=rs):
            return median([r[key] for r in rs]) * 1e3

        tot = median([(r["load_s"] + r["register_s"]) for r in rs]) * 1e3
        cpu = median([(r["load_cpu_s"] + r["register_cpu_s"]) for r in rs]) * 1e3
        gc_ms = median([r.get("gc_cpu_s", 0.0) for r in rs]) * 1e3
        totals[role] = (tot, cpu)
        c = rs[-1]["counts"]
        others = [m for m in rs[-1]["new"] if not (m == "vllm_patchkit" or m.startswith("vllm_patchkit."))]
        rows.append((role, f"{med('baseline_s'):.0f}", f"{med('load_s'):.1f}", f"{med('register_s'):.1f}",
                     f"{tot:.1f}", f"{cpu:.1f}", f"{gc_ms:.1f}", f"{cpu / GOAL_MS:.1f}x", len(rs[-1]["new"]) - len(others),
                     len(others), f"{c.get('applied', 0)}/{c.get('not_imported', 0)}/{c.get('skipped', 0)}/"
                                  f"{c.get('failed', 0)}/{c.get('pending', 0)}"))
    table(("role (baseline)", "baseline", "load", "register", "total", "total CPU", "of it GC", "CPU vs 30 ms",
           "new ours", "new others", "applied/not_imported/skipped/failed/pending"), rows)
    for role in roles:
        t = traced[role]
        print(f"\n{role}: applied {', '.join(t['applied']) or 'none'}" + (f"; error: {t['error']}" if t["error"] else ""))
        for f in t["failed"]:
            print(f"  FAILED {f}")
        report_imports(t, args.all_modules)
        if role in profiles:
            print(profiles[role])
    worst_role = max(totals, key=lambda r: totals[r][1])
    worst = totals[worst_role][1]
    extra = {role: sum(1 for m in traced[role]["new"] if not m.startswith("vllm_patchkit")) for role in roles}
    print(f"\ngoal <= {GOAL_MS:.0f} ms CPU and no new module outside vllm_patchkit: "
          f"{'met' if worst <= GOAL_MS and not any(extra.values()) else 'MISSED'} "
          f"(worst role {worst_role}: {worst:.0f} ms CPU; new modules outside vllm_patchkit: {extra})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

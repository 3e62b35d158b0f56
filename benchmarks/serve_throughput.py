"""End to end: serving with the plugin vs without it, in pairs, and a bound on the plugin's cost per step.

    python benchmarks/serve_throughput.py [--model v4-standin|llama] [--pairs 1] [--quick]
                                          [--requests 64] [--tokens 64] [--concurrency 8]

Each run starts a real vLLM OpenAI server on 127.0.0.1 (the demo's tiny random
Llama, `vllm_patchkit.tools.serve.server.serve`: float32, max-model-len 512,
max-num-seqs 8, 1 GiB KV cache), sends `--warmup` requests, then times
`--repeats` batches of `--requests` completions of exactly `--tokens` tokens each
(`ignore_eos`, greedy) from `--concurrency` threads (urllib, loopback only), and
stops the server with its whole process group. tokens/s = completion tokens
(checked against the server's `usage`) / wall time of the median batch.

`--model v4-standin` (the default when the test-only stand-in plugin
`tests/plugins/standin` is installed): the same checkpoint named
`DeepseekV4ForCausalLM`, served with PATCHKIT_STANDIN=1 by the stand-in's
out-of-tree class, so the DeepSeek-V4 patches apply (batch-dispatch-override in
the worker, the image-publish patches in EngineCore). `--model llama`: the plain
tiny Llama (only the framework's own hooks apply).

- with:    VLLM_PLUGINS=vllm_patchkit (+ patchkit_standin for the stand-in)
- without: VLLM_PLUGINS=<a name no plugin has> (+ patchkit_standin); vLLM's allow-list
           then does not load this plugin (`vllm/plugins/__init__.py:load_plugins_by_group`);
           it gets the env defaults the plugin's `env_default` patches set in the first
           "with" run (read from its records; for a V4 name VLLM_USE_BREAKABLE_CUDAGRAPH=0,
           without which vLLM serves it uncompiled), so that both serve the same vLLM
           configuration and only the plugin's code differs (`--plain-without`: not so)

Both runs of a pair get the same arguments and environment otherwise; pairs
alternate the order (with first, then without first, ...) so slow drift of the
machine cancels. Checked after every run: a "with" run left records from its
processes in its status directory, a "without" run none; and at the end, no
server process is left. Printed: each run, each pair's ratio with/without, and the
median ratio. Also printed, as a second, steadier figure on a busy machine: the
CPU time (utime+stime of the server's processes, /proc) per 1000 tokens; and the
time to ready, with the key of vLLM's torch.compile cache each run used: a key
that changes from run to run means every start misses vLLM's compile cache
(the plugin's registered env vars enter that key; see benchmarks/README.md).

The bound (the figure this machine's +-20 % run-to-run noise does not blur):

1. calls per engine step, per patch and role, from each process's own record (what
   `vllm-patchkit status --json` reads), over the timed window only: the records are
   read after the warm-up and after the timed batches, each time once the
   processes' flusher has written what the window did; engine steps are the
   EngineCore's step count (the core.steps.* patches) over the same window;
2. ns per call of each patch, measured here, after the serves, side by side: the
   patch's own declaration and implementation installed through `apply.install`
   (as in production) at a no-op stand-in of its target with the target's exact
   signature, called the way vLLM calls it, against that bare no-op; the
   difference is the wrapper plus the implementation's own work on the path this
   serve takes (stub objects carrying the state the implementation reads; for
   batch-dispatch-override the dearer of its two paths, decode and override);
   process CPU time, interleaved rounds, median of per-round differences (a warm
   loop: the headroom factor printed says how much dearer a cold call could be); an
   implementation without a model here is timed as the framework's layer only and
   the verdict says it is not modelled;
3. the flusher: one record write per process per flush interval while counts change
   (timed here by writing the run's own records the way the flusher does);
4. the median engine step interval of the same serve: per timed batch, wall time /
   engine iterations counted by vLLM's own `/metrics`
   (`vllm:iteration_tokens_total_count`), median over batches;

then ns/step = calls/step x ns/call, summed over every process as if none ran in
parallel, as a percentage of the median step: an upper bound of the overhead
(goal <= 1 %), printed next to the paired-run ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import timeit
import types
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import interleaved, machine, median, noop_like, table, vllm_version  # noqa: E402

from patchkit_deepseek_v4.demo import default_workdir  # noqa: E402
from vllm_patchkit.tools.serve.server import serve  # noqa: E402
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model  # noqa: E402

PLUGIN = "vllm_patchkit"
NO_PLUGIN = "vllm-patchkit-bench-no-such-plugin"
STANDIN = "patchkit_standin"
GOAL_PCT = 1.0
FLUSH_ENV = "VLLM_PATCHKIT_FLUSH_SECONDS"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PROMPTS = ("The quick brown fox", "Once upon a time", "What is the capital of France?", "Hello, world!",
           "The engine core runs the scheduler", "Numbers like 0 1 2 3", "She sells sea shells", "import os, sys")


def _start_time(pid: int):
    """(start time, state) of a pid from /proc, or None: tells a reused pid from the one we saw."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19], fields[0]


def note(seen: dict[int, str], pids) -> None:
    for pid in pids:
        st = _start_time(pid)
        if st is not None:
            seen.setdefault(pid, st[0])


def left_behind(seen: dict[int, str]) -> list[int]:
    out = []
    for pid, start in seen.items():
        st = _start_time(pid)
        if st is not None and st[0] == start and st[1] != "Z":
            out.append(pid)
    return sorted(out)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    """utime + stime of these processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def compile_key(log: Path) -> str:
    """The key of vLLM's torch.compile cache directory this run used (from the server log), or '-'."""
    m = re.search(r"torch_compile_cache/(?:torch_aot_compile/)?([0-9a-f]{8,})", log.read_text(errors="replace"))
    return m.group(1)[:10] if m else "-"


def iterations(srv) -> tuple[float, float | None]:
    """Engine iterations so far by vLLM's own metrics (the front end's count of engine steps with output), and
    the seconds the plugin's collector took to read the records at this scrape (None without the plugin)."""
    with _NO_PROXY.open(srv.base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("vllm:iteration_tokens_total_count"))
    m = re.search(r"^vllm_patchkit_scrape_duration_seconds (\S+)", text, re.M)
    return total, (float(m.group(1)) if m else None)


def snapshot(status: Path, since: float, interval: float) -> list[dict]:
    """The run's records as `vllm-patchkit status --json` reads them (`status.load_run`), once every process
    that steps has flushed after `since` (or one flush interval and a margin passed: nothing changed since)."""
    from vllm_patchkit.reporting.run_folder import load_run

    deadline = time.time() + interval + 1.5
    while True:
        run = load_run(status)
        procs = run.processes if run else []
        stepping = [p for p in procs if p.get("steps") is not None]
        if (stepping and all(p.get("updated", 0) > since for p in stepping)) or time.time() > deadline:
            return procs
        time.sleep(0.2)


def window(before: list[dict], after: list[dict]) -> dict:
    """Calls per patch per process, and engine steps, between two snapshots of the same run."""
    def calls(procs):
        return {(p["role"], p["pid"], r["patch"]): r for p in procs for r in p.get("patches", [])}

    def steps(procs):
        return sum(p.get("steps") or 0 for p in procs if p.get("role") == "engine_core")

    b, a = calls(before), calls(after)
    rows = []
    for key, rec in a.items():
        if rec.get("kind") not in ("wrap", "replace") or (rec.get("state") != "applied" and not rec.get("calls")):
            continue  # a row that counts calls: applied (or applied late, when its module was imported)
        rows.append({"role": key[0], "pid": key[1], "patch": rec["patch"], "kind": rec["kind"],
                     "expected_calls": rec.get("expected_calls"), "detail": rec.get("detail") or {},
                     "calls": rec.get("calls", 0) - (b.get(key) or {}).get("calls", 0),
                     "calls_run": rec.get("calls", 0)})
    changed = {(r["role"], r["pid"]) for r in rows if r["calls"]}
    return {"steps": steps(after) - steps(before), "steps_run": steps(after), "rows": rows,
            "records": [p for p in after if (p["role"], p["pid"]) in changed]}


def env_defaults_set(docs: list[dict]) -> dict[str, str]:
    """The env defaults the plugin's `env_default` patches set in a run (their records: "set NAME=VALUE (was unset)")."""
    out = {}
    for d in docs:
        for r in d.get("patches", []):
            m = re.match(r"set (\w+)=(.*) \(was unset\)$", str((r.get("detail") or {}).get("env", "")))
            if r.get("kind") == "env_default" and r.get("state") == "applied" and m:
                out[m.group(1)] = m.group(2)
    return out


def one_run(model: Path, with_plugin: bool, args, workdir: Path, tag: str, seen_pids: dict[int, str],
            extra_env: dict[str, str] | None = None) -> dict:
    if args.stable_compile_key:
        # Same status dir path and run id every run: the plugin's env vars then hash the same.
        status = workdir / "status"
        shutil.rmtree(status, ignore_errors=True)
        status.mkdir()
    else:
        status = Path(tempfile.mkdtemp(prefix=f"status-{tag}-", dir=workdir))
    plugins = [PLUGIN if with_plugin else NO_PLUGIN] + ([STANDIN] if args.model == "v4-standin" else [])
    env = {"VLLM_PLUGINS": ",".join(plugins), "VLLM_PATCHKIT_STATUS_DIR": str(status)}
    if args.model == "v4-standin":
        env["PATCHKIT_STANDIN"] = "1"
    env.update(extra_env or {})
    if args.stable_compile_key:
        env["VLLM_PATCHKIT_RUN_ID"] = "serve-throughput-bench"
    interval = float(os.environ.get(FLUSH_ENV, "2"))
    log = workdir / f"server-{tag}.log"
    t0 = time.monotonic()
    with serve(model, env=env, log_path=log, timeout=args.timeout) as srv:
        ready = time.monotonic() - t0
        note(seen_pids, srv.processes())

        def ask(i: int) -> int:
            out = srv.complete(PROMPTS[i % len(PROMPTS)], max_tokens=args.tokens, ignore_eos=True)
            return int(out["usage"]["completion_tokens"])

        batches, cpu, steps = [], [], []
        server_pids = list(srv.processes())
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(ask, range(args.warmup)))
            if with_plugin:
                before = snapshot(status, time.time(), interval)
            for _ in range(args.repeats):
                n0, _ = iterations(srv)
                c1, t1 = cpu_seconds(server_pids), time.perf_counter()
                tokens = sum(pool.map(ask, range(args.requests)))
                batches.append((tokens, time.perf_counter() - t1))
                cpu.append(cpu_seconds(server_pids) - c1)
                n1, scrape_s = iterations(srv)
                steps.append(n1 - n0)
            if with_plugin:
                after = snapshot(status, time.time(), interval)
        note(seen_pids, srv.processes())
    records = sorted(status.rglob("*.json"))
    docs = [json.loads(p.read_text()) for p in records]
    roles = sorted({d.get("role", "?") for d in docs})
    steps_run = sum(d.get("steps") or 0 for d in docs if d.get("role") == "engine_core")
    calls = sum(p.get("calls") or 0 for d in docs for p in d.get("patches", []))
    failed = sorted({f"{p['patch']} in {d.get('role')} ({p.get('code')})" for d in docs for p in d.get("patches", [])
                     if p.get("state") in ("failed", "refused")})
    if with_plugin and not records:
        raise SystemExit(f"{tag}: the plugin left no record in {status}; was it loaded? log: {log}")
    if not with_plugin and records:
        raise SystemExit(f"{tag}: records in {status} although VLLM_PLUGINS excluded the plugin")
    if failed:
        raise SystemExit(f"{tag}: patches failed or refused: {', '.join(failed)}; log: {log}")
    expected = args.requests * args.tokens
    if any(tokens != expected for tokens, _ in batches):
        raise SystemExit(f"{tag}: completion tokens per batch {[t for t, _ in batches]}, expected {expected}")
    wall = median([w for _, w in batches])
    out = {"tag": tag, "plugin": with_plugin, "ready_s": ready, "wall_s": wall, "tokens": expected,
           "tps": expected / wall, "batches_tps": [t / w for t, w in batches], "roles": roles,
           "steps": steps_run, "calls": calls, "failed": failed,
           "step_ms": [w / n * 1e3 for (_, w), n in zip(batches, steps) if n > 0],
           "iterations": sum(steps), "scrape_ms": None if scrape_s is None else scrape_s * 1e3,
           "env_defaults": env_defaults_set(docs),
           "cpu_ms_per_1k": median(cpu) / expected * 1e6, "compile_key": compile_key(log)}
    if with_plugin:
        out["window"] = window(before, after)
        if out["window"]["steps"] <= 0:
            raise SystemExit(f"{tag}: the records counted no engine step in the timed window; log: {log}")
    return out


# -- the bound: ns per call of every patch, measured here ------------------------------------------------
class Stub:
    """An attribute bag standing in for a vLLM object (a request, a runner's input batch, a manager)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _request():
    return Stub(request_id="bench-0", num_computed_tokens=64, num_prompt_tokens=8, block_hashes=[],
                status=Stub(name="FINISHED_LENGTH_CAPPED"))


def scenarios(key: str, images: bool, max_seqs: int):
    """How vLLM calls a patch's target in this serve, with the state its implementation reads there:
    [(label, set-up of the instance, args, kwargs, the original's result)]; None: not modelled here."""
    pid = key.partition("@")[0]
    if pid == "batch-dispatch-override":
        import numpy as np

        from vllm.config import CUDAGraphMode
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        from patchkit_deepseek_v4.batch_dispatch_override import RUNNER_ATTR

        def runner(prefill: bool):
            def setup(o):
                o.__dict__[RUNNER_ATTR] = True  # decided once per runner: the plugin's model
                o.input_batch = Stub(num_prompt_tokens=np.full(max_seqs, 8, np.int32),
                                     num_computed_tokens_cpu=np.full(max_seqs, 4 if prefill else 40, np.int32))
                o.uniform_decode_query_len = 1
                o._is_uniform_decode = GPUModelRunner._is_uniform_decode  # the staticmethod itself
            return setup

        def call(n_tokens):  # as GPUModelRunner.execute_model calls it (keywords)
            return dict(num_tokens=n_tokens, num_reqs=max_seqs,
                        num_scheduled_tokens_np=np.ones(max_seqs, np.int32),
                        max_num_scheduled_tokens=n_tokens // max_seqs, use_cascade_attn=False,
                        num_encoder_reqs=0, allow_microbatching=False)

        result = (CUDAGraphMode.NONE, None, False, None, None)
        return [("decode step", runner(False), (), call(max_seqs), result),
                ("override step", runner(True), (), call(4 * max_seqs), result)]
    if pid.startswith("image-publish") and images:
        return None  # an adapter's image groups are live: the book's work is not modelled here
    if pid == "image-publish":
        from patchkit_deepseek_v4.image_publish import BOOK_ATTR

        def setup(o):
            o.__dict__[BOOK_ATTR] = None  # the record says layout: null (no adapter's image groups)
        return [("no image groups", setup, (_request(), 1), {"num_lookahead_tokens": 0}, "blocks")]
    if pid in ("image-publish-finish", "image-publish-preempt"):
        def setup(o):
            o.kv_cache_manager = Stub()  # no book on it
        extra = (0.0,) if pid.endswith("preempt") else ()
        return [("no image book", setup, (_request(), *extra), {}, None)]
    if pid == "image-publish-split":
        from patchkit_deepseek_v4.image_publish import LAYOUT_ATTR

        def setup(o):
            o.__dict__[LAYOUT_ATTR] = None
        return [("no image layout", setup, (_request(), 16),
                 {"num_new_local_computed_tokens": 0, "num_external_computed_tokens": 0}, 16)]
    if pid == "image-publish-suppress":
        return [("not an image group", lambda o: None, (_request(), 16), {"replay_boundaries": None}, None)]
    return None


def _passthrough_call(fn, bound: bool):
    """Positional None for each required parameter (a passthrough reads none of them)."""
    import inspect

    params = list(inspect.signature(fn).parameters.values())[1 if bound else 0:]
    P = inspect.Parameter
    n = sum(1 for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
    kw = {p.name: None for p in params if p.kind is P.KEYWORD_ONLY and p.default is p.empty}
    return (None,) * n, kw


def patch_costs(rows: list[dict], args) -> dict[str, dict]:
    """ns/call for every patch with calls in the window: its installed wrapper vs the bare no-op of its target."""
    from vllm_patchkit.runtime import apply
    from vllm_patchkit.runtime.wrappers import MARK
    from vllm_patchkit.upstream.targets import function_of
    from vllm_patchkit.runtime.context import live_target
    from vllm_patchkit.upstream.convention import wrap_takes_context
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
    from vllm_patchkit.declaration.kinds import traits
    from vllm_patchkit.upstream.targets import Place, resolve

    pset = load_patch_set(installed_sources())
    images = any(r["patch"].startswith("image-publish@") and r["detail"].get("layout") for r in rows)
    wanted = sorted({r["patch"] for r in rows if r["calls"] > 0})
    timers, plan = {}, {}
    for n, key in enumerate(wanted):
        patch = pset.patches[key]
        fn, bound = live_target(patch.target)
        impl = None if patch.implementation is None else resolve(patch.implementation).get_raw()
        how = "passthrough" if impl is None else "implementation"
        cases = None if impl is None or not traits(patch).wraps_original else scenarios(key, images, args.max_seqs)
        if impl is None:
            a, kw = _passthrough_call(fn, bound)
            cases = [("passthrough", lambda o: None, a, kw, None)]
        elif cases is None:  # the framework's layer only: a trivial implementation of the same shape
            ctx_shape = wrap_takes_context(impl)
            impl = ((lambda wrapped, instance, a, kw, ctx: wrapped(*a, **kw)) if ctx_shape
                    else (lambda wrapped, instance, a, kw: wrapped(*a, **kw)))
            how = "framework layer only: implementation NOT modelled"
            a, kw = _passthrough_call(fn, bound)
            cases = [("trivial implementation", lambda o: None, a, kw, None)]
        plan[key] = {"how": how, "cases": []}
        for m, (label, setup, a, kw, result) in enumerate(cases):
            original = noop_like(fn, result)
            name = fn.__name__
            if bound:
                wrapped_owner = type(f"Patched{n}_{m}", (), {name: original})
                bare_owner = type(f"Bare{n}_{m}", (), {name: original})
                o, b = wrapped_owner(), bare_owner()
                setup(o)
                setup(b)
            else:
                o = wrapped_owner = types.ModuleType(f"bench_patched_{n}_{m}")
                b = types.ModuleType(f"bench_bare_{n}_{m}")
                setattr(o, name, original)
                setattr(b, name, original)
            place = Place(f"{__name__}:{name}", wrapped_owner, name)
            applied = apply.install(patch, place, [], impl, patch.count_calls)
            assert getattr(function_of(place.get_raw()), MARK) == patch.key
            g = {"A": a, "K": kw}
            stmt = f"o.{name}(*A, **K)"
            timers[key, m, "patched"] = timeit.Timer(stmt, globals={**g, "o": o}, timer=time.process_time)
            timers[key, m, "bare"] = timeit.Timer(stmt, globals={**g, "o": b}, timer=time.process_time)
            plan[key]["cases"].append((m, label, applied))
    samples = interleaved(timers, args.cost_rounds, args.cost_number, args.seed)
    out = {}
    for key, p in plan.items():
        per_case = []
        for m, label, applied in p["cases"]:
            diffs = [x - y for x, y in zip(samples[key, m, "patched"], samples[key, m, "bare"])]
            per_case.append((median(diffs), label, median(samples[key, m, "bare"])))
            if patch_counts(applied) is not None and patch_counts(applied) < args.cost_rounds * args.cost_number:
                raise SystemExit(f"{key} ({label}): its counter saw {patch_counts(applied)} calls: not the installed wrapper")
        ns, label, bare = max(per_case)
        names = ", ".join(c[1] for c in per_case)
        out[key] = {"ns": ns, "label": ("passthrough" if p["how"] == "passthrough" else
                                        "wrapper only, impl NOT modelled" if "NOT" in p["how"] else
                                        f"impl: {label}" if len(per_case) == 1 else f"impl: max({names})"),
                    "cases": per_case, "how": p["how"], "bare_ns": bare}
    return out


def patch_counts(applied) -> int | None:
    return applied.counter.calls if applied.patch.count_calls else None


def flush_costs(records: list[dict], args) -> dict[tuple[str, int], float]:
    """ns per record write, per process: its own last record, serialised and written as the flusher does."""
    from vllm_patchkit.runtime.record import ProcessRecord, write_atomic

    out = {}
    with tempfile.TemporaryDirectory(prefix="vllm-patchkit-bench-flush-") as tmp:
        for doc in records:
            rec = ProcessRecord.from_json(doc)
            path = Path(tmp) / f"{rec.role}-{rec.pid}.json"
            t = timeit.Timer(lambda: write_atomic(path, rec.to_json()), timer=time.process_time)
            t.timeit(3)
            out[rec.role, rec.pid] = median([t.timeit(10) / 10 * 1e9 for _ in range(args.flush_rounds)])
    return out


def pooled(runs: list[dict]) -> dict:
    """The windows of every "with" run together: calls per (role, patch) summed over runs and the role's
    processes, engine steps summed over runs (a role with several processes counts all their calls per step)."""
    rows: dict[tuple[str, str], dict] = {}
    steps = 0
    procs: dict[str, int] = {}
    for r in runs:
        w = r["window"]
        steps += w["steps"]
        per_role: dict[str, set] = {}
        for row in w["rows"]:
            key = (row["role"], row["patch"])
            got = rows.setdefault(key, {**row, "calls": 0, "calls_run": 0})
            got["calls"] += row["calls"]
            got["calls_run"] += row["calls_run"]
            if row["calls"]:
                per_role.setdefault(row["role"], set()).add(row["pid"])
        for role, pids in per_role.items():
            procs[role] = max(procs.get(role, 0), len(pids))
    return {"steps": steps, "rows": list(rows.values()), "procs": procs,
            "records": [d for r in runs for d in r["window"]["records"]]}


def bound_table(w: dict, costs: dict, flushes: dict, step_ms: float, interval: float) -> float:
    """Print the table; returns the bound in % of the median step."""
    steps, step_ns = w["steps"], step_ms * 1e6
    order = {"frontend": 0, "engine_core": 1, "worker": 2}
    rows, total = [], 0.0
    for r in sorted(w["rows"], key=lambda r: (order.get(r["role"], 9), -r["calls"], r["patch"])):
        if r["calls"] == 0:
            rows.append((r["patch"], r["role"], "0", "-", "0", "0",
                         f"none in window ({r['calls_run']} in run; {r['expected_calls']})"))
            continue
        c = costs[r["patch"]]
        per_step = r["calls"] / steps
        ns_step = per_step * c["ns"]
        total += ns_step
        rows.append((r["patch"], r["role"], f"{per_step:.3f}", f"{c['ns']:.0f}", f"{ns_step:.0f}",
                     f"{ns_step / step_ns * 100:.4f}", c["label"]))
    for role in sorted(w["procs"], key=lambda x: order.get(x, 9)):
        ns = max(v for (r, _), v in flushes.items() if r == role)
        per_step = w["procs"][role] * step_ms / 1e3 / interval
        ns_step = per_step * ns
        total += ns_step
        rows.append(("(flusher: record write)", role, f"{per_step:.4f}", f"{ns:.0f}", f"{ns_step:.0f}",
                     f"{ns_step / step_ns * 100:.4f}", f"1 write/{interval:g} s/process"))
    pct = total / step_ns * 100
    rows.append(("TOTAL (every process, as if serial)", "", "", "", f"{total:.0f}", f"{pct:.4f}", ""))
    table(("patch", "role", "calls/step", "ns/call", "ns/step", "% of median step", "timed as"), rows)
    return pct


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    standin = importlib.util.find_spec(STANDIN) is not None
    ap.add_argument("--model", choices=("v4-standin", "llama"), default="v4-standin" if standin else "llama",
                    help="the V4 stand-in (PATCHKIT_STANDIN=1; default when tests/plugins/standin is installed) "
                         "or the plain tiny Llama")
    ap.add_argument("--quick", action="store_true",
                    help="one 'with' serve only (no paired ratio), 3 batches of 32 requests, fewer timing rounds "
                         "(~2 min)")
    ap.add_argument("--pairs", type=int, default=1, help="with/without pairs (default 1; 5 for the ratio's spread)")
    ap.add_argument("--requests", type=int, default=64, help="timed requests per batch (default 64)")
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (default 64)")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    ap.add_argument("--warmup", type=int, default=16, help="untimed requests after ready (default 16)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed batches per run; the run's figure is their median (default 5)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for each server")
    ap.add_argument("--cost-rounds", type=int, default=21, help="interleaved rounds timing each patch (default 21)")
    ap.add_argument("--cost-number", type=int, default=20_000, help="calls per timing sample (default 20000)")
    ap.add_argument("--flush-rounds", type=int, default=9, help="samples of 10 record writes (default 9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stable-compile-key", action="store_true",
                    help="give every run the same VLLM_PATCHKIT_RUN_ID and status dir path, so that the plugin's "
                         "env vars do not change vLLM's torch.compile cache key from run to run (isolates the "
                         "steady-state cost from that effect)")
    ap.add_argument("--plain-without", action="store_true",
                    help="do not give the 'without' runs the env defaults the plugin's env_default patches set "
                         "(e.g. VLLM_USE_BREAKABLE_CUDAGRAPH=0 for a V4 name): the pair then compares two vLLM "
                         "configurations, not only the plugin's code")
    ap.add_argument("--strict", action="store_true", help=f"exit 1 when the bound exceeds {GOAL_PCT:g} %%")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="model and logs (default: the demo's cache dir, logs in a temp dir under it)")
    args = ap.parse_args(argv)
    if args.model == "v4-standin" and not standin:
        ap.error("--model v4-standin needs the stand-in plugin: pip install ./tests/plugins/standin")
    if args.quick:
        args.pairs, args.repeats, args.requests, args.warmup = 0, 3, 32, 8
        args.cost_rounds, args.cost_number, args.flush_rounds = 9, 10_000, 5
    args.max_seqs = 8  # vllm_patchkit.tools.serve.server.serve: --max-num-seqs 8

    # Bytecode as an installed wheel has it (pip compiles at install), for both variants alike.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    interval = float(os.environ.get(FLUSH_ENV, "2"))
    base = (args.workdir or default_workdir()).expanduser()
    if args.model == "v4-standin":
        model = build_tiny_model(base / "tiny-standin-v4", "DeepseekV4ForCausalLM")
    else:
        model = build_tiny_model(base / "tiny-llama")
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-serve-", dir=base))
    print(f"serve_throughput: {machine()}, vLLM {vllm_version()}")
    print(f"model {args.model}: {model}; logs and status in {workdir}")
    if args.stable_compile_key:
        print("--stable-compile-key: VLLM_PATCHKIT_RUN_ID and VLLM_PATCHKIT_STATUS_DIR fixed for every run")
    print(f"{args.pairs or 'no'} pairs{' (--quick: one run with the plugin)' if not args.pairs else ''}; per run "
          f"{args.warmup} warm-up requests, then {args.repeats} timed batches of {args.requests} requests x "
          f"{args.tokens} tokens at concurrency {args.concurrency} (median batch)\n", flush=True)
    seen: dict[int, str] = {}
    keys_seen: set[str] = set()
    runs: list[dict] = []
    pairs: list[tuple[dict, dict]] = []
    schedule = [((True, False) if i % 2 == 0 else (False, True)) for i in range(args.pairs)] or [(True,)]
    same_env: dict[str, str] = {}  # from the first "with" run (pair 1 runs it first)
    try:
        for i, order in enumerate(schedule):
            got = {}
            for with_plugin in order:
                tag = f"p{i + 1}-{'with' if with_plugin else 'without'}" if args.pairs else "with"
                r = one_run(model, with_plugin, args, workdir, tag, seen, None if with_plugin else same_env)
                runs.append(r)
                got[with_plugin] = r
                key = r["compile_key"]
                r["key_new"] = key not in keys_seen
                keys_seen.add(key)
                print(f"  {tag:<12} ready {r['ready_s']:5.1f} s (compile-cache key {key}, {'new' if r['key_new'] else 'reused'})  "
                      f"{r['tokens']} tokens in {r['wall_s']:.2f} s = {r['tps']:6.0f} tok/s "
                      f"(batches: {', '.join(f'{x:.0f}' for x in r['batches_tps'])}), "
                      f"server CPU {r['cpu_ms_per_1k']:.0f} ms/1k tokens, "
                      f"step {median(r['step_ms']):.2f} ms (median of batches' wall/iterations); "
                      f"records from: {', '.join(r['roles']) or '-'}"
                      + (f" (engine steps {r['steps']}, counted calls {r['calls']}; timed window: "
                         f"{r['window']['steps']} engine steps by the records, {r['iterations']:.0f} iterations "
                         f"by vLLM's /metrics)" if r["roles"] else ""),
                      flush=True)
                if with_plugin and not same_env and r["env_defaults"] and not args.plain_without:
                    same_env.update(r["env_defaults"])
                    print(f"  (the plugin set {', '.join(f'{k}={v}' for k, v in same_env.items())} by env_default; "
                          "the 'without' runs get the same, so both serve the same vLLM configuration)", flush=True)
            if len(got) == 2:
                pairs.append((got[True], got[False]))
    finally:
        time.sleep(1)
        left = left_behind(seen)
        print(f"\nserver processes left behind: {left or 'none'} (of {len(seen)} seen)")
    ratio = cratio = None
    if pairs:
        rows = []
        for i, (w, wo) in enumerate(pairs):
            rows.append((f"pair {i + 1} ({'with' if i % 2 == 0 else 'without'} first)", f"{w['tps']:.0f}",
                         f"{wo['tps']:.0f}", f"{w['tps'] / wo['tps']:.3f}",
                         f"{w['cpu_ms_per_1k'] / wo['cpu_ms_per_1k']:.3f}",
                         f"{median(w['step_ms']):.2f}", f"{median(wo['step_ms']):.2f}",
                         f"{w['ready_s']:.1f}", f"{wo['ready_s']:.1f}", f"{w['ready_s'] / wo['ready_s']:.3f}"))
        print()
        table(("pair", "tok/s with", "tok/s without", "tok/s ratio", "CPU/token ratio", "step ms with",
               "step ms without", "ready with (s)", "ready without (s)", "ready ratio"), rows)
        ratio = median([w["tps"] / wo["tps"] for w, wo in pairs])
        cratio = median([w["cpu_ms_per_1k"] / wo["cpu_ms_per_1k"] for w, wo in pairs])
        rratio = median([w["ready_s"] / wo["ready_s"] for w, wo in pairs])
        print(f"\nmedian ratios with/without: throughput {ratio:.3f} ({(ratio - 1) * 100:+.1f}%), "
              f"server CPU per token {cratio:.3f} ({(cratio - 1) * 100:+.1f}%), time to ready {rratio:.3f}")
        for variant, with_plugin in (("with", True), ("without", False)):
            rs = [r for r in runs if r["plugin"] is with_plugin]
            keys = sorted({r["compile_key"] for r in rs})
            print(f"compile-cache keys {variant} the plugin: {len(keys)} distinct over {len(rs)} runs ({', '.join(keys)})")

    # -- the bound -----------------------------------------------------------------------------------
    withs = [r for r in runs if r["plugin"]]
    w = pooled(withs)
    step_ms = median([x for r in withs for x in r["step_ms"]])
    print(f"\nbound: calls per engine step from the records of {len(withs)} serve(s) with the plugin "
          f"({args.model}), timed window only ({w['steps']} engine steps); ns per call measured now in this process "
          f"({args.cost_rounds} interleaved rounds x {args.cost_number} calls, process CPU time, "
          f"median of per-round differences to the bare no-op); median engine step {step_ms:.3f} ms "
          f"(wall / vLLM iterations per timed batch, median over {sum(len(r['step_ms']) for r in withs)} batches)",
          flush=True)
    costs = patch_costs(w["rows"], args)
    flushes = flush_costs(w["records"], args)
    print()
    pct = bound_table(w, costs, flushes, step_ms, interval)
    unmodelled = sorted(k for k, c in costs.items() if "NOT modelled" in c["how"])
    for key, c in sorted(costs.items()):
        if len(c["cases"]) > 1:
            print(f"  {key}: " + "; ".join(f"{label} {ns:.0f} ns" for ns, label, _ in c["cases"]))
    scrapes = [r["scrape_ms"] for r in withs if r["scrape_ms"] is not None]
    if scrapes:
        print(f"  not per step: the front end reads the records at each /metrics scrape, "
              f"{median(scrapes):.1f} ms here (vllm_patchkit_scrape_duration_seconds; every 15 s: "
              f"{median(scrapes) / 150:.3f} % of one core)")
    ok = pct <= GOAL_PCT and not unmodelled
    headroom = GOAL_PCT / pct if pct > 0 else float("inf")
    paired = (f"paired-run throughput ratio with/without {ratio:.3f} ({(ratio - 1) * 100:+.1f} %), server CPU per "
              f"token {cratio:.3f}, over {len(pairs)} pair(s): inside this machine's +-20 % noise"
              if pairs else "paired-run ratio: not measured (--quick)")
    fastest = min(x for r in withs for x in r["step_ms"])
    print(f"\nverdict: plugin overhead <= {pct:.3f} % of the median engine step ({step_ms:.3f} ms; "
          f"{pct * step_ms / fastest:.3f} % of the fastest batch's, {fastest:.3f} ms) "
          f"(goal <= {GOAL_PCT:g} %: {'met' if ok else 'NOT MET'}; every call would have to cost {headroom:.1f}x "
          f"its measured ns to reach the goal)"
          + (f"; implementations not modelled: {', '.join(unmodelled)}" if unmodelled else "")
          + f" | {paired}")
    return 1 if left or (args.strict and not ok) else 0


if __name__ == "__main__":
    raise SystemExit(main())

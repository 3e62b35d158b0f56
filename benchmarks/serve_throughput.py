"""End to end: tiny-model CPU serving throughput with the plugin vs without it, in pairs.

    python benchmarks/serve_throughput.py [--pairs 3] [--requests 64] [--tokens 64] [--concurrency 8]

Each run starts a real vLLM OpenAI server on 127.0.0.1 (the demo's tiny random
Llama, `vllm_patchkit.demo.server.serve`: float32, max-model-len 512,
max-num-seqs 8, 1 GiB KV cache), sends `--warmup` requests, then times
`--repeats` batches of `--requests` completions of exactly `--tokens` tokens each
(`ignore_eos`, greedy) from `--concurrency` threads (urllib, loopback only), and
stops the server with its whole process group. tokens/s = completion tokens
(checked against the server's `usage`) / wall time of the median batch.

- with:    VLLM_PLUGINS=vllm_patchkit (only this general plugin loads)
- without: VLLM_PLUGINS=<a name no plugin has> (vLLM's allow-list then loads no
           general plugin at all; `vllm/plugins/__init__.py:load_plugins_by_group`)

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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import machine, median, table, vllm_version  # noqa: E402

from vllm_patchkit.demo.__main__ import default_workdir  # noqa: E402
from vllm_patchkit.demo.server import serve  # noqa: E402
from vllm_patchkit.demo.tiny_model import build_tiny_model  # noqa: E402

PLUGIN = "vllm_patchkit"
NO_PLUGIN = "vllm-patchkit-bench-no-such-plugin"
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


def one_run(model: Path, with_plugin: bool, args, workdir: Path, tag: str, seen_pids: dict[int, str]) -> dict:
    if args.stable_compile_key:
        # Same status dir path and run id every run: the plugin's env vars then hash the same.
        status = workdir / "status"
        shutil.rmtree(status, ignore_errors=True)
        status.mkdir()
    else:
        status = Path(tempfile.mkdtemp(prefix=f"status-{tag}-", dir=workdir))
    env = {"VLLM_PLUGINS": PLUGIN if with_plugin else NO_PLUGIN, "VLLM_PATCHKIT_STATUS_DIR": str(status)}
    if args.stable_compile_key:
        env["VLLM_PATCHKIT_RUN_ID"] = "serve-throughput-bench"
    log = workdir / f"server-{tag}.log"
    t0 = time.monotonic()
    with serve(model, env=env, log_path=log, timeout=args.timeout) as srv:
        ready = time.monotonic() - t0
        note(seen_pids, srv.processes())

        def ask(i: int) -> int:
            out = srv.complete(PROMPTS[i % len(PROMPTS)], max_tokens=args.tokens, ignore_eos=True)
            return int(out["usage"]["completion_tokens"])

        batches, cpu = [], []
        server_pids = list(srv.processes())
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(ask, range(args.warmup)))
            for _ in range(args.repeats):
                c1, t1 = cpu_seconds(server_pids), time.perf_counter()
                tokens = sum(pool.map(ask, range(args.requests)))
                batches.append((tokens, time.perf_counter() - t1))
                cpu.append(cpu_seconds(server_pids) - c1)
        note(seen_pids, srv.processes())
    records = sorted(status.rglob("*.json"))
    docs = [json.loads(p.read_text()) for p in records]
    roles = sorted({d.get("role", "?") for d in docs})
    steps = sum(d.get("steps") or 0 for d in docs if d.get("role") == "engine_core")
    calls = sum(p.get("calls") or 0 for d in docs for p in d.get("patches", []))
    failed = sorted({f"{p['patch']} in {d.get('role')} ({p.get('code')})" for d in docs for p in d.get("patches", [])
                     if p.get("state") in ("failed", "refused")})
    if with_plugin and not records:
        raise SystemExit(f"{tag}: the plugin left no record in {status}; was it loaded? log: {log}")
    if not with_plugin and records:
        raise SystemExit(f"{tag}: records in {status} although VLLM_PLUGINS excluded the plugin")
    expected = args.requests * args.tokens
    if any(tokens != expected for tokens, _ in batches):
        raise SystemExit(f"{tag}: completion tokens per batch {[t for t, _ in batches]}, expected {expected}")
    wall = median([w for _, w in batches])
    return {"tag": tag, "plugin": with_plugin, "ready_s": ready, "wall_s": wall, "tokens": expected,
            "tps": expected / wall, "batches_tps": [t / w for t, w in batches], "roles": roles,
            "steps": steps, "calls": calls, "failed": failed,
            "cpu_ms_per_1k": median(cpu) / expected * 1e6, "compile_key": compile_key(log)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="with/without pairs (default 3)")
    ap.add_argument("--requests", type=int, default=64, help="timed requests per run (default 64)")
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (default 64)")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    ap.add_argument("--warmup", type=int, default=16, help="untimed requests after ready (default 16)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed batches per run; the run's figure is their median (default 5)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for each server")
    ap.add_argument("--stable-compile-key", action="store_true",
                    help="give every run the same VLLM_PATCHKIT_RUN_ID and status dir path, so that the plugin's "
                         "env vars do not change vLLM's torch.compile cache key from run to run (isolates the "
                         "steady-state cost from that effect)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="model and logs (default: the demo's cache dir, logs in a temp dir under it)")
    args = ap.parse_args(argv)

    # Bytecode as an installed wheel has it (pip compiles at install), for both variants alike.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    base = (args.workdir or default_workdir()).expanduser()
    model = build_tiny_model(base / "tiny-llama")
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-serve-", dir=base))
    print(f"serve_throughput: {machine()}, vLLM {vllm_version()}")
    print(f"model {model}; logs and status in {workdir}")
    if args.stable_compile_key:
        print("--stable-compile-key: VLLM_PATCHKIT_RUN_ID and VLLM_PATCHKIT_STATUS_DIR fixed for every run")
    print(f"{args.pairs} pairs; per run {args.warmup} warm-up requests, then {args.repeats} timed batches of "
          f"{args.requests} requests x {args.tokens} tokens at concurrency {args.concurrency} (median batch)\n", flush=True)
    seen: dict[int, str] = {}
    keys_seen: set[str] = set()
    runs: list[dict] = []
    pairs: list[tuple[dict, dict]] = []
    try:
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {}
            for with_plugin in order:
                tag = f"p{i + 1}-{'with' if with_plugin else 'without'}"
                r = one_run(model, with_plugin, args, workdir, tag, seen)
                runs.append(r)
                got[with_plugin] = r
                key = r["compile_key"]
                r["key_new"] = key not in keys_seen
                keys_seen.add(key)
                print(f"  {tag:<12} ready {r['ready_s']:5.1f} s (compile-cache key {key}, {'new' if r['key_new'] else 'reused'})  "
                      f"{r['tokens']} tokens in {r['wall_s']:.2f} s = {r['tps']:6.0f} tok/s "
                      f"(batches: {', '.join(f'{x:.0f}' for x in r['batches_tps'])}), "
                      f"server CPU {r['cpu_ms_per_1k']:.0f} ms/1k tokens; "
                      f"records from: {', '.join(r['roles']) or '-'}"
                      + (f" (engine steps {r['steps']}, counted calls {r['calls']}"
                         f"{', FAILED ' + ', '.join(r['failed']) if r['failed'] else ''})" if r["roles"] else ""),
                      flush=True)
            pairs.append((got[True], got[False]))
    finally:
        time.sleep(1)
        left = left_behind(seen)
        print(f"\nserver processes left behind: {left or 'none'} (of {len(seen)} seen)")
    rows = []
    for i, (w, wo) in enumerate(pairs):
        rows.append((f"pair {i + 1} ({'with' if i % 2 == 0 else 'without'} first)", f"{w['tps']:.0f}",
                     f"{wo['tps']:.0f}", f"{w['tps'] / wo['tps']:.3f}",
                     f"{w['cpu_ms_per_1k'] / wo['cpu_ms_per_1k']:.3f}",
                     f"{w['ready_s']:.1f}", f"{wo['ready_s']:.1f}", f"{w['ready_s'] / wo['ready_s']:.3f}"))
    print()
    table(("pair", "tok/s with", "tok/s without", "tok/s ratio", "CPU/token ratio", "ready with (s)",
           "ready without (s)", "ready ratio"), rows)
    ratio = median([w["tps"] / wo["tps"] for w, wo in pairs])
    cratio = median([w["cpu_ms_per_1k"] / wo["cpu_ms_per_1k"] for w, wo in pairs])
    rratio = median([w["ready_s"] / wo["ready_s"] for w, wo in pairs])
    print(f"\nmedian ratios with/without: throughput {ratio:.3f} ({(ratio - 1) * 100:+.1f}%), "
          f"server CPU per token {cratio:.3f} ({(cratio - 1) * 100:+.1f}%), time to ready {rratio:.3f}")
    for variant, with_plugin in (("with", True), ("without", False)):
        rs = [r for r in runs if r["plugin"] is with_plugin]
        keys = sorted({r["compile_key"] for r in rs})
        print(f"compile-cache keys {variant} the plugin: {len(keys)} distinct over {len(rs)} runs ({', '.join(keys)})")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())

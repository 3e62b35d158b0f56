"""Hostile declaration files: time and memory until each is answered (issue 33, item 3).

Each case is a patch folder written at run time (the bombs are built here, never committed) and read in a
fresh child process by a real entry point: the plugin's start-up path (`Loader.builtin`, the folder given in
$VLLM_PATCHKIT_EXTRA_PATCHES, the start-up cache on), the declaration reader (`load_patch_set`) or
`vllm-patchkit check --patch-dir`. The child reports its wall time from just before the entry point; the parent
reads the child's peak RSS (`wait4`) and subtracts the same child's on a harmless folder (the baseline). A child
still running after `--timeout` seconds is killed and shown as such.

    python benchmarks/declaration_bounds.py [--timeout 60] [--case NAME ...]

Cases:
  set-value-bomb   a 0.5 kB YAML alias bomb (9 levels of 9 aliases: 9**9 strings once expanded) as a `set`
                   patch's `value`, through the start-up path (it used to pass validation; the cache's write
                   then walked the expansion)
  string-bomb      the same bomb in `summary` (a string field), through load_patch_set (the error's repr of the input)
  check-bomb       the same file through `vllm-patchkit check --patch-dir`
  big-unknown      a 4.18 MB map in an unknown key, through load_patch_set
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import machine, vllm_version  # noqa: E402

HEAD = """\
id: {pid}
version: 1
summary: {summary}
why: hostile input
upstream: "none: benchmark"
retire_when: {{manual: benchmark}}
required: false
kind: set
target: vllm.v1.core.sched.scheduler:Scheduler.patchkit_bench_value
processes: [frontend]
"""


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A flow sequence whose last item expands to width**levels strings: ~1.7 kB of YAML."""
    items = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        items.append(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "[" + ", ".join(items) + "]"


def case_files(name: str) -> str:
    if name == "set-value-bomb":
        return HEAD.format(pid="bomb", summary="a bomb in value") + f"value: {alias_bomb()}\n"
    if name in ("string-bomb", "check-bomb"):
        return HEAD.format(pid="bomb", summary=alias_bomb()) + "value: 1\n"
    if name == "big-unknown":
        entries = "".join(f"  key{i:07d}: v\n" for i in range(4_180_000 // 16))
        return HEAD.format(pid="big", summary="a big unknown key") + "value: 1\nextra_stuff:\n" + entries
    if name == "baseline":
        return HEAD.format(pid="fine", summary="harmless") + "value: 1\n"
    raise SystemExit(f"unknown case {name}")


CHILD = r"""
import os, sys, time
how, folder = sys.argv[1], sys.argv[2]
from vllm_patchkit.declaration.errors import PatchkitError
from vllm_patchkit.runtime.loader import Loader  # imported before the clock starts, as a process has it
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.tools.cli import main
t0 = time.perf_counter()
outcome = "accepted"
try:
    if how == "startup":
        Loader.builtin(role="frontend")
    elif how == "check":
        code = main(["check", "--patch-dir", folder, "--manifest-dir", folder + "-manifests"])
        outcome = f"check exit {code}"
    else:
        load_patch_set([folder])
except PatchkitError as exc:
    outcome = "refused: " + str(exc).replace("\n", " ")[:160]
print(f"@@ {time.perf_counter() - t0:.3f} {outcome}", flush=True)
"""

HOW = {"set-value-bomb": "startup", "string-bomb": "declare", "check-bomb": "check", "big-unknown": "declare"}


def run(name: str, how: str, timeout: float) -> tuple[str, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "patches"
        folder.mkdir()
        Path(f"{folder}-manifests").mkdir()
        (folder / "case.yaml").write_text(case_files(name))
        env = {**os.environ, "VLLM_PATCHKIT_EXTRA_PATCHES": str(folder),
               "VLLM_PATCHKIT_CACHE_DIR": str(Path(tmp) / "cache"), "VLLM_PATCHKIT_STATUS_DIR": str(Path(tmp) / "st")}
        proc = subprocess.Popen([sys.executable, "-c", CHILD, how, str(folder)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        t0 = time.perf_counter()
        out, killed = "", False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                killed = True
                break
            time.sleep(0.05)
        proc.returncode = 0
        out = proc.stdout.read()
        peak = usage.ru_maxrss / 1024  # KiB -> MiB
        line = next((ln for ln in out.splitlines() if ln.startswith("@@ ")), None)
        if killed:
            return f"> {timeout:.0f} s (killed)", peak, "no answer"
        if line is None:
            return "?", peak, f"child died (status {status})"
        secs, _, outcome = line[3:].partition(" ")
        return f"{float(secs):.3f} s", peak, outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--case", action="append", choices=sorted(HOW))
    args = ap.parse_args()
    print(machine(), "; vLLM", vllm_version())
    print(f"bomb: {len(alias_bomb())} bytes of YAML, {9 ** 9:,} strings expanded")
    cases = args.case or list(HOW)
    base = {how: run("baseline", how, args.timeout)[1] for how in sorted({HOW[c] for c in cases})}
    print(f"{'case':<16} {'entry point':<9} {'answered in':>16} {'peak RSS above baseline':>24}  outcome")
    for name in cases:
        secs, peak, outcome = run(name, HOW[name], args.timeout)
        print(f"{name:<16} {HOW[name]:<9} {secs:>16} {peak - base[HOW[name]]:>20.0f} MiB  {outcome}")


if __name__ == "__main__":
    main()

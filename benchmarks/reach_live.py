"""The loader's live check of the pinned reach (`upstream/reach_live.py`): CPU per process for the names pinned
for the installed release, the owners' modules imported first (as they are in the worker and EngineCore when
verify runs), and the reading with `dis.get_instructions` it replaced, side by side.

    python benchmarks/reach_live.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import dis
import importlib
import time

from _bench import machine, median, spread

from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.patchsets import discover
from vllm_patchkit.upstream import reach_live
from vllm_patchkit.upstream.installed import installed_version


def _dis_stores(code, name) -> bool:
    """The reading by `dis` (what the raw scan replaced), for the comparison."""
    if name not in code.co_names or not code.co_argcount:
        return False
    prev = None
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_ATTR" and ins.argval == name and prev is not None and \
                prev.opname.startswith(("LOAD_FAST", "LOAD_DEREF")) and prev.argval == code.co_varnames[0]:
            return True
        prev = ins
    return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    rounds = ap.parse_args().rounds
    sources = discover(None)
    ps = load_patch_set(sources)
    m = load_manifests(manifest_dirs(sources), ps)[installed_version()].manifest
    names = [(e.patch, k, p) for e in m.patches for k, p in e.reach.items()]
    for _, k, _ in names:
        importlib.import_module(k.partition(":")[0])
    variants = {"raw bytecode (shipped)": reach_live._stores_on_self, "dis.get_instructions": _dis_stores}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for label, fn in variants.items():  # interleaved
            reach_live._stores_on_self, saved = fn, reach_live._stores_on_self
            t = time.process_time()
            for _, k, p in names:
                assert reach_live.missing(k, p) is None, k
            times[label].append((time.process_time() - t) * 1000)
            reach_live._stores_on_self = saved
    print(machine())
    print(f"{len(names)} names pinned for vLLM {m.vllm} over {len({p for p, _, _ in names})} patches")
    for label, xs in times.items():
        print(f"  {label:<24} {median(xs):7.2f} ms CPU (median of {rounds}, iqr {spread(xs)})")
    per = {p: sum(1 for q, _, _ in names if q == p) for p, _, _ in names}
    print("  names per patch: " + ", ".join(f"{p} {n}" for p, n in per.items()))


if __name__ == "__main__":
    main()

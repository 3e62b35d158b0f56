"""Time a static check of one whole vLLM release, read from its wheel without importing it.

    python benchmarks/static_check.py --wheel /path/to/vllm-0.33.0-*.whl [--repeat 5]
    python benchmarks/static_check.py --vllm 0.33.0        # the wheel from $VLLM_PATCHKIT_WHEEL_CACHE
    python benchmarks/static_check.py --vllm 0.33.0 --corpus atom   # a real plugin's set (tests/corpus/)
    python benchmarks/static_check.py --plugin-reach PLUGIN_WHEEL_OR_DIR --vllm 0.31.0,0.32.0,0.33.0,0.34.0

With `--plugin-reach PATH`: `vllm-patchkit reach` of a whole plugin (every module read from PATH, never
imported) against each release's wheel, cold (a fresh reader of the wheel each run): CPU seconds per release.

With `--corpus PLUGIN`: that corpus plugin's declarations (ROCm/ATOM's: 97 patches, 87 places; their
implementation stand-ins import vLLM, and are read from their source, never imported) are pinned on 0.31.0
(not timed), then checked cold against the wheel, each run in a fresh process-wide state of the reader: CPU
seconds (`time.process_time`) side by side with the cyclic garbage collector left on during parsing (what the
reader did before) and paused (what it does now); the run also asserts nothing of vLLM was imported.

Figures printed:
- `check (cold)`: `vllm-patchkit check` of the whole shipped patch set against the
  wheel, from opening the zip to the report (a fresh reader each run: nothing cached);
- `lookup (warm)`: one target again once its modules are parsed (the cache at work);
  by default the pins compared are the oldest manifest's, so moved targets are searched for too;
- `sweep`: every module-level function, class and method of the release fingerprinted
  (an upper bound: what a check would cost if a patch set touched everything).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from packaging.version import Version

from vllm_patchkit.tools.check import check
from vllm_patchkit.tools.examine import target_specs
from vllm_patchkit.tools.manifest_files import read_manifests
from vllm_patchkit.tools.releases import StaticView, cached_wheel
from patchkit_deepseek_v4 import MANIFESTS
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, help="a vLLM wheel")
    ap.add_argument("--vllm", help="take vllm-VERSION-*.whl from $VLLM_PATCHKIT_WHEEL_CACHE")
    ap.add_argument("--repeat", type=int, default=5, help="cold runs of the check (default 5)")
    ap.add_argument("--baseline", help="compare with this release's pins (default: the oldest manifest, so every "
                    "pinned target is looked up, moved ones included)")
    ap.add_argument("--no-sweep", action="store_true", help="skip fingerprinting every def of the release")
    ap.add_argument("--corpus", metavar="PLUGIN", help="check this corpus plugin's set (tests/corpus/PLUGIN)")
    ap.add_argument("--plugin-reach", metavar="PATH", help="time the whole-plugin reach of PATH on each --vllm release "
                    "(comma-separated)")
    args = ap.parse_args(argv)
    if args.plugin_reach:
        return plugin_reach(args.plugin_reach, [v for v in (args.vllm or "").split(",") if v], max(1, args.repeat))
    wheel = args.wheel or (cached_wheel(args.vllm) if args.vllm else None)
    if wheel is None or not Path(wheel).is_file():
        ap.error("give --wheel PATH, or --vllm VERSION with the wheel in $VLLM_PATCHKIT_WHEEL_CACHE")
    if args.corpus:
        return corpus(Path(wheel), args.corpus, max(1, args.repeat))

    ps = load_patch_set(installed_sources())
    manifests, paths = read_manifests(MANIFESTS, ps)
    targets = sorted({s for p in ps.patches.values() for s in target_specs(p)})

    baseline = args.baseline or min(manifests, key=Version)
    runs, report, rel = [], None, None
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        rel = StaticRelease.open(wheel)
        report = check(StaticView(rel), ps, manifests, baseline=baseline, paths=paths)
        runs.append(time.perf_counter() - t0)
        rel.source.close()
    rel = StaticRelease.open(wheel)
    for spec in targets:
        rel.lookup(spec)
    warm_runs = []
    for spec in targets:
        t0 = time.perf_counter()
        rel.lookup(spec)
        warm_runs.append(time.perf_counter() - t0)
    warm = statistics.median(warm_runs)

    print(f"wheel          {Path(wheel).name} ({Path(wheel).stat().st_size / 1e6:,.0f} MB), vLLM {rel.version()}")
    print(f"patch set      {len(ps.patches)} patch versions, {len(targets)} distinct pinned places (targets, copies, uses)")
    c = report.counts()
    print(f"pins           vLLM {baseline}")
    print(f"result         {c['ok']} ok, {c['broken']} broken, {c['unpinned']} unpinned, "
          f"{c['not_applicable']} not applicable ({len(report.breakages)} breakages)")
    print(f"check (cold)   min {_ms(min(runs))}, median {_ms(statistics.median(runs))}, max {_ms(max(runs))} "
          f"over {len(runs)} runs; {len([m for m in rel._modules.values() if m])} modules parsed")
    print(f"lookup (warm)  median {warm * 1e6:,.1f} us per target")
    if not args.no_sweep:
        sweep = StaticRelease.open(wheel)
        t0 = time.perf_counter()
        specs = list(sweep.iter_defs("vllm"))
        parsed = time.perf_counter() - t0
        missing = sum(isinstance(sweep.lookup(s), Missing) for s in specs)
        total = time.perf_counter() - t0
        mods = len([m for m in sweep._modules.values() if m])
        print(f"sweep          {len(specs):,} functions, classes and methods in {mods:,} modules: "
              f"{total:.2f} s ({_ms(parsed)} reading and parsing, {total / len(specs) * 1e6:,.1f} us per def); "
              f"{missing} unreadable")
    return 0


def corpus(wheel: Path, plugin: str, repeat: int) -> int:
    """A cold check of one corpus plugin's declarations against the wheel: CPU seconds, GC on vs paused."""
    import contextlib

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.corpus.catalogue import load
    from vllm_patchkit.tools import static_modules as static_mod
    from vllm_patchkit.tools.examine import examine
    from vllm_patchkit.tools.releases import open_release

    cat = load(plugin)
    base = open_release("0.31.0")
    pinned = []
    for place in cat.places:
        if place.declaration is not None:
            patch = cat.patch(place)
            found, _ = examine(base, patch, None)
            pinned.append((patch, {s: f for s, f in found.items() if not isinstance(f, Missing)}))
    places = len({s for p, _ in pinned for s in p.pinned_specs})
    paused = static_mod.gc_paused

    def one(gc_paused: bool) -> tuple[float, int]:
        static_mod.gc_paused = paused if gc_paused else contextlib.nullcontext
        t0 = time.process_time()
        rel = StaticView(StaticRelease.open(wheel))
        n = sum(len(examine(rel, p, pins)[1]) for p, pins in pinned)
        cpu = time.process_time() - t0
        rel.release.source.close()
        return cpu, n

    figures = {True: [], False: []}
    for _ in range(repeat):
        for mode in (False, True):
            figures[mode].append(one(mode))
    static_mod.gc_paused = paused
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), "the check imported vLLM"
    on, off = (statistics.median(c for c, _ in figures[m]) for m in (False, True))
    print(f"corpus         {plugin}: {len(pinned)} patches, {places} pinned places, pins of vLLM 0.31.0")
    print(f"wheel          {wheel.name}; {figures[True][0][1]} findings")
    print(f"check (cold)   GC paused while parsing: median {off:.2f} s CPU; GC on: {on:.2f} s CPU "
          f"({on / off:.1f}x) over {repeat} runs each, interleaved; nothing of vLLM imported")
    return 0


def plugin_reach(path: str, versions: list[str], repeat: int) -> int:
    """The whole-plugin reach, cold, per release: CPU seconds (median of `repeat` runs, each on a fresh reader)."""
    from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules
    from vllm_patchkit.tools.reach_plugin.uses import read
    from vllm_patchkit.tools.scan.sources import open_plugin

    t0 = time.process_time()
    plugin = PluginModules(open_plugin(path))
    parsed = time.process_time() - t0
    lines = sum(len(m.tree.body) and (m.tree.body[-1].end_lineno or 0) for m in plugin.modules.values())
    print(f"plugin         {plugin.label}: {len(plugin.modules)} modules, {lines:,} lines, parsed in {_ms(parsed)} CPU")
    for v in versions:
        wheel = cached_wheel(v)
        if wheel is None:
            print(f"vLLM {v:<9} no wheel in the cache: skipped")
            continue
        runs, reach = [], None
        for _ in range(repeat):
            t0 = time.process_time()
            rel = StaticRelease.open(wheel)
            reach = read(plugin, rel)
            runs.append(time.process_time() - t0)
            rel.source.close()
        c = reach.counts()
        print(f"vLLM {v:<9} reach (cold) median {statistics.median(runs):.2f} s CPU over {repeat} runs; "
              f"{sum(c.values())} uses: {c['ok']} ok, {c['guarded']} guarded, {c['broken']} broken, "
              f"{c['not_followed']} not followed")
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), "the reach imported vLLM"
    return 0


if __name__ == "__main__":
    sys.exit(main())

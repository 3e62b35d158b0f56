"""Per-call cost of a counted wrapper, side by side in one run.

    python benchmarks/call_overhead.py [--rounds 21] [--number 100000] [--kwargs] [--strict]

Every variant stands at a real target of its own in a temp module, installed the
way it would be in production: the framework's through `apply.install` (which
calls `build_callable`), the others through `setattr` / `wrapt.wrap_function_wrapper`.
Two call shapes: a module-level function called as `m.fn(1)`, and a method
called through an instance as `o.step(1)` (a bound-method call, which binds
`self` on every call).

Variants
- `unpatched`      the original function
- `closure`        the reference: a hand-written `functools.wraps` closure that
                   does `nonlocal calls; calls += 1` and calls the original
- `wrapt`          `wrapt.FunctionWrapper` (via `wrap_function_wrapper`) whose
                   wrapper counts the same way and calls `wrapped(*args, **kwargs)`
- `pk wrap count`  this framework's `wrap` passthrough (no implementation), counting on
- `pk wrap nocount`  the same with `count_calls: false`
- `pk wrap impl`   a `wrap` with a trivial implementation `impl(wrapped, instance, args, kwargs)`, counting on

Method: rounds x variants, the variant order shuffled in every round; each sample
is `--number` calls under `timeit` (gc off), timed by this process's CPU time
(`time.process_time`, so time the scheduler gives to other processes on a busy
machine is not counted; `--wall` for the wall clock). ns/call is the median over rounds
minus the median of an empty `timeit` loop; "x closure" is the median of the
per-round ratios (so slow drift of the machine cancels). Target (issue 4, item 1):
`pk wrap count` <= 1.10 x `closure`, for both call shapes.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import random
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

import wrapt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import machine, median, spread, table  # noqa: E402

from vllm_patchkit import apply  # noqa: E402
from vllm_patchkit.schema import Patch  # noqa: E402
from vllm_patchkit.targets import resolve  # noqa: E402

TARGET = 1.10
MODULE = "vllm_patchkit_bench_target"
VARIANTS = ("unpatched", "closure", "wrapt", "pk wrap count", "pk wrap nocount", "pk wrap impl")


def _ident(variant: str) -> str:
    return variant.replace(" ", "_")


def target_module(folder: Path):
    """One function and one class per variant (identical bodies), plus the trivial implementation."""
    src = ["def trivial(wrapped, instance, args, kwargs):\n    return wrapped(*args, **kwargs)\n"]
    for v in VARIANTS:
        i = _ident(v)
        src.append(textwrap.dedent(f"""
            def fn_{i}(x, y=None):
                return x

            class Cls_{i}:
                def step(self, x, y=None):
                    return x
            """))
    (folder / f"{MODULE}.py").write_text("\n".join(src))
    sys.path.insert(0, str(folder))
    return importlib.import_module(MODULE)


# -- the reference and the third-party wrapper ---------------------------------------------------
def counted_closure(fn):
    """What a careful engineer writes by hand."""
    calls = 0

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        return fn(*args, **kwargs)

    wrapper.calls = lambda: calls
    return wrapper


class WraptCount:
    calls = 0


def wrapt_counted(owner, name: str) -> WraptCount:
    """wrapt's own idiom; a plain function keeps the wrapper as cheap as wrapt allows."""
    box = WraptCount()

    def wrapper(wrapped, instance, args, kwargs):
        box.calls += 1
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(owner, name, wrapper)
    return box


# -- the framework, through its real install path ------------------------------------------------
def pk_install(spec: str, *, count: bool, impl_spec: str | None) -> apply.Applied:
    doc = dict(id="bench-" + spec.split(":")[1].lower().replace(".", "-").replace("_", "-"), version=1,
               summary="benchmark", why="benchmark", upstream="none: benchmark", retire_when={"manual": "benchmark"},
               kind="wrap", target=spec, processes=["frontend"], required=False, count_calls=count)
    if impl_spec:
        doc["implementation"] = impl_spec
    patch = Patch.model_validate(doc)
    impl = resolve(impl_spec).get_raw() if impl_spec else None
    applied = apply.install(patch, resolve(spec), [], impl, patch.count_calls)
    fn = apply.function_of(applied.places[0][0].get_raw())
    assert getattr(fn, apply.MARK) == patch.key and fn.__wrapped__ is not None
    return applied


def install_all(mod) -> dict[tuple[str, str], object]:
    """Install every variant at its own function and method; returns the counters to check."""
    counters: dict[tuple[str, str], object] = {}
    for shape in ("function", "method"):
        for v in VARIANTS:
            i = _ident(v)
            owner, name = (mod, f"fn_{i}") if shape == "function" else (getattr(mod, f"Cls_{i}"), "step")
            spec = f"{MODULE}:fn_{i}" if shape == "function" else f"{MODULE}:Cls_{i}.step"
            if v == "closure":
                w = counted_closure(owner.__dict__[name])
                setattr(owner, name, w)
                counters[shape, v] = w.calls
            elif v == "wrapt":
                box = wrapt_counted(owner, name)
                counters[shape, v] = lambda box=box: box.calls
            elif v.startswith("pk"):
                impl = f"{MODULE}:trivial" if v == "pk wrap impl" else None
                a = pk_install(spec, count=(v != "pk wrap nocount"), impl_spec=impl)
                counters[shape, v] = lambda a=a: a.counter.calls
    return counters


def timers(mod, kwargs: bool, clock) -> dict[tuple[str, str], timeit.Timer]:
    args = "1, y=2" if kwargs else "1"
    out = {}
    for v in VARIANTS:
        i = _ident(v)
        out["function", v] = timeit.Timer(f"m.fn_{i}({args})", globals={"m": mod}, timer=clock)
        out["method", v] = timeit.Timer(f"o.step({args})", globals={"o": getattr(mod, f"Cls_{i}")()}, timer=clock)
    out["loop", ""] = timeit.Timer("pass", timer=clock)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds (default 21)")
    ap.add_argument("--number", type=int, default=100_000, help="calls per sample (default 100000)")
    ap.add_argument("--kwargs", action="store_true", help="call with a keyword argument too: f(1, y=2)")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock instead of this process's CPU time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict", action="store_true", help="exit 1 when the 1.10x target is missed")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="vllm-patchkit-bench-") as tmp:
        mod = target_module(Path(tmp))
        counters = install_all(mod)
        clock = time.perf_counter if args.wall else time.process_time
        ts = timers(mod, args.kwargs, clock)
        for t in ts.values():  # warm up: specialise the bytecode before measuring
            t.timeit(2000)
        samples: dict[tuple[str, str], list[float]] = {k: [] for k in ts}
        rng = random.Random(args.seed)
        keys = list(ts)
        for _ in range(args.rounds):
            rng.shuffle(keys)
            for k in keys:
                samples[k].append(ts[k].timeit(args.number) / args.number * 1e9)

    loop = median(samples["loop", ""])
    calls_made = args.number * args.rounds + 2000
    print(f"call_overhead: {machine()}")
    print(f"{args.rounds} rounds x {args.number} calls per sample, call shape "
          f"{'f(1, y=2)' if args.kwargs else 'f(1)'}, clock {'wall' if args.wall else 'process CPU time'}; "
          f"empty timeit loop {loop:.1f} ns (subtracted)\n")
    verdicts = []
    for shape, how in (("function", "m.fn(...)  module-level function"), ("method", "o.step(...)  method through an instance")):
        ref = samples[shape, "closure"]
        base = median(samples[shape, "unpatched"]) - loop
        rows = []
        for v in VARIANTS:
            s = samples[shape, v]
            ns = median(s) - loop
            ratio = median([(a - loop) / (b - loop) for a, b in zip(s, ref)])
            rows.append((v, f"{ns:.1f}", spread([x - loop for x in s]), f"{ns - base:+.1f}", f"{ratio:.2f}x"))
            if v != "unpatched":
                got = counters[shape, v]()
                want = 0 if v == "pk wrap nocount" else calls_made
                if got != want:
                    raise SystemExit(f"{shape} {v}: counter reads {got}, expected {want}")
        print(f"{shape}: {how}")
        table(("variant", "ns/call", "IQR", "vs unpatched", "x closure"), rows)
        r = float(rows[VARIANTS.index("pk wrap count")][4].rstrip("x"))
        verdicts.append((shape, r))
        print()
    ok = all(r <= TARGET for _, r in verdicts)
    print("target: pk wrap count <= %.2fx closure: %s (%s)" % (
        TARGET, "met" if ok else "MISSED", ", ".join(f"{s} {r:.2f}x" for s, r in verdicts)))
    print("counters checked: every counted variant saw every call; `pk wrap nocount` recorded none")
    return 1 if (args.strict and not ok) else 0


if __name__ == "__main__":
    raise SystemExit(main())

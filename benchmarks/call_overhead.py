"""Per-call cost of a counted wrapper, with and without an implementation, side by side in one run.

    python benchmarks/call_overhead.py [--rounds 21] [--number 100000] [--kwargs] [--wall] [--strict]

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
- `closure impl`   the reference for a wrap with an implementation: a hand-written closure that counts
                   (`nonlocal`) and calls the SAME trivial implementation the way a careful hand-written
                   monkeypatch would: `impl(orig, None, args, kwargs, ctx)` for a function;
                   `impl(MethodType(orig, self), self, args, kwargs, ctx)` for a method (the original bound
                   to the instance, as the documented contract says)
- `pk wrap impl`   a `wrap` with that trivial implementation in the documented 5-parameter form
                   `impl(wrapped, instance, args, kwargs, ctx)`, counting on
- `pk wrap impl4`  the same with the 4-parameter form `impl(wrapped, instance, args, kwargs)` (no context)

Method: rounds x variants, the variant order shuffled in every round; each sample
is `--number` calls under `timeit` (gc off), timed by this process's CPU time
(`time.process_time`, so time the scheduler gives to other processes on a busy
machine is not counted; `--wall` for the wall clock). ns/call is the median over rounds
minus the median of an empty `timeit` loop; "x closure" is the median of the
per-round ratios (so slow drift of the machine cancels); "x closure impl" the same against
`closure impl`, for the variants with an implementation. Targets, for both call shapes:
`pk wrap count` <= 1.10 x `closure` (issue 4, item 1) and `pk wrap impl` <= 1.10 x `closure impl`
(issue 15); `--strict` exits 1 when either is missed.
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
from types import MethodType

import wrapt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import machine, median, spread, table  # noqa: E402

from vllm_patchkit.runtime import apply
from vllm_patchkit.runtime.wrappers import MARK  # noqa: E402
from vllm_patchkit.runtime.context import PatchContext  # noqa: E402
from vllm_patchkit.declaration.schema import Patch  # noqa: E402
from vllm_patchkit.upstream.targets import function_of, resolve  # noqa: E402
from vllm_patchkit.declaration.validation import validate

TARGET = 1.10
MODULE = "vllm_patchkit_bench_target"
VARIANTS = ("unpatched", "closure", "wrapt", "pk wrap count", "pk wrap nocount", "closure impl", "pk wrap impl",
            "pk wrap impl4")
IMPL_VARIANTS = ("closure impl", "pk wrap impl", "pk wrap impl4")


def _ident(variant: str) -> str:
    return variant.replace(" ", "_")


def target_module(folder: Path):
    """One function and one class per variant (identical bodies), plus the trivial implementations."""
    src = ["def trivial(wrapped, instance, args, kwargs, ctx):\n    return wrapped(*args, **kwargs)\n",
           "def trivial4(wrapped, instance, args, kwargs):\n    return wrapped(*args, **kwargs)\n"]
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


def counted_impl_closure(owner, name: str, impl, ctx):
    """What a careful engineer writes by hand to run a wrapt-style implementation with a context: count, then
    call it with the original (bound to the instance for a method: a new bound method per call, as wrapt does)."""
    fn = owner.__dict__[name]
    calls = 0
    if isinstance(owner, type):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            return impl(MethodType(fn, self), self, args, kwargs, ctx)
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += 1
            return impl(fn, None, args, kwargs, ctx)

    setattr(owner, name, wrapper)
    return lambda: calls


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
def bench_patch(spec: str, *, count: bool = True, impl_spec: str | None = None) -> Patch:
    doc = dict(id="bench-" + spec.split(":")[1].lower().replace(".", "-").replace("_", "-"), version=1,
               summary="benchmark", why="benchmark", upstream="none: benchmark", retire_when={"manual": "benchmark"},
               kind="wrap", target=spec, processes=["frontend"], required=False, count_calls=count)
    if impl_spec:
        doc["implementation"] = impl_spec
    return validate(Patch, doc)


def pk_install(spec: str, *, count: bool, impl_spec: str | None) -> apply.Applied:
    patch = bench_patch(spec, count=count, impl_spec=impl_spec)
    impl = resolve(impl_spec).get_raw() if impl_spec else None
    applied = apply.install(patch, resolve(spec), [], impl, patch.count_calls)
    fn = function_of(applied.places[0][0].get_raw())
    assert getattr(fn, MARK) == patch.key and fn.__wrapped__ is not None
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
            elif v == "closure impl":  # the context the framework would hand it: one per patch, made once
                ctx = PatchContext.detached(bench_patch(spec, impl_spec=f"{MODULE}:trivial"))
                counters[shape, v] = counted_impl_closure(owner, name, mod.trivial, ctx)
            elif v.startswith("pk"):
                impl = {"pk wrap impl": f"{MODULE}:trivial", "pk wrap impl4": f"{MODULE}:trivial4"}.get(v)
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
    ap.add_argument("--strict", action="store_true", help="exit 1 when either 1.10x target is missed")
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
        base = median(samples[shape, "unpatched"]) - loop

        def ratio(v: str, ref: str) -> float:
            return median([(a - loop) / (b - loop) for a, b in zip(samples[shape, v], samples[shape, ref])])

        rows = []
        for v in VARIANTS:
            s = samples[shape, v]
            ns = median(s) - loop
            rows.append((v, f"{ns:.1f}", spread([x - loop for x in s]), f"{ns - base:+.1f}",
                         f"{ratio(v, 'closure'):.2f}x",
                         f"{ratio(v, 'closure impl'):.2f}x" if v in IMPL_VARIANTS else "-"))
            if v != "unpatched":
                got = counters[shape, v]()
                want = 0 if v == "pk wrap nocount" else calls_made
                if got != want:
                    raise SystemExit(f"{shape} {v}: counter reads {got}, expected {want}")
        print(f"{shape}: {how}")
        table(("variant", "ns/call", "IQR", "vs unpatched", "x closure", "x closure impl"), rows)
        verdicts.append((shape, ratio("pk wrap count", "closure"), ratio("pk wrap impl", "closure impl")))
        print()
    ok_count = all(r <= TARGET for _, r, _ in verdicts)
    ok_impl = all(r <= TARGET for _, _, r in verdicts)
    print("targets: pk wrap count <= %.2fx closure: %s (%s); pk wrap impl <= %.2fx closure impl: %s (%s)" % (
        TARGET, "met" if ok_count else "MISSED", ", ".join(f"{s} {r:.2f}x" for s, r, _ in verdicts),
        TARGET, "met" if ok_impl else "MISSED", ", ".join(f"{s} {r:.2f}x" for s, _, r in verdicts)))
    print("counters checked: every counted variant saw every call; `pk wrap nocount` recorded none")
    return 1 if (args.strict and not (ok_count and ok_impl)) else 0


if __name__ == "__main__":
    raise SystemExit(main())

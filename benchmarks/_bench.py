"""Small helpers shared by the benchmark scripts: medians, tables, the machine line.

Not part of the package; each script adds this folder to ``sys.path`` itself
(``python benchmarks/X.py`` does that already).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Sequence


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> str:
    """Inter-quartile range as `q1..q3`, to show how noisy a median is."""
    if len(xs) < 4:
        return f"{min(xs):.3g}..{max(xs):.3g}"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.3g}..{q[2]:.3g}"


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {load}")


def vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception as exc:  # the figures are still worth printing
        return f"<not importable: {type(exc).__name__}>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out=sys.stdout) -> None:
    """A plain left/right aligned text table (first column left, the rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    print(line(cells[0]), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in cells[1:]:
        print(line(r), file=out)


def noop_like(fn, result=None):
    """A function with `fn`'s name and exact parameter list (defaults included) that does nothing but
    return `result`: "the bare original of the same kind", to time a wrapper against."""
    import inspect

    sig = inspect.signature(fn)
    ns: dict = {"_result": result}
    parts: list[str] = []
    star = False
    positional_only = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    for i, p in enumerate(sig.parameters.values()):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star = True
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name
        if p.default is not inspect.Parameter.empty:
            ns[f"_default{i}"] = p.default
            text += f"=_default{i}"
        parts.append(text)
        if positional_only and p is positional_only[-1]:
            parts.append("/")
    exec(f"def {fn.__name__}({', '.join(parts)}):\n    return _result\n", ns)  # noqa: S102 - our own text
    out = ns[fn.__name__]
    out.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
    return out


def interleaved(timers: dict, rounds: int, number: int, seed: int = 0) -> dict:
    """ns per call of every timer (timeit.Timer), `rounds` samples each of `number` calls, the order
    shuffled in every round (slow drift of the machine then hits all alike); returns key -> samples."""
    import random

    for t in timers.values():  # warm up: specialise the bytecode before measuring
        t.timeit(min(number, 2000))
    samples: dict = {k: [] for k in timers}
    keys = list(timers)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(keys)
        for k in keys:
            samples[k].append(timers[k].timeit(number) / number * 1e9)
    return samples

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

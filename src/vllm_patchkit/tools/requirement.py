"""The requirement line: the vLLM releases a patch set supports, as the PEP 440 specifier for a plugin's
`pyproject.toml`, claiming no release outside what `check` examined.

The input is the releases examined and the subset supported (every required patch ok, compatible or not
needed there: `matrix.py` decides). The rule, with lo / hi the oldest / newest supported release:

- `>=lo,<=hi` (`==lo` when lo is hi): nothing older than lo and nothing newer than hi is claimed, so an
  upper bound never reaches a release nobody checked (`<=0.34.0`, not `<0.35`: 0.34.1 was not examined);
- every minor series between lo and hi (same major) with no examined release, or whose examined releases are
  all unsupported, is excluded whole (`!=0.32.*`): PEP 440 has no "or" (`==0.31.0 || ==0.33.0` is npm's or
  Poetry's syntax, not a valid requirement), and `!=0.32.0` alone would still admit 0.32.1, which sits next to a
  broken release and was never examined;
- an unsupported release in a series that also has a supported one is excluded exactly (`!=0.32.1`).

What the line still admits unexamined: releases between two supported examined ones of the kept series (e.g.
0.31.1 between 0.31.0 and 0.32.0, both supported): an interpolation no PEP 440 specifier can avoid, said in the
notes. The conventional form (`wider`) ends at the first examined release above hi, or at hi's next minor when
hi is the newest examined (`<0.35`); it is printed beside the line with what it claims beyond it, never as the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Requirement:
    line: Optional[str]  # "vllm>=0.31.0,<=0.33.0"; None: no examined release is supported
    wider: Optional[str]  # the conventional upper bound (`<next`), when it differs from the line
    supported: tuple[str, ...]
    unsupported: tuple[str, ...]  # examined, not supported
    excluded: tuple[tuple[str, str], ...]  # (clause, why): the holes inside [lo, hi]
    notes: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"line": self.line, "wider": self.wider, "supported": list(self.supported),
                "unsupported": list(self.unsupported),
                "excluded": [{"clause": c, "why": w} for c, w in self.excluded], "notes": list(self.notes)}


def requirement(examined: Iterable[str], supported: Iterable[str], name: str = "vllm") -> Requirement:
    """The requirement line for `supported` out of `examined` (see the module docstring for the rule)."""
    ex = sorted({Version(v): v for v in examined}.items())
    good = {Version(v) for v in supported}
    unknown = good - {v for v, _ in ex}
    if unknown:
        raise ValueError(f"supported releases that were not examined: {', '.join(sorted(map(str, unknown)))}")
    sup = tuple(s for v, s in ex if v in good)
    unsup = tuple(s for v, s in ex if v not in good)
    if not sup:
        return Requirement(None, None, (), unsup, (), (
            "no examined release is supported: every one has a required patch that is broken, stale, unpinned "
            "or refused there",))
    lo, hi = min(good), max(good)
    lo_s, hi_s = dict(ex)[lo], dict(ex)[hi]
    # an ordered bound takes no local label (`+g1234`): the public version, which admits the local build
    lo_b, hi_b = (v.public if v.local else s for v, s in ((lo, lo_s), (hi, hi_s)))
    holes, notes = _holes(ex, good, lo, hi)
    bounds = [f"=={lo_s}"] if lo == hi else [f">={lo_b}", f"<={hi_b}"]
    line = name + ",".join(bounds + [c for c, _ in holes])
    above = [v for v, _ in ex if v > hi]
    nxt = above[0].public if above else f"{hi.major}.{hi.minor + 1}"
    wider = name + ",".join([f">={lo_b}", f"<{nxt}"] + [c for c, _ in holes])
    _verify(line, ex, good)
    _verify(wider, ex, good)
    if lo < hi:
        notes.append(f"between {lo_s} and {hi_s} the line also admits releases nobody examined (patch releases of "
                     "the series kept, e.g. a .1 after a .0): no PEP 440 specifier can leave them out")
    notes.append(f"{wider} would also claim the releases after {hi_s} and before {nxt}, which nobody examined"
                 + (f" ({nxt} was: not supported)" if above else ""))
    return Requirement(line, wider, sup, unsup, tuple(holes), tuple(notes))


def _holes(ex: list[tuple[Version, str]], good: set[Version], lo: Version, hi: Version):
    """The exclusions inside [lo, hi]: whole minor series not examined or all unsupported, else exact releases."""
    holes: list[tuple[str, str]] = []
    notes: list[str] = []
    inside = [(v, s) for v, s in ex if lo <= v <= hi]
    if lo.major == hi.major:
        series = [(lo.major, m) for m in range(lo.minor, hi.minor + 1)]
    else:  # the minors of an unexamined major cannot be enumerated: only the series examined are known
        series = sorted({(v.major, v.minor) for v, _ in inside})
        notes.append(f"{lo} and {hi} are of different major versions: minor series between them that no examined "
                     "release belongs to are admitted unexamined")
    for major, minor in series:
        here = [(v, s) for v, s in inside if (v.major, v.minor) == (major, minor)]
        if not here:
            holes.append((f"!={major}.{minor}.*", "no release of the series was examined"))
        elif not any(v in good for v, _ in here):
            holes.append((f"!={major}.{minor}.*", "examined, not supported: " + ", ".join(s for _, s in here)))
        else:
            holes.extend((f"!={s}", "examined, not supported") for v, s in here if v not in good)
    return holes, notes


def _verify(line: str, ex: list[tuple[Version, str]], good: set[Version]) -> None:
    """The line admits every supported examined release and no other examined one (a rule's bug, never output)."""
    spec = SpecifierSet(line[line.index(next(c for c in line if c in "<>=!~")):])
    wrong = [s for v, s in ex if spec.contains(v, prereleases=True) != (v in good)]
    if wrong:
        raise AssertionError(f"requirement line {line!r} misjudges examined releases {wrong}")

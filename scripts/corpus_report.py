"""`check` measured against real plugins: the corpus's ground truth against check's verdicts.

    python scripts/corpus_report.py            # the table per plugin and release
    python scripts/corpus_report.py --list     # and every missed break / false alarm with the findings
    python scripts/corpus_report.py --json

For every plugin of tests/corpus/ (catalogue format: tests/corpus/README.md): each declared place is built
into a full Patch (tests/corpus/catalogue.py), pinned on vLLM 0.31.0 exactly as `vllm-patchkit pin` pins a
version never pinned before (`check.examine` with no pins: the places it reads, source digests for what it
copies), then checked on 0.32.0, 0.33.0 and 0.34.0 exactly as `vllm-patchkit check` does against an older
manifest's pins (`check.examine` with the pins, then the per-patch judgement). Every release is read
statically (the installed one from its folder, the others from their wheels in the wheel cache:
scripts/fetch_wheels.sh), nothing of vLLM is imported. A place check flags is one with a breaking finding.

Figures per plugin and release: places, declared, pinned (every place the declaration pins was read on
0.31.0), breaks (the truth), found, missed (a break check did not flag, or a break at a place not
declared), false alarms (flagged, not a break). The acceptance rule (tests/corpus/test_check_verdicts.py):
0 missed, at most 1 false alarm per 50 places over the corpus, per release.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.catalogue import RELEASES, all_catalogues, load_split  # noqa: E402
from vllm_patchkit.tools.examine import examine  # noqa: E402
from vllm_patchkit.tools.releases import open_release  # noqa: E402
from vllm_patchkit.upstream.missing import Missing  # noqa: E402

PINNED_ON = "0.31.0"


@dataclass
class Row:
    plugin: str
    release: str
    split: str = "tuning"  # tests/corpus/split.yaml: held_out plugins are measured, never tuned on
    places: int = 0
    declared: int = 0
    pinned: int = 0
    breaks: int = 0
    found: int = 0
    missed: list = field(default_factory=list)
    false_alarms: list = field(default_factory=list)

    def figures(self) -> dict:
        d = asdict(self)
        d["missed"], d["false_alarms"] = len(self.missed), len(self.false_alarms)
        return d


def measure() -> list[Row]:
    base = open_release(PINNED_ON)
    releases = {r: open_release(r) for r in RELEASES}
    split = load_split()
    rows = []
    for cat in all_catalogues():
        side = split.of(cat.plugin)
        pins = {}
        for place in cat.places:
            if place.declaration is None:
                continue
            patch = cat.patch(place)
            found, _ = examine(base, patch, None)
            pins[place.id] = (patch, {s: f for s, f in found.items() if not isinstance(f, Missing)},
                              all(not isinstance(f, Missing) for f in found.values()))
        for rel, release in releases.items():
            row = Row(cat.folder, rel, side, places=len(cat.places))
            for place in cat.places:
                truth = place.truth[rel]
                row.breaks += truth.breaks
                if place.id not in pins:
                    if truth.breaks:
                        row.missed.append((place.id, "not declarable: " + (place.not_declarable or ""), []))
                    continue
                row.declared += 1
                patch, pinned, complete = pins[place.id]
                row.pinned += complete
                _, judged = examine(release, patch, pinned, base)
                flagged = [b for b in judged if b.breaking]
                said = [f"[{b.kind.value}] {b.explain()} ({b.verdict()})" for b in flagged]
                if truth.breaks and flagged:
                    row.found += 1
                elif truth.breaks:
                    row.missed.append((place.id, truth.reason, said))
                elif flagged:
                    row.false_alarms.append((place.id, truth.reason, said))
            rows.append(row)
    return rows


SPLITS = ("tuning", "held_out")


def _line(name: str, rel: str, rs: list[Row]) -> str:
    return (f"{name:<22} {rel:<7} {sum(r.places for r in rs):>6} {sum(r.declared for r in rs):>8} "
            f"{sum(r.pinned for r in rs):>6} {sum(r.breaks for r in rs):>6} {sum(r.found for r in rs):>5} "
            f"{sum(len(r.missed) for r in rs):>6} {sum(len(r.false_alarms) for r in rs):>12}")


def render(rows: list[Row], listing: bool) -> str:
    """Per split: each plugin's rows, then the split's totals per release; then the whole corpus's."""
    head = f"{'plugin':<22} {'vLLM':<7} {'places':>6} {'declared':>8} {'pinned':>6} {'breaks':>6} {'found':>5} " \
           f"{'missed':>6} {'false alarms':>12}"
    lines = []
    for side in SPLITS:
        mine = [r for r in rows if r.split == side]
        lines += [f"split: {side} ({len({r.plugin for r in mine})} plugins)", head, "-" * len(head)]
        lines += [_line(r.plugin, r.release, [r]) for r in mine]
        lines += [_line(f"{side} total", rel, [r for r in mine if r.release == rel]) for rel in RELEASES]
        lines.append("")
    lines += [_line("all", rel, [r for r in rows if r.release == rel]) for rel in RELEASES]
    if listing:
        for r in rows:
            for what, items in (("MISSED", r.missed), ("FALSE ALARM", r.false_alarms)):
                for pid, reason, said in items:
                    lines.append(f"{what} [{r.split}] {r.plugin}/{pid} on {r.release}: truth: {reason}")
                    lines.extend(f"    check: {s}" for s in said)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = measure()
    if args.json:
        print(json.dumps([{**r.figures(), "missed_places": r.missed, "false_alarm_places": r.false_alarms}
                          for r in rows], indent=2))
    else:
        print(render(rows, args.list), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

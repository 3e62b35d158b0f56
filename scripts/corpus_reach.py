"""The whole-plugin reach measured on the corpus: `vllm-patchkit reach` on each plugin's real source, pinned on
vLLM 0.31.0, compared with 0.32.0, 0.33.0 and 0.34.0, against the catalogues' ground truth.

    python scripts/corpus_reach.py            # the table per plugin and release, per split, then the totals
    python scripts/corpus_reach.py --list     # and every breaking line with its judgement, every catch
    python scripts/corpus_reach.py --json

Each registry plugin's archive is downloaded at run time (`pip download --no-deps NAME==VERSION` into
~/.cache/vllm-patchkit/plugins, the downloader tests/scan/test_registry.py uses; nothing of a plugin is in the
repository). ROCm/ATOM is a GitHub source assembled from files at several commits (tests/data/atom_scan_recall.yaml),
not one archive: it is read only when $PATCHKIT_ATOM_SRC names such a folder, else listed as skipped.

Figures per plugin and release: uses of vLLM on the release (`uses`), those followed to a verdict and those not
(`not followed`: an object whose vLLM class is not known), `breaking` (reach's BREAKING lines against 0.31.0),
each judged by hand in the catalogue's `reach:` list (tests/corpus/README.md, "Reach"): `found` (a real break),
`false alarms`, `unjudged` (no judgement recorded: a new line; a judgement of a line reach no longer prints is
listed as stale); and, of the truth's breaks `check` misses
(scripts/corpus_report.py's missed list), how many a judged-real breaking line catches (`caught` of `missed`): a line
in the place's file, or one naming the place's target or a member of it, or an unguarded module-level import in
the modules an import of the plugin's `vllm.*` entry points runs (`loaded_first`: it fails, nothing of the plugin
loads, every place breaks with it).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.catalogue import RELEASES, Catalogue, all_catalogues, load_split  # noqa: E402
from vllm_patchkit.tools.reach_plugin.differential import Change, compare, identity_moves  # noqa: E402
from vllm_patchkit.tools.reach_plugin.imports import imports_of  # noqa: E402
from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules  # noqa: E402
from vllm_patchkit.upstream.impl_static import _relative  # noqa: E402
from vllm_patchkit.tools.reach_plugin.uses import NOT_FOLLOWED, read  # noqa: E402
from vllm_patchkit.tools.releases import open_release  # noqa: E402
from vllm_patchkit.tools.scan.recall import fetch  # noqa: E402
from vllm_patchkit.tools.scan.sources import open_plugin  # noqa: E402

PINNED_ON = "0.31.0"
SPLITS = ("tuning", "held_out")


@dataclass
class Line:
    """One BREAKING line of reach on a release, with the catalogue's judgement (None: not judged)."""

    where: str
    kind: str
    name: str
    change: str
    breaks: Optional[bool] = None
    reason: str = ""


@dataclass
class ReachRow:
    plugin: str
    release: str
    split: str = "tuning"
    skipped: str = ""  # why the plugin was not read
    modules: int = 0
    uses: int = 0
    not_followed: int = 0
    lines: list[Line] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # place ids of breaks check misses
    caught: list[str] = field(default_factory=list)  # those a real breaking line catches
    stale: list[str] = field(default_factory=list)  # judgements of lines reach no longer prints

    @property
    def followed(self) -> int:
        return self.uses - self.not_followed

    @property
    def found(self) -> int:
        return sum(1 for x in self.lines if x.breaks is True)

    @property
    def false_alarms(self) -> int:
        return sum(1 for x in self.lines if x.breaks is False)

    @property
    def unjudged(self) -> int:
        return sum(1 for x in self.lines if x.breaks is None)

    def figures(self) -> dict:
        d = asdict(self)
        d.update(followed=self.followed, breaking=len(self.lines), found=self.found, false_alarms=self.false_alarms,
                 unjudged=self.unjudged)
        return d


def plugin_source(cat: Catalogue) -> tuple[Optional[str], str]:
    """The path to read the plugin from, or (None, why not)."""
    if cat.source.startswith("github:"):
        folder = os.environ.get("PATCHKIT_ATOM_SRC")
        if folder and Path(folder).is_dir():
            return folder, ""
        return None, f"{cat.source.split('@')[0]}: assembled from files at several commits; set PATCHKIT_ATOM_SRC"
    path, why = fetch(cat.plugin, cat.version)
    return (str(path), "") if path is not None else (None, why)


def _catches(line: Line, place, loaded_first: set[str]) -> bool:
    """Does a real breaking line account for this missed place?"""
    if line.where.rpartition(":")[0] == place.where.rpartition(":")[0]:
        return True
    target, names = place.target, {line.name, line.name.replace(":", ".")}
    if any(n == target or n.startswith(target + ".") or target.startswith(n + ".") for n in names):
        return True
    return line.kind == "import" and line.where in loaded_first


def entry_modules(archive: str) -> list[str]:
    """The modules a wheel's `vllm.*` entry points name (vLLM imports them in every process)."""
    import configparser
    import zipfile

    if not archive.endswith(".whl"):
        return []
    with zipfile.ZipFile(archive) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
        text = z.read(name).decode("utf-8") if name else ""
    cp = configparser.ConfigParser(delimiters=("=",))
    cp.optionxform = str
    cp.read_string(text)
    return [v.strip().partition(":")[0].split()[0] for g in cp.sections() if g.startswith("vllm.")
            for v in cp[g].values()]


def _module_level(body: list):
    """The statements an import of the module runs (nested blocks and class bodies, not function bodies)."""
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield st
        for block in ("body", "orelse", "finalbody", "handlers"):
            for part in getattr(st, block, None) or ():
                yield from _module_level(part.body if isinstance(part, ast.ExceptHandler) else [part])


def loaded_first(plugin: PluginModules, entries: list[str]) -> set[str]:
    """file:line of every unguarded module-level vLLM import in the modules an import of the entry points runs
    (their parent packages and the plugin modules they import at module level, transitively): one that fails
    means the plugin's entry point raises and nothing of it loads."""
    todo, seen = list(entries), set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            if mod in seen or mod not in plugin.modules:
                continue
            seen.add(mod)
            m = plugin.modules[mod]
            for st in _module_level(m.tree.body):
                if isinstance(st, ast.ImportFrom):
                    src = _relative(m.name, m.is_package, st)
                    todo += [src, *(f"{src}.{a.name}" for a in st.names)]
                elif isinstance(st, ast.Import):
                    todo += [a.name for a in st.names]
    out = set()
    for mod in seen:
        m = plugin.modules[mod]
        lines = {st.lineno for st in _module_level(m.tree.body) if isinstance(st, (ast.Import, ast.ImportFrom))}
        out |= {f"{u.file}:{u.line}" for u in imports_of(m) if u.guard is None and u.line in lines}
    return out


def check_misses() -> dict[tuple[str, str], list[str]]:
    """(folder, release) -> the place ids of the truth's breaks `check` misses (scripts/corpus_report.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus_report", ROOT / "scripts" / "corpus_report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return {(r.plugin, r.release): [m[0] for m in r.missed] for r in mod.measure()}


def measure(misses: Optional[dict] = None) -> list[ReachRow]:
    base_view = open_release(PINNED_ON)
    views = {r: open_release(r) for r in RELEASES}
    misses = check_misses() if misses is None else misses
    split = load_split()
    rows: list[ReachRow] = []
    for cat in all_catalogues():
        side = split.of(cat.plugin)
        path, why = plugin_source(cat)
        if path is None:
            rows += [ReachRow(cat.folder, rel, side, skipped=why) for rel in RELEASES]
            continue
        plugin = PluginModules(open_plugin(path))
        base = read(plugin, base_view.release)
        judged = {(j.where, j.name, j.release): j for j in cat.reach}
        first = loaded_first(plugin, entry_modules(path))
        places = {p.id: p for p in cat.places}
        for rel, view in views.items():
            other = read(plugin, view.release)
            diff = compare(base, other, identity_moves(base_view, view))
            row = ReachRow(cat.folder, rel, side, modules=len(plugin.modules), uses=len(other.uses),
                           not_followed=other.counts()[NOT_FOLLOWED])
            for c in diff.breaking:
                row.lines.append(_line(c, judged.get((c.use.where(), c.use.key, rel))))
            printed = {(x.where, x.name) for x in row.lines}
            row.stale = [f"{j.where} {j.name}" for j in cat.reach if j.release == rel and (j.where, j.name) not in printed]
            row.missed = list(misses.get((cat.folder, rel), []))
            real = [x for x in row.lines if x.breaks]
            row.caught = [pid for pid in row.missed if any(_catches(x, places[pid], first) for x in real)]
            rows.append(row)
    return rows


def _line(c: Change, j) -> Line:
    return Line(c.use.where(), c.use.kind, c.use.key, c.change, None if j is None else j.breaks,
                "" if j is None else j.reason)


def _fmt(name: str, rel: str, rs: list[ReachRow]) -> str:
    read_ = [r for r in rs if not r.skipped]
    if not read_:
        return f"{name:<22} {rel:<7} skipped: {rs[0].skipped if rs else ''}"
    s = lambda f: sum(f(r) for r in read_)  # noqa: E731
    return (f"{name:<22} {rel:<7} {s(lambda r: r.uses):>5} {s(lambda r: r.followed):>8} "
            f"{s(lambda r: r.not_followed):>12} {s(lambda r: len(r.lines)):>8} {s(lambda r: r.found):>5} "
            f"{s(lambda r: r.false_alarms):>12} {s(lambda r: r.unjudged):>8} "
            f"{s(lambda r: len(r.caught)):>3} / {s(lambda r: len(r.missed)):<3}")


def render(rows: list[ReachRow], listing: bool) -> str:
    head = (f"{'plugin':<22} {'vLLM':<7} {'uses':>5} {'followed':>8} {'not followed':>12} {'breaking':>8} "
            f"{'found':>5} {'false alarms':>12} {'unjudged':>8} caught / check's misses")
    lines: list[str] = []
    for side in SPLITS:
        mine = [r for r in rows if r.split == side]
        lines += [f"split: {side} ({len({r.plugin for r in mine})} plugins)", head, "-" * len(head)]
        lines += [_fmt(r.plugin, r.release, [r]) for r in mine]
        lines += [_fmt(f"{side} total", rel, [r for r in mine if r.release == rel]) for rel in RELEASES]
        lines.append("")
    lines += [_fmt("all", rel, [r for r in rows if r.release == rel]) for rel in RELEASES]
    if listing:
        for r in rows:
            for x in r.lines:
                verdict = {True: "BREAK", False: "FALSE ALARM", None: "UNJUDGED"}[x.breaks]
                lines.append(f"{verdict} [{r.split}] {r.plugin} {r.release} {x.where} {x.kind} {x.name}: {x.change}")
                if x.reason:
                    lines.append(f"    truth: {x.reason}")
            lines += [f"STALE JUDGEMENT [{r.split}] {r.plugin} {r.release} {x}" for x in r.stale]
            for pid in r.missed:
                lines.append(f"{'CAUGHT' if pid in r.caught else 'NOT CAUGHT'} [{r.split}] {r.plugin}/{pid} on "
                             f"{r.release} (a break check misses)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = measure()
    if args.json:
        print(json.dumps([r.figures() for r in rows], indent=2))
    else:
        print(render(rows, args.list), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The registry run (issue 31): the adoption tools over every plugin of tests/corpus/registry.yaml, without a crash.

    .venv/bin/python scripts/registry_run.py [--only NAME ...] [--no-reach] [--against B,C] [--vllm-source WHEEL]

Run on demand, not in CI (it downloads the plugins). For each listed plugin: its archive is fetched once with
`pip download --no-deps NAME==VERSION` into the plugin cache (~/.cache/vllm-patchkit/plugins,
$VLLM_PATCHKIT_PLUGIN_CACHE); `vllm-patchkit scan ARCHIVE --write DIR` runs in-process, as the command line runs
it (DIR a temporary folder; the table docs/adopting.md step 1 shows); the drafts it wrote are loaded as a patch set
and `vllm-patchkit pin --dry-run` runs on them with DIR on sys.path (docs/adopting.md, steps 1-3: an unreviewed
draft is refused by name on purpose); then `vllm-patchkit reach ARCHIVE` on the installed vLLM, read statically
(`--against B,C`: compared with those releases too, from their cached wheels, ~4x the time).

Prints one row per plugin: files read, sites found, drafts written, drafts the schema rejected (`rej`: not
written, scan drafted what it must not), what `pin --dry-run` refused (`N drafts`: each draft by name; `N unfit`:
before that, N required patches that do not fit the release, the plugin being written for another), reach's
resolved share (uses followed to a verdict; the total row: the plugins' mean), seconds, and `crash` with the
exception when anything raised, when a command's output holds a traceback or a raw pydantic dump, or when the
drafts do not load. Exit 1 if any plugin crashed; 2 if none did but a plugin could not be fetched; else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "corpus" / "registry.yaml"
#: What a person must never be shown: Python's traceback, pydantic's own rendering of a validation error.
RAW = re.compile(r"Traceback \(most recent call last\)|validation errors? for |errors\.pydantic\.dev|\[type=[a-z_]+, ")
SCANNED = re.compile(r"^(\d+) site\(s\) in (\d+) file\(s\)", re.M)   # scan's table, its closing line
REJECTED = re.compile(r"^draft \S+ not written \(the schema rejects it\)", re.M)  # scan --write
FOLLOWED = re.compile(r"^vLLM \S+: \d+ uses of vLLM: .*\((\d+)% followed\)$", re.M)  # reach's first release


@dataclass
class Row:
    name: str
    version: str
    files: Optional[int] = None
    sites: Optional[int] = None
    drafts: Optional[int] = None
    rejected: int = 0
    pin: str = "-"
    resolved: Optional[float] = None
    seconds: float = 0.0
    crash: str = ""
    unfetched: str = ""


class Crash(Exception):
    """A command failed in a way a person must never see (the message says which and how)."""


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`vllm-patchkit ARGV` in this process: (exit code, stdout, stderr); a raise is a Crash naming the verb."""
    from vllm_patchkit.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse, or a verb that exits: the code, not a crash
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        raise Crash(f"{argv[0]}: {type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})") from exc
    for stream in (out.getvalue(), err.getvalue()):
        hit = RAW.search(stream)
        if hit:
            line = next(ln for ln in stream.splitlines() if hit.group(0) in ln)
            raise Crash(f"{argv[0]}: raw output: {line.strip()[:200]}")
    return int(code or 0), out.getvalue(), err.getvalue()


def scan_and_draft(archive: Path, work: Path, row: Row, vllm_source: Optional[str]) -> Path:
    """`scan ARCHIVE --write DIR` (the table a person reads): files and sites from its closing line, the drafts
    written; the drafts' folder."""
    argv = ["scan", str(archive), "--write", str(work)] + (["--vllm-source", vllm_source] if vllm_source else [])
    code, out, err = run_cli(argv)
    counted = SCANNED.search(out)
    if code != 0 or counted is None:
        raise Crash(f"scan: exit {code}, {'no' if counted is None else 'a'} closing count: {(err or out).strip()[-200:]}")
    row.sites, row.files = int(counted.group(1)), int(counted.group(2))
    folders = [p for p in work.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise Crash(f"scan --write: {len(folders)} folders written, not one")
    row.drafts = len(list(folders[0].glob("*.yaml")))
    row.rejected = len(REJECTED.findall(out))
    return folders[0]


def load_and_pin(folder: Path, work: Path, drafts: int, vllm_source: Optional[str]) -> str:
    """The drafts load as a patch set; `pin --dry-run` exits 1 refusing each by name (or, first, naming the
    required patches that do not fit the release: the plugin targets another one), and nothing goes wrong."""
    from vllm_patchkit.declaration.declare import load_patch_set

    try:
        ps = load_patch_set([folder])
    except Exception as exc:
        raise Crash(f"the drafts do not load: {type(exc).__name__}: {str(exc)[:300]}") from exc
    if len(ps.patches) != drafts:
        raise Crash(f"{drafts} drafts written, {len(ps.patches)} loaded")
    if not drafts:
        return "-"  # pin refuses a folder without a patch (a usage error, not the drafts')
    sys.path.insert(0, str(work))
    try:
        code, out, err = run_cli(["pin", "--dry-run", "--patch-dir", str(folder), "--manifest-dir",
                                  str(folder / "manifests")] + (["--source", vllm_source] if vllm_source else []))
    finally:
        sys.path.remove(str(work))
        for mod in [m for m in sys.modules if m == folder.name or m.startswith(folder.name + ".")]:
            del sys.modules[mod]
    refused = err.count(": draft: drafted by `vllm-patchkit scan --write` and not reviewed")
    unfit = re.search(r"(\d+) required patch\(es\) do not fit it", err)
    if code != 1 or not (refused == drafts or unfit):
        raise Crash(f"pin --dry-run: exit {code}, {refused} of {drafts} drafts refused as drafts: "
                    f"{(err or out).strip()[-300:]}")
    return f"{refused} drafts" if refused == drafts else f"{unfit.group(1)} unfit"


def reach(archive: Path, against: Optional[str]) -> float:
    """`reach ARCHIVE [--against B,C]` on the installed vLLM: the share of the plugin's uses followed to a
    verdict, from its summary line."""
    code, out, err = run_cli(["reach", str(archive)] + (["--against", against] if against else []))
    followed = FOLLOWED.search(out)
    if code == 2 or followed is None:
        raise Crash(f"reach: exit {code}: {(err or out).strip()[-200:]}")
    return int(followed.group(1)) / 100


def run_one(entry: dict, args: argparse.Namespace) -> Row:
    from vllm_patchkit.tools.scan.recall import fetch

    row = Row(str(entry["name"]), str(entry["version"]))
    start = time.monotonic()
    archive, why = fetch(row.name, row.version)
    if archive is None:
        row.unfetched = why
        return row
    try:
        with tempfile.TemporaryDirectory(prefix="registry-run-") as tmp:
            work = Path(tmp)
            folder = scan_and_draft(archive, work, row, args.vllm_source)
            row.pin = load_and_pin(folder, work, row.drafts or 0, args.vllm_source)
        if not args.no_reach:
            row.resolved = reach(archive, args.against)
    except Crash as exc:
        row.crash = str(exc)
    except Exception as exc:  # the script's own reading of an output failed: still a crash of the run
        row.crash = f"{type(exc).__name__}: {exc}"
    row.seconds = time.monotonic() - start
    return row


def _cell(v) -> str:
    return "-" if v is None else str(v)


def render(rows: list[Row]) -> str:
    head = (f"{'plugin':30} {'version':>9} {'files':>5} {'sites':>5} {'drafts':>6} {'rej':>3} {'pin --dry-run':>13} "
            f"{'reach':>6} {'secs':>5}  crash")
    lines = [head, "-" * len(head)]
    for r in rows:
        pct = "-" if r.resolved is None else f"{100 * r.resolved:.0f}%"
        crash = f"not fetched: {r.unfetched[-120:]}" if r.unfetched else (f"crash: {r.crash}" if r.crash else "")
        lines.append(f"{r.name:30} {r.version:>9} {_cell(r.files):>5} {_cell(r.sites):>5} {_cell(r.drafts):>6} "
                     f"{r.rejected:>3} {r.pin:>13} {pct:>6} {r.seconds:>5.0f}  {crash}")
    ran = [r for r in rows if not r.unfetched]
    reached = [r.resolved for r in ran if r.resolved is not None]
    mean = f"{100 * sum(reached) / len(reached):.0f}%" if reached else "-"
    lines.append("-" * len(head))
    lines.append(f"{'total: ' + str(len(ran)) + ' plugins':30} {'':>9} {sum(r.files or 0 for r in ran):>5} "
                 f"{sum(r.sites or 0 for r in ran):>5} {sum(r.drafts or 0 for r in ran):>6} "
                 f"{sum(r.rejected for r in ran):>3} {'':>13} {mean:>6} "
                 f"{sum(r.seconds for r in ran):>5.0f}  {sum(1 for r in ran if r.crash)} crashed, "
                 f"{len(rows) - len(ran)} not fetched")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", default=str(LIST), help="the plugin list (default: tests/corpus/registry.yaml)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these plugins of the list")
    ap.add_argument("--no-reach", action="store_true", help="skip `vllm-patchkit reach`")
    ap.add_argument("--against", metavar="B[,C]", help="reach: also compare with these releases (their cached wheels)")
    ap.add_argument("--vllm-source", metavar="WHEEL_OR_DIR", help="scan and pin: this release (default: the "
                                                                   "installed vLLM, read statically)")
    args = ap.parse_args()
    entries = yaml.safe_load(Path(args.list).read_text(encoding="utf-8"))["plugins"]
    if args.only:
        entries = [e for e in entries if e["name"] in set(args.only)]
    rows = []
    for entry in entries:
        rows.append(run_one(entry, args))
        print(f"{rows[-1].name}: {rows[-1].crash or rows[-1].unfetched or 'ok'}", file=sys.stderr, flush=True)
    print(render(rows))
    if any(r.crash for r in rows):
        return 1
    return 2 if any(r.unfetched for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""`vllm-patchkit scan PATH|DIST`: adopt an existing vLLM plugin.

Reads the plugin's source without importing or running it (a folder, a .py file, a wheel or an sdist read in
place, or an installed distribution found through importlib.metadata) and lists every place it changes vLLM
(`sites.py`), placed at a vLLM release read statically (`upstream.py`), with what the patch schema can declare
it as (`classify.py`); `--write DIR` drafts the patch set (`draft.py`). Modules: `sources.py` (files),
`sites.py` (the AST visitor), `upstream.py` (the release and copied bodies), `classify.py`, `scanner.py` (the
run), `render.py` (table, JSON), `draft.py` (--write), `recall.py` (against the corpus catalogues).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_patchkit.tools.scan.model import ScanResult, Site
from vllm_patchkit.tools.scan.scanner import scan


def cmd_scan(args: argparse.Namespace) -> int:
    from vllm_patchkit.tools.scan.render import render_json, render_table

    result = scan(args.plugin, vllm_source=args.vllm_source, include_tests=args.include_tests)
    if args.write:
        from vllm_patchkit.tools.scan.draft import write

        try:
            folder, written, rejected = write(result, Path(args.write))
        except OSError as exc:
            print(f"vllm-patchkit scan: cannot write drafts to {args.write}: {exc}", file=sys.stderr)
            return 2
        msg = [f"wrote {sum(1 for p in written if p.suffix == '.yaml')} draft patch(es) and "
               f"{sum(1 for p in written if p.suffix == '.py' and p.name != '__init__.py')} stub module(s) to {folder}",
               f"next: PYTHONPATH={Path(args.write)} vllm-patchkit pin --dry-run --patch-dir {folder} "
               f"--manifest-dir {folder / 'manifests'}"]
        msg += [f"draft {pid} not written (the schema rejects it): {err}" for pid, err in rejected]
        print("\n".join(msg), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(render_json(result), end="")
    else:
        print(render_table(result), end="")
    return 2 if result.files == 0 and result.errors else 0


def add_scan(sub) -> None:
    p = sub.add_parser("scan", help="find the monkeypatch sites of an existing vLLM plugin (adoption); draft patches",
                       description="Reads the plugin without importing or running it. Exit 0: scanned (files that "
                                   "do not parse are listed as findings); 2: nothing could be read.")
    p.add_argument("plugin", metavar="PATH|DIST",
                   help="a folder, a .py file, a wheel, an sdist (.tar.gz), or an installed distribution's name")
    p.add_argument("--vllm-source", metavar="WHEEL_OR_DIR",
                   help="the vLLM release to place the sites at (default: the installed vLLM's tree, read statically)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--write", metavar="DIR", help="draft one patch YAML per declarable site, stub modules and an "
                                                   "empty manifests folder under DIR/<plugin>_patchkit/")
    p.add_argument("--include-tests", action="store_true", help="also scan the plugin's test files")
    p.set_defaults(func=cmd_scan)


__all__ = ["ScanResult", "Site", "add_scan", "cmd_scan", "scan"]

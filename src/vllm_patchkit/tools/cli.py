"""`vllm-patchkit`: the command line. Each verb is a small function over the framework's modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

from vllm_patchkit.reporting import status as status_mod
from vllm_patchkit.reporting import run_folder, verdict
from vllm_patchkit.tools.check import add_check
from vllm_patchkit.tools.pin import add_pin
from vllm_patchkit.runtime.record import default_status_dir


def cmd_status(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else default_status_dir()
    if args.list:
        for rid in run_folder.list_runs(base):
            print(rid)
        return verdict.OK
    run = run_folder.load_run(base, args.run)
    if args.sets:
        run = run_folder.narrow(run, set(args.sets))
    judged = verdict.judge(run, args.min_steps)
    if args.json:
        print(status_mod.json_of(judged))
    else:
        print(status_mod.table_of(judged, show_skipped=args.all), end="")
    return judged.exit_code


def add_status(sub) -> None:
    p = sub.add_parser("status", help="what applied, what was skipped and why, what never ran")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--run", help="run id (default: the latest run)")
    p.add_argument("--list", action="store_true", help="list run ids, oldest first")
    p.add_argument("--dir", help="status directory (default: $VLLM_PATCHKIT_STATUS_DIR or the per-user default)")
    p.add_argument("--min-steps", type=int, default=8, help="engine steps before a per_step patch with 0 calls is inert")
    p.add_argument("--all", action="store_true", help="also show patches skipped because they belong to another process")
    p.add_argument("--set", action="append", metavar="NAME", dest="sets",
                   help="only the patches of this patch set (repeatable); start-up errors are always shown")
    p.set_defaults(func=cmd_status)


def cmd_schema(args: argparse.Namespace) -> int:
    from vllm_patchkit.tools.schema_export import write_schemas
    from vllm_patchkit.tools.schema_objects import write_objects

    for path in write_schemas(Path(args.out) if args.out else None):
        print(f"wrote {path}")
    if not args.out:  # the objects every process reads live in the package, never elsewhere
        for path in write_objects():
            print(f"wrote {path}")
    return 0


def add_schema(sub) -> None:
    p = sub.add_parser("schema", help="write the JSON Schemas of patch and manifest files and the objects "
                                          "generated from the validating models (declaration/schema.py, pins.py)")
    p.add_argument("--out", help="folder (default: the package's schema/ folder)")
    p.set_defaults(func=cmd_schema)


def default_docs_dir() -> Path:
    """docs/ of the checkout this package runs from (an editable install), else ./docs."""
    here = Path(__file__).resolve().parents[3] / "docs"
    return here if here.is_dir() else Path("docs")


def cmd_docs(args: argparse.Namespace) -> int:
    from vllm_patchkit.tools.docs import COMMAND, write_or_check

    out = Path(args.out) if args.out else default_docs_dir()
    stale = write_or_check(out, args.check)
    if args.check:
        if stale:
            print(f"stale generated docs in {out}: {', '.join(stale)}; run `{COMMAND}` and commit", file=sys.stderr)
            return 1
        print(f"generated docs in {out} are current")
        return 0
    print(f"wrote {', '.join(stale) or 'nothing (all current)'} in {out}")
    return 0


def add_docs(sub) -> None:
    p = sub.add_parser("docs", help="generate docs/patches.md, docs/env.md, docs/manifests.md from the YAML")
    p.add_argument("--check", action="store_true", help="exit 1 if a generated file is missing or out of date")
    p.add_argument("--out", help="docs folder (default: the checkout's docs/)")
    p.set_defaults(func=cmd_docs)


VERBS: list[Callable] = [add_status, add_schema, add_docs, add_check, add_pin]
VERBS.append(__import__("vllm_patchkit.tools.doctor", fromlist=["add_doctor"]).add_doctor)
VERBS.append(__import__("vllm_patchkit.tools.scan", fromlist=["add_scan"]).add_scan)
VERBS.append(__import__("vllm_patchkit.tools.reach_plugin", fromlist=["add_reach"]).add_reach)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-patchkit", description="Declarative, verified patches for vLLM plugins")
    sub = ap.add_subparsers(dest="verb", required=True)
    for add in VERBS:
        add(sub)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `--live` runs the same verb again in a child
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

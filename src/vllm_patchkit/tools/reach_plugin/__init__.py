"""`vllm-patchkit reach PATH|DIST [--vllm A] [--against B[,C]]`: everything a whole plugin touches in vLLM.

Where `check` judges the places a patch set is installed at, this reads every module of the plugin (a folder, a
wheel, an sdist or an installed distribution, read in place, never imported) and judges each use of vLLM on a
release read statically (`releases.open_release`: the installed tree or a cached wheel): the names it imports
(guards told apart), the attributes and methods it reads on objects whose vLLM class is inferred, the vLLM
callables it calls and the classes it constructs (arity and keywords), the vLLM classes it subclasses (each
override against the base, abstract methods left out). `--against` says what each later release breaks.
Modules: `plugin_modules.py` (the plugin's names), `imports.py`, `walk.py`, `signatures.py`, `classes.py`,
`uses.py` (one release's verdicts), `differential.py` (A against B), `render.py`.
"""

from __future__ import annotations

import argparse
import sys

from vllm_patchkit.tools.reach_plugin.differential import compare, identity_moves
from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules
from vllm_patchkit.tools.reach_plugin.uses import BROKEN, read
from vllm_patchkit.tools.releases import ReleaseError, StaticView, open_release
from vllm_patchkit.tools.scan.sources import open_plugin


def _static(release):
    return release.release if isinstance(release, StaticView) else release.static()


def cmd_reach(args: argparse.Namespace) -> int:
    from vllm_patchkit.tools.reach_plugin.render import render_json, render_text

    plugin = PluginModules(open_plugin(args.plugin, include_tests=args.include_tests))
    if not plugin.modules:
        why = "; ".join(f"{p}: {e}" for p, e in plugin.errors) or "no Python modules"
        print(f"vllm-patchkit reach: nothing to read in {args.plugin}: {why}", file=sys.stderr)
        return 2
    versions = [v.strip() for v in (args.against or "").split(",") if v.strip()]
    try:
        base_view = open_release(args.vllm, args.source)
        views = [open_release(v) for v in versions]
    except ReleaseError as exc:
        print(f"vllm-patchkit reach: {exc}", file=sys.stderr)
        return 2
    base = read(plugin, _static(base_view))
    others = [read(plugin, _static(v)) for v in views]
    diffs = [compare(base, r, identity_moves(base_view, v)) for r, v in zip(others, views)]
    render = render_json if args.json else render_text
    print(render(plugin.label, len(plugin.modules), base, diffs, others), end="")
    if versions:
        return 1 if any(d.breaking for d in diffs) else 0
    return 1 if any(u.state == BROKEN for u in base.uses) else 0


def add_reach(sub) -> None:
    p = sub.add_parser("reach", help="everything a whole plugin's code touches in vLLM, judged per release",
                       description="Reads the plugin without importing it. Exit 0: nothing broken (with "
                                   "--against: nothing breaking on those releases); 1: something is; 2: nothing "
                                   "could be read, or a release cannot be opened.")
    p.add_argument("plugin", metavar="PATH|DIST", help="a folder, a .py file, a wheel, an sdist, or an installed "
                                                        "distribution's name")
    p.add_argument("--vllm", metavar="A", help="the release the plugin works on (default: the installed vLLM; "
                                                "another version is read from its cached wheel)")
    p.add_argument("--source", metavar="WHEEL_OR_DIR", help="read release A from this wheel or tree instead")
    p.add_argument("--against", metavar="B[,C]", help="releases to compare with A: what each one breaks")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--include-tests", action="store_true", help="also read the plugin's test files")
    p.set_defaults(func=cmd_reach)


__all__ = ["add_reach", "cmd_reach"]

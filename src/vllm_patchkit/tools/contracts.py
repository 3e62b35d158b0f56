"""`vllm-patchkit check`: the command. The work is in check.py (findings in breakage.py, signature
diffs in sigdiff.py, release sources in releases.py, renderers in render.py); the names are re-exported
here for callers of the former single module."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_patchkit.tools import live
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.tools.check import (Baseline, Finding, PatchResult, Report, check, examine, exact, older_entry, retirement,
                    target_specs)
from vllm_patchkit.declaration.declare import PatchSet
from vllm_patchkit.tools.releases import (WHEEL_CACHE_ENV, LiveRelease, Release, ReleaseError, StaticView, cached_wheel,
                       installed_root, installed_version, open_release, wheel_cache)
from vllm_patchkit.tools.render import RENDER, render_github, render_json, render_text
from vllm_patchkit.declaration.schema import Manifest
from vllm_patchkit.upstream.sigdiff import Param, compare, diff_signatures, missing_breakages, parse_signature


# -- the verb -----------------------------------------------------------------------------------
def read_manifests(directories, patch_set: PatchSet, *, strict: bool = True) -> tuple[dict[str, Manifest], dict[str, str]]:
    """Manifests by release, merged across the sets' folders. Strict: through `manifest.load_manifests`
    (every pin present and known); otherwise only parsed (pin reads what it is about to replace)."""
    from vllm_patchkit.declaration.declare import parse_manifest
    from vllm_patchkit.declaration.manifest import load_manifests

    dirs = [Path(directories)] if isinstance(directories, (str, Path)) else [Path(d) for d in directories]
    if strict:
        loaded = load_manifests(dirs, patch_set)
        return {v: l.manifest for v, l in loaded.items()}, {v: l.path for v, l in loaded.items()}
    out, paths = {}, {}
    for d in dirs:
        for path in sorted(d.glob("*.yaml")):
            m = parse_manifest(path)
            if m.vllm in out:
                base = out[m.vllm]
                m = base.model_copy(update={"patches": [*base.patches, *m.patches],
                                            "not_applicable": [*base.not_applicable, *m.not_applicable]})
            else:
                paths[m.vllm] = str(path)
            out[m.vllm] = m
    return out, paths


def add_release_args(p) -> None:
    p.add_argument("--vllm", metavar="VERSION", help="the release (default: the installed vLLM); a version that is not "
                   f"installed is read from its wheel in ${WHEEL_CACHE_ENV} (default ~/.cache/vllm-patchkit/wheels); "
                   "with --source: the version of the source when it does not say")
    p.add_argument("--source", metavar="WHEEL_OR_DIR", help="read the release statically from a wheel or source tree")
    p.add_argument("--live", action="store_true",
                   help="read the installed vLLM by import (as the loader does), in a child process whose crash "
                        "is reported naming the module (default: read it statically, like a wheel)")
    p.add_argument("--set", action="append", metavar="NAME", dest="sets",
                   help="only this installed patch set (repeatable; the framework's own `core` set is always in)")
    p.add_argument("--patch-dir", action="append", type=Path,
                   help="patch folder (repeatable; default: every installed patch set)")
    p.add_argument("--manifest-dir", type=Path, help="manifest folder (default: each patch set's own manifests)")


def patch_set_and_manifest_dir(args) -> tuple[PatchSet, list[Path]]:
    """The patch set and manifest folder the command works on; a folder the user names must exist
    (a typo must not read as "nothing there"), and each `--patch-dir` must hold at least one patch
    (else the command would report on nothing)."""
    from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
    from vllm_patchkit.declaration.errors import PatchkitError
    from vllm_patchkit.declaration.patchsets import discover

    def _given_folder(option: str, path: Path, expected: str) -> None:
        if not path.exists():
            raise PatchkitError(f"{option} {path}: no such folder (expected {expected})")
        if not path.is_dir():
            raise PatchkitError(f"{option} {path}: not a folder (expected {expected})")

    for d in args.patch_dir or []:
        _given_folder("--patch-dir", d, "a folder of patch files, *.yaml")
        if not any(d.glob("*.yaml")):
            raise PatchkitError(f"--patch-dir {d}: holds no patch (*.yaml with an id)")
    if args.manifest_dir is not None:
        _given_folder("--manifest-dir", args.manifest_dir, "a folder of manifests, vllm-VERSION.yaml")
    if args.patch_dir:
        return load_patch_set(args.patch_dir), [args.manifest_dir] if args.manifest_dir else []
    sources = discover(getattr(args, "sets", None))
    return load_patch_set(sources), [args.manifest_dir] if args.manifest_dir else manifest_dirs(sources)


def cmd_check(args) -> int:
    from vllm_patchkit.declaration.errors import PatchkitError

    if args.live and not live.in_child():
        return live.run_in_child("check", args.argv)
    try:
        ps, mdirs = patch_set_and_manifest_dir(args)
        manifests, paths = read_manifests(mdirs, ps)
        release = open_release(args.vllm, args.source, live=args.live)
        report = check(release, ps, manifests, baseline=args.baseline, paths=paths)
    except (PatchkitError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(f"vllm-patchkit check: {exc}", file=__import__("sys").stderr)
        return 2
    print(RENDER[args.format](report), end="")
    return report.exit_code()


def add_check(sub) -> None:
    p = sub.add_parser("check", help="compare every patch's targets with a vLLM release (installed, wheel or tree)",
                       description="Exit 0: every patch fits; 1: a breakage; 2: the check could not run.")
    add_release_args(p)
    p.add_argument("--baseline", metavar="VERSION",
                   help="compare with the pins of this release's manifest (default: the release's own manifest, "
                        "else the newest older one listing each patch)")
    p.add_argument("--format", choices=sorted(RENDER), default="text")
    p.set_defaults(func=cmd_check)


__all__ = ["Breakage", "BreakageKind", "Finding", "LiveRelease", "Report", "StaticView", "add_check", "check", "compare",
           "diff_signatures", "examine", "open_release"]

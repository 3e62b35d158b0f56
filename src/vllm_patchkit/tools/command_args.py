"""The options `check` and `pin` share (which release, which patch sets, which folders), and what they name:
the patch set and the manifest folders a command works on."""

from __future__ import annotations

from pathlib import Path

from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.tools.releases import WHEEL_CACHE_ENV


def add_release_args(p) -> None:
    p.add_argument("--vllm", metavar="VERSION", help="the release (default: the installed vLLM); a version that is not "
                   f"installed is read from its wheel in ${WHEEL_CACHE_ENV} (default ~/.cache/vllm-patchkit/wheels); "
                   "with --source: the version of the source when it does not say; several (check only): "
                   "'0.31.0,0.32.0', a range '>=0.31,<0.35' or 'all'")
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

"""The check: compare every patch's targets with a vLLM release, before installing it.

`vllm-patchkit check` answers "which patches break on vLLM X?". The release is
the installed vLLM (read live, by import) or a wheel / source tree (read
statically, see `static.py`). Each target's fingerprint is compared with its
pin; every difference is one `Breakage` value with a kind and an `explain()`,
and rendering (text, JSON, GitHub annotations) is separate (griffe's habit).
A target that moved, or is now inherited from a base class, is also compared
at its new home. Renderers report each breakage once per target, naming every
patch it affects (`Report.findings()`).

Which pins a patch is compared with:

- the release has a manifest (and no `--baseline`): the pins of its entry; a
  patch the manifest does not list (nor marks not applicable) is `unpinned`;
- otherwise (the upgrade-readiness report): the newest older manifest that lists
  the patch, or the manifest named by `--baseline`.

A patch is retirable on the release when its `retire_when.vllm` specifier
contains the release, or its `retire_when.probe` (`module:function`, called with
the release's source root: a `pathlib.Path` or `zipfile.Path` of the folder
that holds `vllm/`) returns true (a string is taken as the reason).

Where the parts live: each patch's places are examined in `examine.py`, the pins chosen in `baseline.py`,
the verdict is a `report.Report`; this module decides each patch's status and runs the command.
"""

from __future__ import annotations

import sys
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.reporting.terminal_text import printable
from vllm_patchkit.tools import live, reach_check, unreviewed
from vllm_patchkit.upstream.compat import JUDGED_AT_START_UP
from vllm_patchkit.upstream.findings import Breakage, BreakageKind, ProbeAnswer
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.tools.baseline import Baseline, exact, older_entry, pinned_release, with_source_diffs
from vllm_patchkit.tools.command_args import add_release_args, patch_set_and_manifest_dir
from vllm_patchkit.tools.examine import examine, set_on_path
from vllm_patchkit.tools.manifest_files import read_manifests
from vllm_patchkit.tools.releases import Release, ReleaseError, open_release
from vllm_patchkit.tools.render import RENDER
from vllm_patchkit.tools.report import PatchResult, PatchStatus, Report
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Manifest
from vllm_patchkit.upstream.targets import load_object


def retirement(release: Release, patch: Patch) -> tuple[Optional[str], list[Breakage], Optional[str]]:
    """Why the patch can be retired on this release (None: it cannot), a probe failure if any, and the
    evidence a probe read that it must stay (a `ProbeAnswer` that is not retirable)."""
    rw = patch.retire_when
    version = release.version()
    if rw.vllm is not None and version is not None:
        if SpecifierSet(rw.vllm).contains(Version(version), prereleases=True):
            return f"retire_when.vllm {rw.vllm!r} contains {version}", [], None
        return None, [], None
    if rw.probe is not None:
        try:
            said = load_object(rw.probe)(release.probe_root())
        except Exception as exc:  # a probe's failure is a finding, never swallowed
            return None, [Breakage(BreakageKind.probe_error, patch.key, rw.probe,
                                   detail=f"{type(exc).__name__}: {exc}")], None
        if isinstance(said, ProbeAnswer):
            return (said.evidence, [], None) if said.retirable else (None, [], said.evidence)
        if said:
            return (said if isinstance(said, str) else f"probe {rw.probe} detects the upstream fix"), [], None
    return None, [], None


def check(release: Release, patch_set: PatchSet, manifests: dict[str, Manifest], *,
          baseline: Optional[str] = None, paths: Optional[dict[str, str]] = None) -> Report:
    """Compare every patch of the set with the release (see the module docstring for which pins)."""
    version = release.version()
    if version is None:
        raise ReleaseError(f"cannot tell the version of {release.label}")
    paths = paths or {}
    own_key = None if baseline else exact(manifests, version)
    own = manifests.get(own_key) if own_key else None
    if baseline is not None:
        bkey = exact(manifests, baseline)
        if bkey is None:
            raise ReleaseError(f"no manifest pins vLLM {baseline} (known: {', '.join(sorted(manifests, key=Version)) or 'none'})")
    results = []
    gate = unreviewed.problems(patch_set)  # drafts, placeholders, stubs: refused before any pin is trusted
    for pid in sorted({p.id for p in patch_set.patches.values()}):
        newest = max(patch_set.by_id(pid), key=lambda p: p.version)
        res = _check_one(release, patch_set, pid, newest, manifests, version, own, own_key, baseline, paths)
        patch = patch_set.patches.get(res.patch, newest)
        res.file = patch_set.files.get(patch.key)
        if res.status == PatchStatus.not_applicable:  # the release has no place for it: nothing to retire or keep here
            probe_errors = []
        else:
            res.retire, probe_errors, res.kept = retirement(release, patch)
        res.breakages.extend(probe_errors)
        if probe_errors and res.status == PatchStatus.ok:
            res.status = PatchStatus.broken
        refused = [b for p in sorted(patch_set.by_id(pid), key=lambda p: p.version)
                   for b in unreviewed.breakages(patch_set, gate, p.key)]
        if refused:
            res.breakages.extend(refused)
            res.status = PatchStatus.broken
        results.append(res)
    if own is not None:
        _contradictions(patch_set, own_key, own, paths, results)
    return Report(version, release.label, results)


def _contradictions(patch_set: PatchSet, own_key: str, own: Manifest, paths: dict[str, str],
                    results: list[PatchResult]) -> None:
    """The release's own manifest lists a required patch whose `when.vllm` excludes the release: broken, naming
    the manifest file and entry and the patch file (contradictions.py; the loader refuses it at start-up)."""
    from vllm_patchkit.declaration.contradictions import discovered_folders, find

    if not find(patch_set, {own_key: own}, paths):
        return
    for c in find(patch_set, {own_key: own}, paths, folders=discovered_folders()):
        res = next((r for r in results if PatchKey.parse(r.patch).id == PatchKey.parse(c.key).id), None)
        if res is None:
            continue
        patch = patch_set.patches[c.key]
        res.breakages.append(Breakage(BreakageKind.when_excludes, c.key, patch.target or c.key,
                                      detail=c.explain()))
        res.status = PatchStatus.broken


def _check_one(release, patch_set, pid, newest, manifests, version, own, own_key, baseline, paths) -> PatchResult:
    if baseline is not None:
        bkey = exact(manifests, baseline)
        m = manifests[bkey]
        entry = next((e for e in m.patches if PatchKey.parse(e.patch).id == pid), None)
        na = next((n for n in m.not_applicable if n.patch == pid), None)
        base = Baseline(bkey, entry, paths.get(bkey, "")) if entry else None
        if base is None and na is not None:
            return PatchResult(newest.key, PatchStatus.not_applicable, pins_from=bkey,
                               note=f"not applicable on vLLM {bkey} (the baseline): {na.reason}")
    elif own is not None:
        na = next((n for n in own.not_applicable if n.patch == pid), None)
        if na is not None:
            res = PatchResult(newest.key, PatchStatus.not_applicable, pins_from=own_key, note=na.reason)
            if newest.required and not na.reason.startswith("by hand:"):
                # marked by a tool, not decided by a reviewer: what the loader does with it when a model needs
                # it: refuse start-up (a version admits the release) or skip it silently (none does)
                from vllm_patchkit.declaration.preconditions import version_matches

                admitted = any(version_matches(p.when, version) for p in patch_set.by_id(pid))
                res.breakages.append(Breakage(BreakageKind.required_not_applicable, newest.key,
                                              newest.target or pid, new="refused" if admitted else "skipped",
                                              detail=na.reason))
            return res
        entry = next((e for e in own.patches if PatchKey.parse(e.patch).id == pid), None)
        if entry is None:
            base = older_entry(pid, manifests, version, paths)
            res = _compare_entry(release, patch_set, base, newest) if base else _unpinned(release, newest, patch_set)
            res.breakages.append(Breakage(
                BreakageKind.unpinned, res.patch, newest.target or pid,
                detail=f"manifest for vLLM {own_key} neither lists {pid} nor marks it not applicable "
                       f"(run `vllm-patchkit pin --vllm {own_key}`)"))
            res.status = PatchStatus.unpinned
            return res
        base = Baseline(own_key, entry, paths.get(own_key, ""))
    else:
        base = older_entry(pid, manifests, version, paths)
    if base is None:
        res = _unpinned(release, newest, patch_set)
        where = f"the manifest for vLLM {baseline} does not list {pid}" if baseline is not None else \
            f"no manifest older than vLLM {version} lists {pid}"
        res.breakages.append(Breakage(BreakageKind.unpinned, newest.key, newest.target or pid, detail=where))
        res.status = PatchStatus.unpinned
        return res
    return _compare_entry(release, patch_set, base, newest)


def _compare_entry(release, patch_set, base: Baseline, newest: Patch) -> PatchResult:
    patch = patch_set.patches[base.entry.patch]
    _, breakages = examine(release, patch, dict(base.entry.targets), pinned_release(release, base.vllm)[0],
                           impl_here=set_on_path(patch_set, patch.key))
    breakages = with_source_diffs(release, base.vllm, breakages)
    breakages += reach_check.breakages(release, patch, base.entry, reach_check.root_of(patch_set, patch.key))
    note = "" if patch.version == newest.version else f"newest version is {newest.key}, not listed for vLLM {base.vllm}"
    if any(b.breaking for b in breakages):
        status = PatchStatus.broken
    elif breakages:
        own = Version(base.vllm) == Version(release.version() or "0")
        stale = own and any(b.kind not in JUDGED_AT_START_UP for b in breakages)  # the loader refuses those
        status = PatchStatus.stale if stale else PatchStatus.compatible
        note = note or ("pins differ from the release by changes this patch survives: re-run `vllm-patchkit pin`"
                        if stale else "changes this patch survives (the loader judges them and applies it): "
                        "re-run `vllm-patchkit pin` to record them" if own
                        else "changes this patch survives: `vllm-patchkit pin` carries it forward")
    else:
        status = PatchStatus.ok
    return PatchResult(patch.key, status, breakages, pins_from=base.vllm, note=note)


def _unpinned(release, patch: Patch, patch_set: Optional[PatchSet] = None) -> PatchResult:
    here = set_on_path(patch_set, patch.key) if patch_set is not None else True
    _, breakages = examine(release, patch, None, impl_here=here)  # at least: do the targets exist?
    return PatchResult(patch.key, PatchStatus.unpinned, breakages)


# -- the verb -----------------------------------------------------------------------------------
def cmd_check(args) -> int:
    from vllm_patchkit.declaration.errors import PatchkitError

    from vllm_patchkit.tools.matrix import is_selection

    if is_selection(args.vllm):
        return _cmd_matrix(args)
    if args.live and not live.in_child():
        return live.run_in_child("check", args.argv)
    try:
        ps, mdirs = patch_set_and_manifest_dir(args)
        manifests, paths = read_manifests(mdirs, ps)
        release = open_release(args.vllm, args.source, live=args.live)
        report = check(release, ps, manifests, baseline=args.baseline, paths=paths)
    except (PatchkitError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(printable(f"vllm-patchkit check: {exc}"), file=sys.stderr)
        return 2
    text = RENDER[args.format](report)
    if args.confirm:
        text = _confirmed(text, args, report, ps, manifests)
    print(text, end="")
    return report.exit_code()


def _confirmed(text: str, args, report, ps, manifests) -> str:
    """The report with `--confirm`'s answers: after the text, or as the JSON's `confirmations`."""
    import json

    from vllm_patchkit.tools import confirm

    runner, why = confirm.runner_for(report.vllm, args.source, args.confirm_python)
    roots = tuple(sorted({str(r) for k in ps.patches if (r := reach_check.root_of(ps, k)) is not None}))
    found = confirm.confirm(report, ps, manifests, runner, why, extra_path=roots)
    if args.format == "json":
        doc = json.loads(text)
        doc["confirmations"] = [c.as_dict() for c in found]
        doc["confirmed_by"] = runner.describe() if runner is not None else why
        return json.dumps(doc, indent=2) + "\n"
    return text + confirm.render(found, runner)


def _cmd_matrix(args) -> int:
    """`--vllm` names several releases: the patch × release table and the requirement line (`matrix.py`)."""
    from vllm_patchkit.declaration.errors import PatchkitError
    from vllm_patchkit.tools import matrix
    from vllm_patchkit.tools.matrix_render import RENDER as MATRIX_RENDER

    for flag, given in (("--source", args.source), ("--live", args.live), ("--confirm", args.confirm)):
        if given:
            print(f"vllm-patchkit check: {flag} reads one release; --vllm {args.vllm!r} names several "
                  "(each is read from its wheel in the cache, or the installed one statically)", file=sys.stderr)
            return 2
    try:
        ps, mdirs = patch_set_and_manifest_dir(args)
        manifests, paths = read_manifests(mdirs, ps)
        m = matrix.run(args.vllm, ps, manifests,
                       lambda rel: check(rel, ps, manifests, baseline=args.baseline, paths=paths))
    except (PatchkitError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(f"vllm-patchkit check: {exc}", file=sys.stderr)
        return 2
    print(MATRIX_RENDER[args.format](m), end="")
    return m.exit_code()


MATRIX_HELP = """several releases at once: --vllm 0.31.0,0.32.0,0.33.0 (a list), --vllm '>=0.31,<0.35' (every known
release in the range: each manifest's, each wheel's in the wheel cache, the installed one) or --vllm all. Prints one
table patch x release (check's statuses per cell), each release's findings, and the requirement line for the
plugin's pyproject.toml: '>=oldest,<=newest' of the releases where every required patch is ok, compatible or not
applicable, minor series inside it that were not examined or not supported excluded (!=0.32.*), never a release
above the newest supported one (docs/adopting.md, "Which vLLM does the plugin match"). Exit code: the worst
release's."""


def add_check(sub) -> None:
    p = sub.add_parser("check", help="compare every patch's targets with a vLLM release (installed, wheel or tree)",
                       description="Exit 0: every patch fits; 1: a breakage; 2: the check could not run.",
                       epilog=MATRIX_HELP)
    add_release_args(p)
    p.add_argument("--baseline", metavar="VERSION",
                   help="compare with the pins of this release's manifest (default: the release's own manifest, "
                        "else the newest older one listing each patch)")
    p.add_argument("--format", choices=sorted(RENDER), default="text")
    p.add_argument("--confirm", action="store_true",
                   help="exercise each reach or signature breakage on the release in a child process (the installed "
                        "vLLM, a --source tree put first on the path, or --confirm-python's) and say confirmed, not "
                        "confirmed or cannot confirm; the verdict and exit code are check's")
    p.add_argument("--confirm-python", metavar="PY",
                   help="with --confirm: an interpreter that has the checked release installed (e.g. a venv's python)")
    p.set_defaults(func=cmd_check)

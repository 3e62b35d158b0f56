"""Pin: write `manifests/vllm-VERSION.yaml` from the real release.

`vllm-patchkit pin --vllm VERSION [--source WHEEL_OR_DIR] [--out DIR]` reads
every target (and copy) of the patch set from the release — by import when it
is the installed vLLM, statically from a wheel or source tree otherwise — and
writes their fingerprints. Nothing is pinned that was not read from the release.

What it keeps of an existing manifest for the same release (a reviewer's choices):
- `not_applicable` entries recorded by hand (`by hand: ...`); those a tool wrote are decided again;
- the patch version each entry lists (its pins are re-read from the release; an
  entry may be added by hand with `targets: {}` to choose a new version).

A patch the manifest does not list is planned by `plan_patch`: of the versions
whose `when.vllm` admits the release, the one the newest older manifest lists is
**carried forward** when every difference from its pins is compatible for that
patch (`compat.py`: a verbatim forwarder survives an added parameter, a new
default, ...); otherwise the newest admitted version not pinned before is taken
if its places exist and its implementation fits the release's signatures.
`--dry-run` prints this plan and writes nothing.

A required patch (`required: true` in the version compared or in its newest
version) is never marked not applicable by pin on its own — not when its targets
changed, and not when no version's `when.vllm` admits the release (the loader
would skip it there as not needed, silently): the breakages are an error
(`RequiredPatchesDoNotFit`, exit 1, nothing written) until its owner adds a
version that fits, or a person records the decision with
`--not-applicable ID='reason'` (written as "by hand: reason"; optional patches
too). Entries carried over from the existing manifest stay as they are; one whose
patch's `when.vllm` excludes the release is an error naming the manifest entry
and the patch file (contradictions.py).

Where the parts live: the plan for a patch not yet listed is `pin_plan.py`; manifest files are read and
written by `manifest_files.py`; this module decides the manifest and runs the command.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.reporting.terminal_text import printable
from vllm_patchkit.tools import reach_check
from vllm_patchkit.tools.baseline import exact
from vllm_patchkit.tools import unreviewed
from vllm_patchkit.tools.command_args import add_release_args, patch_set_and_manifest_dir
from vllm_patchkit.tools.examine import set_on_path
from vllm_patchkit.tools.manifest_files import dump_fingerprint, read_manifests, write, write_by_set
from vllm_patchkit.tools.pin_plan import examine_settled, plan_patch
from vllm_patchkit.tools.releases import Release, ReleaseError, StaticView, open_release
from vllm_patchkit.upstream.findings import BreakageKind
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import DeclarationError, PatchkitError
from vllm_patchkit.declaration.pins import Manifest, ManifestEntry, NotApplicable
from vllm_patchkit.declaration.preconditions import version_matches
from vllm_patchkit.upstream.missing import Missing

BY_HAND = "by hand: "


class RequiredPatchesDoNotFit(PatchkitError):
    """Required patches whose targets are missing or changed on the release being pinned (exit 1)."""

    def __init__(self, version: str, broken: list[tuple[str, str, str, list[str]]]):
        self.version = version
        self.broken = broken  # (patch id, id@version compared, compared with what, what broke)
        lines = [f"cannot pin vLLM {version}: {len(broken)} required patch(es) do not fit it; nothing written"]
        lines += self.blocks(version, broken)
        super().__init__("\n".join(lines))

    @staticmethod
    def blocks(version: str, broken: list[tuple[str, str, str, list[str]]]) -> list[str]:
        lines = []
        for pid, key, against, explanations in broken:
            lines.append(f"  - {key} (required) does not fit vLLM {version} ({against}):")
            lines += [f"      {e}" for e in explanations]
            lines.append(f"    remedy: add a new version of the patch that fits vLLM {version}, "
                         f"or record it as not applicable with --not-applicable {pid}='reason'")
        return lines


def parse_not_applicable(values: Optional[list[str]]) -> dict[str, str]:
    """`--not-applicable ID=REASON` options -> {id: reason}; malformed or empty ones are errors naming them."""
    out: dict[str, str] = {}
    for v in values or []:
        pid, eq, reason = v.partition("=")
        pid, reason = pid.strip(), reason.strip()
        if not eq or not pid:
            raise PatchkitError(f"--not-applicable {v!r}: expected ID=REASON (a patch id and why it does not apply)")
        if not reason:
            raise PatchkitError(f"--not-applicable {pid}: empty reason (say why {pid} does not apply: ID=REASON)")
        if pid in out:
            raise PatchkitError(f"--not-applicable {pid}: given twice")
        out[pid] = reason
    return out


class Unreviewed(PatchkitError):
    """Drafts, placeholders and stubs in the patch set (`unreviewed.py`): nothing is pinned (exit 1)."""

    def __init__(self, errors: list):
        self.errors = errors
        super().__init__(f"{len(errors)} problem(s) a person must fix before pinning; nothing written:\n"
                         + unreviewed.render(errors))


@dataclass
class Pinned:
    manifest: Manifest
    notes: list[str] = field(default_factory=list)  # what changed or needs a human
    unreviewed: list = field(default_factory=list)  # plan_only: what refuses the real pin (`Unreviewed`)


def _contradiction(patch_set: PatchSet, own_key: str, own: Manifest, key: str, patch, version: str,
                   paths: Optional[dict[str, str]]) -> str:
    """An entry of the existing manifest whose patch's `when.vllm` excludes the release, naming both places."""
    from vllm_patchkit.declaration.contradictions import discovered_folders, find

    found = [c for c in find(patch_set, {own_key: own}, paths, folders=discovered_folders()) if c.key == key]
    if found:  # a required patch: the loader's and check's words
        return found[0].explain()
    where = (paths or {}).get(own_key) or f"the manifest for {own_key}"
    index = next((i for i, e in enumerate(own.patches) if e.patch == key), "?")
    return (f"{where}: patches[{index}] (patch: {key}): listed for vLLM {version}, but its when.vllm "
            f"{patch.when.vllm!r} ({patch_set.files.get(key, '?')}) excludes {version}: list a version whose "
            "when.vllm admits it, or correct the when.vllm")


def pin_release(release: Release, patch_set: PatchSet, manifests: dict[str, Manifest], *,
                generated_by: str, not_applicable_by_hand: Optional[dict[str, str]] = None,
                paths: Optional[dict[str, str]] = None, plan_only: bool = False) -> Pinned:
    """The manifest for `release` (see the module docstring for what is kept and decided).

    `not_applicable_by_hand`: {patch id: reason} a person decided (`--not-applicable`); raises
    `RequiredPatchesDoNotFit` when a required patch would otherwise be marked not applicable (also when no
    version's `when.vllm` admits the release). `paths`: release -> its manifest file (to name it in errors).
    Raises `Unreviewed` for a draft, a placeholder or a stub (`plan_only`: kept in `Pinned.unreviewed`).
    """
    version = release.version()
    if version is None:
        raise ReleaseError(f"cannot tell the version of {release.label}")
    refused = unreviewed.problems(patch_set)
    if refused and not plan_only:
        raise Unreviewed(refused)
    by_hand = dict(not_applicable_by_hand or {})
    known = sorted({p.id for p in patch_set.patches.values()})
    unknown = [pid for pid in by_hand if pid not in known]
    if unknown:
        raise PatchkitError(f"--not-applicable {', '.join(unknown)}: no such patch id in the patch set "
                            f"(known: {', '.join(known) or 'none'})")
    own_key = exact(manifests, version)
    own = manifests.get(own_key) if own_key else None
    kept_na = {n.patch: n for n in (own.not_applicable if own else [])}
    chosen = {PatchKey.parse(e.patch).id: e for e in (own.patches if own else [])}
    entries: list[ManifestEntry] = []
    not_applicable: list[NotApplicable] = []
    notes: list[str] = []
    errors: list[str] = []
    required_broken: list[tuple[str, str, str, list[str]]] = []
    for pid in known:
        if pid in by_hand:
            reason = by_hand[pid] if by_hand[pid].startswith(BY_HAND) else BY_HAND + by_hand[pid]
            not_applicable.append(NotApplicable(patch=pid, reason=reason))
            if pid in chosen:
                notes.append(f"{pid}: was listed at {chosen[pid].patch}; now marked not applicable by hand")
            elif pid in kept_na and kept_na[pid].reason != reason:
                notes.append(f"{pid}: not applicable reason replaced (was: {kept_na[pid].reason})")
            else:
                notes.append(f"{pid}: marked not applicable by hand")
            continue
        if pid in kept_na and kept_na[pid].reason.startswith(BY_HAND):  # a person's decision stays
            not_applicable.append(kept_na[pid])
            continue
        if pid in chosen:  # a reviewer's choice of version: re-pin it from the release
            key = chosen[pid].patch
            patch = patch_set.patches.get(key)
            if patch is None:
                errors.append(f"{key}: listed in the manifest for {own_key}, but the patch set has no such version")
                continue
            if not version_matches(patch.when, version):
                errors.append(_contradiction(patch_set, own_key, own, key, patch, version, paths))
                continue
            found, judged, inherited = examine_settled(release, patch, None, set_on_path(patch_set, key))
            notes.extend(inherited)
            missing = [f"{s}: {m.reason}" for s, m in found.items() if isinstance(m, Missing)]
            missing += [b.explain() for b in judged if b.kind in (BreakageKind.convention_mismatch,
                                                                   BreakageKind.implementation_unimportable,
                                                                   BreakageKind.foreign_replacement)]
            if missing:
                errors.append(f"{key}: listed for vLLM {version} but cannot be pinned: {'; '.join(missing)}")
                continue
            old = dict(chosen[pid].targets)
            for spec, f in found.items():
                if spec in old and old[spec] != f:
                    notes.append(f"{key}: pin of {spec} changed: {dump_fingerprint(old[spec])} -> {dump_fingerprint(f)}")
            entries.append(ManifestEntry(patch=key, targets=found))
            continue
        plan = plan_patch(release, patch_set, manifests, pid, version)
        notes.extend(plan.notes)
        if plan.entry is not None:
            entries.append(plan.entry)
        elif plan.required_broken is not None:
            required_broken.append(plan.required_broken)
        elif plan.not_applicable is not None:
            not_applicable.append(plan.not_applicable)
    entries, unreached = reach_check.with_reach(release, patch_set, entries)  # what each implementation reaches
    errors += unreached
    if errors:
        lines = [f"  - {e}" for e in errors] + RequiredPatchesDoNotFit.blocks(version, required_broken)
        raise PatchkitError("cannot pin:\n" + "\n".join(lines))
    if required_broken:
        raise RequiredPatchesDoNotFit(version, required_broken)
    m = Manifest(vllm=version, generated_by=generated_by, patches=entries, not_applicable=not_applicable)
    return Pinned(m, notes, refused)


def render_plan(pinned: Pinned, label: str) -> str:
    """`--dry-run`: the manifest pin would write, one line per patch, then the notes."""
    m = pinned.manifest
    lines = [f"vllm-patchkit pin --dry-run: vLLM {m.vllm} ({label}); nothing written"]
    lines += [f"  list      {e.patch} ({len(e.targets)} pin(s))" for e in m.patches]
    lines += [f"  n/a       {n.patch}: {n.reason}" for n in m.not_applicable]
    lines += [f"  note: {n}" for n in pinned.notes]
    return "\n".join(lines)


def describe_source(release: Release, source: Optional[str]) -> str:
    version = release.version()
    if isinstance(release, StaticView) and source is None and release.label.startswith("installed"):
        return f"vllm-patchkit pin --vllm {version} (the installed vLLM, read statically)"
    if isinstance(release, StaticView):
        name = Path(release.release.label).name
        how = "read from the wheel" if name.endswith(".whl") else "read from the source tree"
        return f"vllm-patchkit pin --vllm {version} --source {name} (static, {how})"
    return f"vllm-patchkit pin --vllm {version} (from the installed vLLM, by import)"


def cmd_pin(args: argparse.Namespace) -> int:
    from vllm_patchkit.tools import live

    if args.live and not live.in_child():
        return live.run_in_child("pin", args.argv)
    try:
        ps, mdirs = patch_set_and_manifest_dir(args)
        manifests, paths = read_manifests(mdirs, ps, strict=False)
        by_hand = parse_not_applicable(args.not_applicable)
        release = open_release(args.vllm, args.source, live=args.live)
        pinned = pin_release(release, ps, manifests, generated_by=describe_source(release, args.source),
                             not_applicable_by_hand=by_hand, paths=paths, plan_only=args.dry_run)
        if args.dry_run:
            print(render_plan(pinned, release.label))
            if pinned.unreviewed:
                print(printable(f"vllm-patchkit pin: {Unreviewed(pinned.unreviewed)}"), file=sys.stderr)
                return 1
            return 0
        if args.out or args.manifest_dir:
            paths = [write(pinned.manifest, Path(args.out) if args.out else args.manifest_dir)]
        elif args.patch_dir:
            raise PatchkitError("--patch-dir needs --manifest-dir or --out (where to write the manifest)")
        else:
            paths = write_by_set(pinned.manifest, ps, args.sets)
    except (RequiredPatchesDoNotFit, Unreviewed) as exc:
        print(printable(f"vllm-patchkit pin: {exc}"), file=sys.stderr)
        return 1
    except (PatchkitError, DeclarationError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(printable(f"vllm-patchkit pin: {exc}"), file=sys.stderr)
        return 2
    for note in pinned.notes:
        print(printable(f"  {note}"))
    m = pinned.manifest
    print(f"wrote {', '.join(map(str, paths))}: {len(m.patches)} patch(es) listed, {len(m.not_applicable)} "
          f"not applicable (from {release.label}); review the diff before committing")
    return 0


def add_pin(sub) -> None:
    p = sub.add_parser("pin", help="write manifests/vllm-VERSION.yaml from the real release",
                       description="Exit 0: written; 1: a required patch does not fit the release, or a patch is "
                                   "an unreviewed draft, holds a TODO placeholder or a stub that only raises "
                                   "(nothing written); 2: could not pin.")
    add_release_args(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be listed, carried forward or marked not applicable, and why; write nothing "
                        "(same exit codes)")
    p.add_argument("--out", help="folder to write to (default: the manifest folder; created if missing)")
    p.add_argument("--not-applicable", action="append", metavar="ID=REASON",
                   help="record patch ID as not applicable on this release, with REASON written into the manifest "
                        "(as 'by hand: REASON'); repeatable. The only way a required patch that does not fit "
                        "the release is marked not applicable")
    p.set_defaults(func=cmd_pin)


__all__ = ["Pinned", "RequiredPatchesDoNotFit", "Unreviewed", "add_pin", "parse_not_applicable", "pin_release"]

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
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from vllm_patchkit.tools.contracts import (
    Release,
    ReleaseError,
    StaticView,
    add_release_args,
    examine,
    exact,
    older_entry,
    open_release,
    patch_set_and_manifest_dir,
    read_manifests,
)
from vllm_patchkit.upstream.findings import BreakageKind
from vllm_patchkit.tools.check import set_on_path
from vllm_patchkit.declaration.declare import PatchSet
from vllm_patchkit.declaration.errors import DeclarationError, PatchkitError
from vllm_patchkit.declaration.schema import Fingerprint, Kind, Manifest, ManifestEntry, NotApplicable
from vllm_patchkit.declaration.preconditions import version_matches
from vllm_patchkit.upstream.missing import Missing

HEADER = "# yaml-language-server: $schema=../src/vllm_patchkit/json_schema/manifest.schema.json\n"


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


@dataclass
class Pinned:
    manifest: Manifest
    notes: list[str] = field(default_factory=list)  # what changed or needs a human


def _dump_fingerprint(f: Fingerprint) -> dict:
    d = f.model_dump(exclude_none=True)
    if not d.get("wrappers"):
        d.pop("wrappers", None)
    return d


@dataclass
class Plan:
    """What pin does with one patch id on a release, decided before anything is written."""

    entry: Optional[ManifestEntry] = None
    not_applicable: Optional[NotApplicable] = None
    required_broken: Optional[tuple[str, str, str, list[str]]] = None
    notes: list[str] = field(default_factory=list)


def settle_inherited(release: Release, patch, found: dict) -> tuple[dict, list[str]]:
    """Kind subclass: an overridden base method that the base class only inherits on this release is pinned as
    the class that defines it has it (the override overrides it all the same; `super()` binds there). Nothing
    changed, so nothing is refused; a later release is compared with this pin (`compat.judge_all`)."""
    if patch.kind is not Kind.subclass or not patch.target:
        return found, []
    out, notes = dict(found), []
    digests = getattr(patch, "source_pinned_specs", frozenset())
    for name in patch.overrides:
        spec = f"{patch.target}.{name}"
        got = out.get(spec)
        if not (isinstance(got, Missing) and got.inherited_from):
            continue
        there = release.lookup(got.inherited_from, spec in digests or got.inherited_from in digests)
        if isinstance(there, Fingerprint):
            out[spec] = there
            notes.append(f"{patch.key}: {spec} is inherited from {got.inherited_from} on vLLM {release.version()}: "
                         "pinned as defined there")
    return out, notes


def _examine(release: Release, patch, pins, impl_here: bool = True) -> tuple[dict, list, list[str]]:
    """`examine`, with inherited override places pinned where they are defined (`settle_inherited`).
    `impl_here`: the patch's set is installed here (`check.set_on_path`): a missing implementation module
    is then a breaking finding."""
    found, judged = examine(release, patch, pins, impl_here=impl_here)
    found, notes = settle_inherited(release, patch, found)
    return found, judged, notes


def _fits_fresh(release: Release, patch, impl_here: bool = True) -> tuple[dict, list, list[str]]:
    """A version never pinned before: its places must exist and its implementation fit (no pins to diff)."""
    found, breakages, notes = _examine(release, patch, None, impl_here)
    return found, [b for b in breakages if b.breaking], notes


def _what_to_write(pid: str, patch, version: str, broken: list) -> str:
    moved = [b for b in broken if b.kind.value in ("target_moved", "target_inherited")]
    where = f" at {moved[0].new}" if moved else ""
    return (f"write {pid}@{patch.version + 1}{where} with `when: {{vllm: '>={version}'}}` that fits the changes "
            f"above (and give {patch.key} `when: {{vllm: '<{version}'}}`), then re-run pin")


def plan_patch(release: Release, patch_set: PatchSet, manifests: dict[str, Manifest], pid: str,
               version: str) -> Plan:
    """Choose the version of `pid` for `release` and its pins.

    Candidates are the versions whose `when.vllm` admits the release. The version listed by the newest
    older manifest is carried forward when every difference is compatible for it (`compat.judge`); else
    the newest candidate not pinned before is taken when its places exist and its implementation fits;
    else the patch is broken (required: pin fails; optional: not applicable, with the reason)."""
    versions = sorted(patch_set.by_id(pid), key=lambda p: p.version)
    newest = versions[-1]
    candidates = [p for p in versions if version_matches(p.when, version)]
    plan = Plan()
    if not candidates:
        ranges = ", ".join(f"{p.key}: {p.when.vllm}" for p in versions)
        if any(p.required for p in versions):
            # never marked not applicable behind a reviewer's back: the loader would skip it as not needed on
            # this release, and a model that needs it would start without it, silently (issue 21, item 6)
            files = ", ".join(f"{p.key}: {patch_set.files.get(p.key, '?')}" for p in versions)
            plan.required_broken = (pid, newest.key, f"no version's when.vllm admits vLLM {version} ({ranges})", [
                f"{pid} is required and none of its versions is for vLLM {version} ({files}): marked not "
                "applicable, the loader would skip it there as not needed and a model that needs it would start "
                "without it",
                _what_to_write(pid, newest, version, [])])
            return plan
        plan.not_applicable = NotApplicable(patch=pid, reason=f"no version admits vLLM {version} ({ranges})")
        plan.notes.append(f"{pid}: not applicable: no version's when.vllm admits {version} ({ranges})")
        return plan
    required = any(p.required for p in candidates)
    base = older_entry(pid, manifests, version)
    tried: list[tuple[str, list]] = []
    base_patch = patch_set.patches.get(base.entry.patch) if base is not None else None
    if base_patch is not None and base_patch in candidates:
        found, judged, inherited = _examine(release, base_patch, dict(base.entry.targets),
                                            set_on_path(patch_set, base_patch.key))
        broken = [b for b in judged if b.breaking]
        if not broken:
            plan.notes.extend(inherited)
            if judged:
                plan.notes.append(f"{pid}: carried forward at {base_patch.key} from vLLM {base.vllm}: "
                                  f"{len(judged)} compatible change(s): " + "; ".join(
                                      f"{b.explain()} ({b.verdict()})" for b in judged))
            elif base_patch is not candidates[-1]:
                plan.notes.append(f"{pid}: listed at {base_patch.key} as on vLLM {base.vllm}; "
                                  f"{candidates[-1].key} also admits {version}")
            plan.entry = ManifestEntry(patch=base_patch.key, targets=found)
            return plan
        tried.append((f"{base_patch.key} against its pins of vLLM {base.vllm}", broken))
    for patch in reversed(candidates):
        if base_patch is not None and patch.version <= base_patch.version:
            break  # versions no newer than the one pinned before are not chosen behind a reviewer's back
        found, broken, inherited = _fits_fresh(release, patch, set_on_path(patch_set, patch.key))
        if not broken:
            plan.notes.extend(inherited)
            plan.notes.append(f"{pid}: new in this manifest at {patch.key}"
                              + (f" (replaces {base_patch.key} of vLLM {base.vllm})" if base_patch else ""))
            plan.entry = ManifestEntry(patch=patch.key, targets=found)
            return plan
        tried.append((f"{patch.key}, not pinned before", broken))
    if base_patch is not None and base_patch not in candidates and not tried:
        tried.append((f"{base_patch.key}: its when.vllm {base_patch.when.vllm!r} excludes {version}", []))
    against = "; ".join(t for t, _ in tried)
    why = [f"{b.explain()} ({b.verdict()})" for _, broken in tried for b in broken]
    last = base_patch if base_patch is not None else newest
    why.append(_what_to_write(pid, max(versions, key=lambda p: p.version), version, [b for _, bs in tried for b in bs]))
    if required:
        plan.required_broken = (pid, last.key, against, why)
        return plan
    reason = "; ".join(why[:-1]) or against
    plan.not_applicable = NotApplicable(patch=pid, reason=f"on vLLM {version}, {against}: {reason}")
    plan.notes.append(f"{pid}: not applicable on {version}: {reason}")
    return plan


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
                paths: Optional[dict[str, str]] = None) -> Pinned:
    """The manifest for `release` (see the module docstring for what is kept and decided).

    `not_applicable_by_hand`: {patch id: reason} a person decided (`--not-applicable`); raises
    `RequiredPatchesDoNotFit` when a required patch would otherwise be marked not applicable (also when no
    version's `when.vllm` admits the release). `paths`: release -> its manifest file (to name it in errors).
    """
    version = release.version()
    if version is None:
        raise ReleaseError(f"cannot tell the version of {release.label}")
    by_hand = dict(not_applicable_by_hand or {})
    known = sorted({p.id for p in patch_set.patches.values()})
    unknown = [pid for pid in by_hand if pid not in known]
    if unknown:
        raise PatchkitError(f"--not-applicable {', '.join(unknown)}: no such patch id in the patch set "
                            f"(known: {', '.join(known) or 'none'})")
    own_key = exact(manifests, version)
    own = manifests.get(own_key) if own_key else None
    kept_na = {n.patch: n for n in (own.not_applicable if own else [])}
    chosen = {e.patch.split("@")[0]: e for e in (own.patches if own else [])}
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
            found, judged, inherited = _examine(release, patch, None, set_on_path(patch_set, key))
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
                    notes.append(f"{key}: pin of {spec} changed: {_dump_fingerprint(old[spec])} -> {_dump_fingerprint(f)}")
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
    if errors:
        lines = [f"  - {e}" for e in errors] + RequiredPatchesDoNotFit.blocks(version, required_broken)
        raise PatchkitError("cannot pin:\n" + "\n".join(lines))
    if required_broken:
        raise RequiredPatchesDoNotFit(version, required_broken)
    m = Manifest(vllm=version, generated_by=generated_by, patches=entries, not_applicable=not_applicable)
    return Pinned(m, notes)


def render(m: Manifest) -> str:
    doc: dict = {"vllm": m.vllm, "generated_by": m.generated_by, "patches": [
        {"patch": e.patch, "targets": {s: _dump_fingerprint(f) for s, f in e.targets.items()}} for e in m.patches]}
    if m.not_applicable:
        doc["not_applicable"] = [{"patch": n.patch, "reason": n.reason} for n in m.not_applicable]
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def write(m: Manifest, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"vllm-{m.vllm}.yaml"
    schema = Path(__file__).resolve().parents[1] / "json_schema" / "manifest.schema.json"
    text = render(m).replace(HEADER, f"# yaml-language-server: $schema={os.path.relpath(schema, out_dir.resolve())}\n", 1)
    path.write_text(text, encoding="utf-8")
    return path


def split_by_set(m: Manifest, patch_set: PatchSet) -> dict[Optional[str], Manifest]:
    """One manifest per patch set: each set pins its own patches in its own folder."""
    out: dict[Optional[str], Manifest] = {}
    for name in {patch_set.set_of.get(k) for k in patch_set.patches}:
        mine = {k for k in patch_set.patches if patch_set.set_of.get(k) == name}
        ids = {k.split("@")[0] for k in mine}
        out[name] = m.model_copy(update={"patches": [e for e in m.patches if e.patch in mine],
                                         "not_applicable": [n for n in m.not_applicable if n.patch in ids]})
    return out


def write_by_set(m: Manifest, patch_set: PatchSet, sets: Optional[list[str]]) -> list[Path]:
    from vllm_patchkit.declaration.patchsets import discover

    folders = {s.name: s.manifests for s in discover(sets)}
    paths = []
    for name, part in sorted(split_by_set(m, patch_set).items(), key=lambda kv: str(kv[0])):
        folder = folders.get(name)
        if folder is None:
            raise PatchkitError(f"patch set {name!r} has no manifests folder to write to (give --out)")
        paths.append(write(part, folder))
    return paths


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
                             not_applicable_by_hand=by_hand, paths=paths)
        if args.dry_run:
            print(render_plan(pinned, release.label))
            return 0
        if args.out or args.manifest_dir:
            paths = [write(pinned.manifest, Path(args.out) if args.out else args.manifest_dir)]
        elif args.patch_dir:
            raise PatchkitError("--patch-dir needs --manifest-dir or --out (where to write the manifest)")
        else:
            paths = write_by_set(pinned.manifest, ps, args.sets)
    except RequiredPatchesDoNotFit as exc:
        print(f"vllm-patchkit pin: {exc}", file=sys.stderr)
        return 1
    except (PatchkitError, DeclarationError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(f"vllm-patchkit pin: {exc}", file=sys.stderr)
        return 2
    for note in pinned.notes:
        print(f"  {note}")
    m = pinned.manifest
    print(f"wrote {', '.join(map(str, paths))}: {len(m.patches)} patch(es) listed, {len(m.not_applicable)} "
          f"not applicable (from {release.label}); review the diff before committing")
    return 0


def add_pin(sub) -> None:
    p = sub.add_parser("pin", help="write manifests/vllm-VERSION.yaml from the real release",
                       description="Exit 0: written; 1: a required patch does not fit the release (nothing written); "
                                   "2: could not pin.")
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


__all__ = ["Pinned", "RequiredPatchesDoNotFit", "add_pin", "parse_not_applicable", "pin_release", "render", "write"]

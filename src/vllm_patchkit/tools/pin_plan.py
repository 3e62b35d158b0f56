"""Plan one patch that the release's manifest does not list: which of its versions pin lists, carried forward
or new, and with what pins; or why none fits (not applicable, or a required patch that pin refuses).

Each version is examined on the release (`examine.py`), with the override places a subclass patch inherits
on this release pinned where they are defined (`settle_inherited`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.preconditions import version_matches
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.pins import Fingerprint, Manifest, ManifestEntry, NotApplicable
from vllm_patchkit.tools.baseline import older_entry
from vllm_patchkit.tools.examine import examine, set_on_path
from vllm_patchkit.tools.releases import Release
from vllm_patchkit.upstream.missing import Missing


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
    if not traits(patch).judges_overrides or not patch.target:
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


def examine_settled(release: Release, patch, pins, impl_here: bool = True) -> tuple[dict, list, list[str]]:
    """`examine`, with inherited override places pinned where they are defined (`settle_inherited`).
    `impl_here`: the patch's set is installed here (`examine.set_on_path`): a missing implementation module
    is then a breaking finding."""
    found, judged = examine(release, patch, pins, impl_here=impl_here)
    found, notes = settle_inherited(release, patch, found)
    return found, judged, notes


def _fits_fresh(release: Release, patch, impl_here: bool = True) -> tuple[dict, list, list[str]]:
    """A version never pinned before: its places must exist and its implementation fit (no pins to diff)."""
    found, breakages, notes = examine_settled(release, patch, None, impl_here)
    return found, [b for b in breakages if b.breaking], notes


def _what_to_write(pid: str, patch, version: str, broken: list) -> str:
    moved = [b for b in broken if b.kind.value in ("target_moved", "target_inherited")]
    where = f" at {moved[0].new}" if moved else ""
    return (f"write {pid}@{patch.version + 1}{where} with `when: {{vllm: '>={version}'}}` that fits the changes "
            f"above (and give {patch.key} `when: {{vllm: '<{version}'}}`), then re-run pin")


def _never_na(patch) -> bool:
    """Pin never marks it not applicable on its own: a required patch, or a draft (unreviewed: its `required`
    is the scan's guess); only `--not-applicable ID=reason` does."""
    return patch.required or patch.draft


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
        if any(_never_na(p) for p in versions):
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
    required = any(_never_na(p) for p in versions)  # as above: any version's word, not only the admitted ones
    base = older_entry(pid, manifests, version)
    tried: list[tuple[str, list]] = []
    base_patch = patch_set.patches.get(base.entry.patch) if base is not None else None
    if base_patch is not None and base_patch in candidates:
        found, judged, inherited = examine_settled(release, base_patch, dict(base.entry.targets),
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

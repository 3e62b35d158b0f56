"""Several releases at once: `check` over a list, a range or every known release, as one table patch × release,
the exit code of the worst release, and the requirement line of the releases the set supports.

`--vllm` selects them: `0.31.0,0.33.0` (those, each opened as a single `check --vllm X` opens it), a PEP 440
range (`>=0.31,<0.35`: every known release inside it, pre-releases and dev builds included) or `all`. A known
release is one with a manifest, a wheel in the wheel cache (`releases.wheel_cache()`), or the installed one.
Every release is judged by `check.check` exactly as alone; a cell is that patch's `PatchResult`.

A release is supported when every required patch is ok, compatible (against an older release's pins: ship it
after `vllm-patchkit pin` writes its manifest, said in the notes) or not applicable there, with no breaking
finding. Optional patches never narrow the line (their breakages still count in the exit code); a required
patch that is broken, stale, unpinned, or not applicable by a tool's mark the loader refuses, does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.pins import Manifest
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools.baseline import exact
from vllm_patchkit.tools.releases import Release, ReleaseError, cached_versions, open_release
from vllm_patchkit.tools.report import PatchResult, Report
from vllm_patchkit.tools.requirement import Requirement, requirement
from vllm_patchkit.upstream.installed import installed_root, installed_version

FITS = ("ok", "compatible", "not_applicable")  # a required patch's statuses a supported release may have
_OPERATORS = "<>=!~"


def is_selection(arg: Optional[str]) -> bool:
    """Whether `--vllm` names several releases (a list, a range, `all`) rather than one."""
    return arg is not None and (arg.strip() == "all" or "," in arg or any(c in arg for c in _OPERATORS))


def known_releases(manifests: dict[str, Manifest]) -> list[str]:
    """Every release `check` can be asked about here: each manifest's, each cached wheel's, the installed one."""
    found: dict[Version, str] = {}
    installed = [installed_version()] if installed_root() is not None and installed_version() else []
    for v in [*manifests, *cached_versions(), *installed]:
        found.setdefault(Version(v), v)
    return [found[v] for v in sorted(found)]


def select(arg: str, known: list[str]) -> list[str]:
    """The releases `--vllm ARG` names, oldest first; an empty selection is an error naming what is known."""
    arg = arg.strip()
    if arg == "all":
        chosen = list(known)
    elif any(c in arg for c in _OPERATORS):
        try:
            spec = SpecifierSet(arg)
        except InvalidSpecifier:
            raise ValueError(f"--vllm {arg!r}: not a PEP 440 range (e.g. '>=0.31,<0.35'), a comma-separated list "
                             "of versions, or 'all'") from None
        chosen = [v for v in known if spec.contains(Version(v), prereleases=True)]
    else:
        chosen = []
        for part in (p.strip() for p in arg.split(",")):
            try:
                Version(part)
            except InvalidVersion:
                raise ValueError(f"--vllm {arg!r}: {part!r} is not a release version") from None
            part = next((k for k in known if Version(k) == Version(part)), part)  # 0.31 is the known 0.31.0
            if all(Version(part) != Version(c) for c in chosen):
                chosen.append(part)
        chosen.sort(key=Version)
    if not chosen:
        raise ReleaseError(f"--vllm {arg!r} selects no known release (known: {', '.join(known) or 'none'}: each "
                           "manifest's, each wheel's in the wheel cache, the installed one)")
    return chosen


@dataclass
class Row:
    """One patch id across the releases: each release's result (a release that has none: absent)."""

    patch: str
    required: bool
    cells: dict[str, PatchResult] = field(default_factory=dict)


@dataclass
class Matrix:
    releases: list[str]
    reports: dict[str, Report]
    patch_set: PatchSet
    manifests: dict[str, Manifest]

    def _patch(self, result: PatchResult) -> Optional[Patch]:
        found = self.patch_set.patches.get(result.patch)
        if found is None:
            versions = self.patch_set.by_id(PatchKey.parse(result.patch).id)
            found = max(versions, key=lambda p: p.version) if versions else None
        return found

    def rows(self) -> list[Row]:
        rows: dict[str, Row] = {}
        for rel in self.releases:
            for res in self.reports[rel].results:
                pid = PatchKey.parse(res.patch).id
                patch = self._patch(res)
                row = rows.setdefault(pid, Row(pid, False))
                row.required = row.required or bool(patch is not None and patch.required)
                row.cells[rel] = res
        return [rows[k] for k in sorted(rows)]

    def blockers(self, release: str) -> list[str]:
        """Why the release is not supported: each required patch that does not fit there (empty: supported)."""
        out = []
        for res in self.reports[release].results:
            patch = self._patch(res)
            if patch is None:  # cannot tell whether it is required: never read as supported
                out.append(f"{res.patch} is not in the patch set")
                continue
            if not patch.required:
                continue
            if res.status not in FITS:
                out.append(f"{res.patch} {res.status}")
            elif any(b.breaking for b in res.breakages):
                out.append(f"{res.patch} {res.status} but refused ({res.breakages[0].kind.value})")
        return out

    def supported(self) -> list[str]:
        return [r for r in self.releases if not self.blockers(r)]

    def requirement(self) -> Requirement:
        return requirement(self.releases, self.supported())

    def notes(self) -> list[str]:
        """What a supported release still needs, and what an optional patch lacks there."""
        out = []
        for rel in self.supported():
            if exact(self.manifests, rel) is None:
                out.append(f"{rel} has no manifest of its own (judged against older pins): run `vllm-patchkit pin "
                           f"--vllm {rel}` and ship the manifest with the line: without it the loader treats {rel} "
                           "as a release nobody pinned (VLLM_PATCHKIT_ON_UNKNOWN_VLLM, docs/troubleshooting.md)")
            optional = [r.patch for r in self.reports[rel].results
                        if r.status not in FITS and not getattr(self._patch(r), "required", True)]
            if optional:
                out.append(f"{rel} supported without optional {', '.join(optional)}")
        return out

    def exit_code(self) -> int:
        """The worst release's exit code (0: every release fits; 1: a breakage on one)."""
        return max(r.exit_code() for r in self.reports.values())


def run(selection: str, patch_set: PatchSet, manifests: dict[str, Manifest],
        judge: Callable[[Release], Report]) -> Matrix:
    """Open every selected release first (one error naming each that cannot be read), then judge each
    (`judge`: `check.check` with the set, its manifests and the command's options)."""
    releases = select(selection, known_releases(manifests))
    opened, failed = {}, []
    for rel in releases:
        try:
            opened[rel] = open_release(rel)
        except ReleaseError as exc:
            failed.append(f"{rel}: {exc}")
    if failed:
        raise ReleaseError("cannot read every selected release:\n  " + "\n  ".join(failed))
    reports = {rel: judge(opened[rel]) for rel in releases}
    return Matrix(releases, reports, patch_set, manifests)

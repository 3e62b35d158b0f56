"""The baseline: which manifest's pins a patch is compared with, and the release they were read from.

`check` compares a patch with the entry of the release's own manifest, of the newest older manifest that
lists it, or of the manifest named by `--baseline` (`exact`, `older_entry`); `pin` carries forward the
newest older entry. The release the pins were read from is opened (statically, once per process) to show,
for a copied body that changed, the diff from that release to this one (`with_source_diffs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from packaging.version import Version

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.tools.releases import Release, ReleaseError, open_release
from vllm_patchkit.declaration.pins import Manifest, ManifestEntry
from vllm_patchkit.upstream.sourcediff import body_diff


@dataclass(frozen=True)
class Baseline:
    """The pins a patch is compared with: one manifest entry, and the release it was pinned from."""

    vllm: str
    entry: ManifestEntry
    path: str = ""


def older_entry(patch_id: str, manifests: dict[str, Manifest], version: str,
                paths: Optional[dict[str, str]] = None) -> Optional[Baseline]:
    """The entry of the newest manifest older than `version` that lists the patch."""
    for v in sorted((v for v in manifests if Version(v) < Version(version)), key=Version, reverse=True):
        for e in manifests[v].patches:
            if PatchKey.parse(e.patch).id == patch_id:
                return Baseline(v, e, (paths or {}).get(v, ""))
    return None


def exact(manifests: dict[str, Any], version: str) -> Optional[str]:
    """The release's own manifest key: `version`, or its base version (a dev or post release)."""
    want = Version(version)
    return next((v for v in manifests if Version(v) == want or Version(v) == Version(want.base_version)), None)


_OPENED: dict[str, tuple[Optional[Release], str]] = {}


def pinned_release(release: Release, version: str) -> tuple[Optional[Release], str]:
    """The release pins were read from, read statically (installed, or its wheel in the cache), or None and
    why not; opened once per process."""
    if _same(release, version):
        return None, f"vLLM {version} is the release checked (its installed source differs from the pin)"
    if version not in _OPENED:
        try:
            _OPENED[version] = (open_release(version), "")
        except ReleaseError as exc:
            _OPENED[version] = (None, f"the source of vLLM {version} is not at hand ({exc})")
    return _OPENED[version]


def with_source_diffs(release: Release, pinned_on: str, breakages: list[Breakage]) -> list[Breakage]:
    """Each `source_changed` with the unified diff of the copied body, from the release it was pinned on to
    this one. When the pinned release's source is not at hand the finding says so instead of a diff."""
    if not any(b.kind is BreakageKind.source_changed for b in breakages):
        return breakages
    old, why = pinned_release(release, pinned_on)
    why = f"no diff: {why}"
    out = []
    for b in breakages:
        if b.kind is BreakageKind.source_changed:
            was = old.definition(b.target) if old is not None else None
            now = release.definition(b.target)
            if was is not None and now is not None:
                text = body_diff(was, now, f"{b.target} (vLLM {pinned_on})", f"{b.target} (vLLM {release.version()})",
                                 limit=None)  # whole: JSON carries it all, the text renderers cut it
                b = b._replace(diff=text or "the normalised bodies read the same; the digest rule differs")
            else:
                b = b._replace(diff=why if old is None else f"no diff: {b.target} not readable in both releases")
        out.append(b)
    return out


def _same(release: Release, version: str) -> bool:
    try:
        return Version(release.version() or "0") == Version(version)
    except Exception:
        return False

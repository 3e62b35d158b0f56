"""Contradictions between a manifest and the patches it lists: one rule for `check`, `pin` and the loader.

A manifest pins one vLLM release. An entry listing a **required** patch whose own `when.vllm` excludes that
release says two things at once: "apply it on X" (the manifest) and "it is not for X" (the patch). The loader
judges `when` first (is it needed here?), so it skips the patch as a precondition, without a warning, and a
model that needs it serves without it while `check` said ok (issue 21, item 6). It is an error wherever it is
read: the loader's manifest validation (start-up stops, `PatchSetErrors`), `check` (a breaking
`when_excludes` finding) and `pin` (nothing written), each naming both places: the manifest file and its entry,
the patch file and its `when.vllm`.

An optional patch listed so is left alone here (the loader skips it as not needed; `pin` refuses to re-pin such
an entry in its own words).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from vllm_patchkit.declaration.names import PatchKey


@dataclass(frozen=True)
class Contradiction:
    release: str  # the manifest's `vllm`
    manifest_file: str
    index: Optional[int]  # the entry's index in that file's `patches` (None: another file merged with it)
    key: str  # id@version listed
    patch_file: str
    when_vllm: str

    @property
    def field(self) -> str:
        if self.index is None:  # in another set's manifest for the release, merged with this one (not found)
            return f"an entry of a manifest for vLLM {self.release} merged with this one (patch: {self.key})"
        return f"patches[{self.index}] (patch: {self.key})"

    def problem(self) -> str:
        return (f"lists required patch {self.key}, whose own when.vllm {self.when_vllm!r} ({self.patch_file}) "
                f"excludes vLLM {self.release}: the loader would judge it not needed on this release and skip it, "
                f"so a model that needs it would start without it; list a version of {PatchKey.parse(self.key).id} "
                f"whose when.vllm admits {self.release} (`vllm-patchkit pin --vllm {self.release}` chooses one), "
                f"or correct {self.key}'s when.vllm")

    def explain(self) -> str:
        return f"{self.manifest_file}: {self.field}: {self.problem()}"

    def as_error(self):
        from vllm_patchkit.declaration.errors import DeclarationError

        return DeclarationError(self.manifest_file, self.field, self.problem())


def _excluded(patch, release: str) -> bool:
    from vllm_patchkit.declaration.preconditions import version_matches

    try:
        return patch.required and not version_matches(patch.when, release)
    except Exception:  # an unparsable release string: not this rule's business
        return False


def _entries_of(path: str) -> Optional[tuple[str, list[str]]]:
    """(release, the patch keys listed, in order) of one manifest file, read as plain YAML."""
    from vllm_patchkit.declaration.yaml_files import read_yaml  # bounded, like every declaration read

    try:
        data = read_yaml(Path(path))
        return str(data["vllm"]), [str(e.get("patch")) for e in data.get("patches") or []]
    except Exception:
        return None


def _locate(key: str, release: str, first: str, folders: Iterable[Path]) -> tuple[str, Optional[int]]:
    """The manifest file (and the entry's index in it) listing `key` for `release`: a release's manifests
    are merged across the sets' folders, so the merged index is not the file's."""
    candidates = [first] + [str(p) for d in folders for p in sorted(Path(d).glob("*.yaml")) if str(p) != first]
    for path in candidates:
        read = _entries_of(path)
        if read is None:
            continue
        version, keys = read
        if version == release and key in keys:
            return path, keys.index(key)
    return first, None


def find(patch_set, manifests: dict, paths: Optional[dict[str, str]] = None,
         folders: Optional[Iterable[Path]] = None) -> list[Contradiction]:
    """Every entry of `manifests` (release -> `Manifest` or `manifest.Loaded`) listing a required patch whose
    `when.vllm` excludes the release. `paths`: release -> the (first) manifest file; `folders`: other manifest
    folders to look in for the file that really holds an entry (sets merge their manifests)."""
    out = []
    folders = list(folders or [])
    for release, m in manifests.items():
        first = getattr(m, "path", None) or (paths or {}).get(release) or f"the manifest for vLLM {release}"
        m = getattr(m, "manifest", m)
        for i, entry in enumerate(m.patches):
            patch = patch_set.patches.get(entry.patch)
            if patch is None or not _excluded(patch, release):
                continue
            file, index = _locate(entry.patch, release, first, folders) if Path(first).is_file() else (first, i)
            out.append(Contradiction(release, file, index, entry.patch,
                                     patch_set.files.get(entry.patch, "?"), str(patch.when.vllm)))
    return out


def discovered_folders() -> list[Path]:
    """The manifest folders of every installed patch set (where a merged entry may come from)."""
    try:
        from vllm_patchkit.declaration.declare import manifest_dirs
        from vllm_patchkit.declaration.patchsets import discover

        return manifest_dirs(discover(None))
    except Exception:
        return []


__all__ = ["Contradiction", "discovered_folders", "find"]

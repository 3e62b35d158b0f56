"""Manifests: pick the one for the installed vLLM, and check it against the patch set."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple, Optional

import msgspec
from packaging.version import InvalidVersion, Version

from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.declaration.pins import Manifest

log = logging.getLogger("vllm.patchkit")

POLICY_ENV = "VLLM_PATCHKIT_ON_UNKNOWN_VLLM"
POLICIES = ("nearest", "skip", "error")
DEFAULT_POLICY = "nearest"  # why it is as safe as an exact pin: docs/troubleshooting.md, "A release no manifest pins"


class Loaded(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    manifest: Manifest
    path: str


def _check_entries(m: Manifest, path: str, patch_set: PatchSet, errors: list,
                   listed: dict[str, str], marked: dict[str, str]) -> None:
    """The entries of one manifest file, each named by its index in that file.

    `listed` and `marked` (patch id -> "file patches[i]" / "file not_applicable[i]") are shared by every file
    pinning the same release, so a patch listed by two sets' files is reported with both places."""
    for i, entry in enumerate(m.patches):
        patch = patch_set.patches.get(entry.patch)
        pid = PatchKey.parse(entry.patch).id
        where = f"patches[{i}]"
        if patch is None:
            errors.append(DeclarationError(path, f"{where}.patch", f"no patch {entry.patch} in the patch set"))
            continue
        if pid in listed:
            errors.append(DeclarationError(path, f"{where}.patch", f"patch {pid} listed twice (also at {listed[pid]})"))
        else:
            listed[pid] = f"{path} {where}"
        wanted = patch.pinned_specs
        for spec in wanted:
            if spec not in entry.targets:
                errors.append(DeclarationError(path, f"{where}.targets", f"no pin for {spec} (pin it: `vllm-patchkit pin --vllm {m.vllm}`, review, commit)"))
        for spec in entry.targets:
            if spec not in wanted:
                errors.append(DeclarationError(path, f"{where}.targets.{spec}", f"not a target or copy of {entry.patch}"))
    known = {p.id for p in patch_set.patches.values()}
    for i, na in enumerate(m.not_applicable):
        where = f"not_applicable[{i}].patch"
        if na.patch not in known:
            errors.append(DeclarationError(path, where, f"no patch {na.patch} in the patch set"))
        elif na.patch in marked:
            errors.append(DeclarationError(path, where, f"patch {na.patch} marked not applicable twice "
                                                        f"(also at {marked[na.patch]})"))
        else:
            marked[na.patch] = f"{path} not_applicable[{i}]"


def _check_marked_not_listed(listed: dict[str, str], marked: dict[str, str], errors: list) -> None:
    """A patch both applying and marked not applicable for one release (in one file or in two sets' files)."""
    for pid, place in marked.items():
        if pid in listed:
            path, _, where = place.rpartition(" ")
            errors.append(DeclarationError(path, f"{where}.patch", f"patch {pid} is also listed under patches "
                                                                   f"(as applying, at {listed[pid]})"))


def load_manifests(directories: list[Path] | Path, patch_set: PatchSet) -> dict[str, Loaded]:
    """Every manifest in the folders, checked: known patch versions, every target and copy pinned.

    The first folder is the main one; a later folder's manifest for the same
    release adds its entries (a plugin pinning its own patches). Every error names
    the file and the entry's index within that file (never an index into the merged list).
    """
    # reading files (YAML) is the cold path: a process served from the start-up cache never imports it
    from vllm_patchkit.declaration.declare import _collect, parse_manifest

    if isinstance(directories, (str, Path)):
        directories = [Path(directories)]
    errors: list[DeclarationError] = []
    out: dict[str, Loaded] = {}
    seen: dict[str, tuple[dict[str, str], dict[str, str]]] = {}  # release -> (listed, marked), across its files
    for n, directory in enumerate(directories):
        for path in sorted(Path(directory).glob("*.yaml")):
            m = _collect(errors, parse_manifest, path)
            if m is None:
                continue
            if m.vllm in out and n == 0:
                errors.append(DeclarationError(str(path), "vllm", f"release {m.vllm} already pinned by {out[m.vllm].path}"))
                continue
            listed, marked = seen.setdefault(m.vllm, ({}, {}))
            _check_entries(m, str(path), patch_set, errors, listed, marked)
            if m.vllm in out:
                base = out[m.vllm].manifest
                m = msgspec.structs.replace(base, patches=[*base.patches, *m.patches],
                                            not_applicable=[*base.not_applicable, *m.not_applicable])
            out[m.vllm] = Loaded(m, out[m.vllm].path if m.vllm in out else str(path))
    for listed, marked in seen.values():
        _check_marked_not_listed(listed, marked, errors)
    if errors:
        raise PatchSetErrors(errors)
    return out


def _pep440(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def exact_release(pinned: str, running: str) -> bool:
    """A manifest pins this very vLLM: the same public version (a local label such as `+cpu` or `+cu129` names a
    build of the same source). A post release, a dev build or a release candidate is another release."""
    try:
        return Version(Version(pinned).public) == Version(Version(running).public)
    except InvalidVersion:
        return pinned == running


def nearest_release(releases, running: str) -> Optional[str]:
    """The pinned release whose pins a vLLM no manifest pins is judged against: the newest one at or below the
    running version's release segment (PEP 440 ordering of epoch and release; pre, post, dev and local dropped):
    0.31.1 -> 0.31.0, 0.31.0.post1 -> 0.31.0, 0.34.1.dev12+g... -> 0.34.1 if pinned, else 0.34.0. None when the
    running version is older than every pinned release, or is no PEP 440 version."""
    try:
        base = Version(Version(running).base_version)
    except InvalidVersion:
        return None
    older = [v for v in releases if Version(Version(v).base_version) <= base]
    return max(older, key=Version, default=None)


def nearest_of(loaded: Optional[Loaded], running: str) -> Optional[str]:
    """The release whose pins stand in for this one's (None: an exact pin, or no manifest at all)."""
    if loaded is None or exact_release(loaded.manifest.vllm, running):
        return None
    return loaded.manifest.vllm


def select(manifests: dict[str, Loaded], vllm_version: str, policy: Optional[str] = None) -> tuple[Optional[Loaded], str]:
    """The manifest for this release, per policy when none pins it exactly. Returns (manifest, note)."""
    policy = policy or os.environ.get(POLICY_ENV) or DEFAULT_POLICY
    if policy not in POLICIES:
        raise DeclarationError(POLICY_ENV, "value", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
    for ver, loaded in manifests.items():
        if exact_release(ver, vllm_version):
            return loaded, f"manifest {Path(loaded.path).name}"
    known = ", ".join(sorted(manifests, key=Version)) or "none"
    if policy == "error":
        raise DeclarationError(POLICY_ENV, "error", f"no manifest pins vLLM {vllm_version} (known: {known})")
    older = nearest_release(manifests, vllm_version) if policy == "nearest" else None
    if older is not None:
        best = manifests[older]
        note = (f"no manifest pins vLLM {vllm_version} (known: {known}); each needed patch is judged against the pins "
                f"of {older} ({Path(best.path).name}), the nearest pinned release at or below it ({POLICY_ENV}="
                f"nearest): it applies only where every live fingerprint it depends on equals that pin, and its "
                f"record says \"verified against the pins of {older} on {vllm_version}\"")
        log.warning("vllm-patchkit: %s", note)
        return best, note
    why = ""
    if policy == "nearest" and manifests:
        why = (" and it is older than every pinned release" if _pep440(vllm_version) else
               " and it is no PEP 440 version, so no pinned release is nearest")
    note = (f"no manifest pins vLLM {vllm_version} (known: {known}){why}; patches a model does not need are "
            f"skipped, a required patch it needs refuses start-up ({POLICY_ENV}={policy})")
    log.warning("vllm-patchkit: %s", note)
    return None, note

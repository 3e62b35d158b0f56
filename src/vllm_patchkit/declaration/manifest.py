"""Manifests: pick the one for the installed vLLM, and check it against the patch set."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple, Optional

import msgspec
from packaging.version import Version

from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.pins import Manifest

log = logging.getLogger("vllm.patchkit")

POLICY_ENV = "VLLM_PATCHKIT_ON_UNKNOWN_VLLM"
POLICIES = ("skip", "nearest", "error")


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
        pid = entry.patch.split("@")[0]
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


def select(manifests: dict[str, Loaded], vllm_version: str, policy: Optional[str] = None) -> tuple[Optional[Loaded], str]:
    """The manifest for this release, per policy when none pins it exactly. Returns (manifest, note)."""
    policy = policy or os.environ.get(POLICY_ENV, "skip")
    if policy not in POLICIES:
        raise DeclarationError(POLICY_ENV, "value", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
    installed = Version(vllm_version)
    for ver, loaded in manifests.items():
        if Version(ver) == installed or Version(ver) == Version(installed.base_version):
            return loaded, f"manifest {Path(loaded.path).name}"
    known = ", ".join(sorted(manifests, key=Version)) or "none"
    if policy == "error":
        raise DeclarationError(POLICY_ENV, "error", f"no manifest pins vLLM {vllm_version} (known: {known})")
    if policy == "nearest":
        older = [v for v in manifests if Version(v) < installed]
        if older:
            best = manifests[max(older, key=Version)]
            note = f"no manifest for vLLM {vllm_version}; using nearest older {Path(best.path).name} ({POLICY_ENV}=nearest), fingerprints verified live"
            log.warning("vllm-patchkit: %s", note)
            return best, note
    note = (f"no manifest pins vLLM {vllm_version} (known: {known}); patches a model does not need are skipped, "
            f"a required patch it needs refuses start-up ({POLICY_ENV}={policy})")
    log.warning("vllm-patchkit: %s", note)
    return None, note

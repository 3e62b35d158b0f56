"""Helpers of the contract tests. Synthetic releases: small source trees written to tmp_path.

A "release" here is a folder holding one top-level package (`toy`), read
statically exactly as a vLLM wheel or source tree is; a patch set is a folder of
patch YAMLs targeting it, and manifests are pinned from the "before" tree.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

import pytest
import yaml

from vllm_patchkit.tools.check import check
from vllm_patchkit.tools.releases import WHEEL_CACHE_ENV, StaticView, cached_wheel, wheel_cache
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.tools.manifest_files import write
from vllm_patchkit.tools.pin import pin_release
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.static_source import open_source

def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write {relative path: source} under root; every folder on the way gets an __init__.py."""
    for rel, src in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src), encoding="utf-8")
        folder = path.parent
        while folder != root:
            (folder / "__init__.py").touch(exist_ok=True)
            folder = folder.parent
    return root


def patch_doc(pid: str, target: Optional[str], *, kind: str = "wrap", version: int = 1, copies=(),
              retire_when: Optional[dict] = None, **extra) -> dict:
    doc = {
        "id": pid, "version": version, "summary": f"test patch {pid}", "why": "a test", "upstream": "none: test",
        "retire_when": retire_when or {"manual": "never"}, "kind": kind, "processes": ["engine_core"],
        "required": False,
    }
    if target is not None:
        doc["target"] = target
    if copies:
        doc["copies"] = list(copies)
    if kind == "replace":
        doc.setdefault("implementation", "toy_impl:replacement")
    if kind == "refuse":
        doc.setdefault("message", "no")
    doc.update(extra)
    return doc


def write_patches(folder: Path, docs: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for d in docs:
        (folder / f"{d['id']}-{d['version']}.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return folder


def release(root: Path, version: str) -> StaticView:
    return StaticView(StaticRelease(open_source(root), version))


class Scenario:
    """A patch set pinned on a "before" tree (1.0.0), checked against an "after" tree (2.0.0)."""

    def __init__(self, base: Path, before: dict[str, str], after: dict[str, str], patches: list[dict]):
        self.before = write_tree(base / "before", before)
        self.after = write_tree(base / "after", after)
        self.patch_dir = write_patches(base / "patches", patches)
        self.manifest_dir = base / "manifests"
        self.manifest_dir.mkdir()
        self.patch_set = load_patch_set([self.patch_dir])
        self.pinned = pin_release(release(self.before, "1.0.0"), self.patch_set, {}, generated_by="test")
        write(self.pinned.manifest, self.manifest_dir)

    def check(self, version: str = "2.0.0"):
        return check(release(self.after, version), self.patch_set, {"1.0.0": self.pinned.manifest})

    def cli(self, *extra: str) -> list[str]:
        return ["--source", str(self.after), "--vllm", "2.0.0", "--patch-dir", str(self.patch_dir),
                "--manifest-dir", str(self.manifest_dir), *extra]


def cached_wheel_or_skip(version: str) -> Path:
    wheel = cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no vLLM {version} wheel in {wheel_cache()} (${WHEEL_CACHE_ENV}; scripts/fetch_wheels.sh fetches it)")
    return wheel

"""Manifest files on disk: read (merged across the patch sets' folders) and written (one file per set, with the
schema header an editor validates against)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import msgspec
import yaml

from vllm_patchkit.declaration.declare import parse_manifest
from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import PatchkitError
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.pins import Fingerprint, Manifest

HEADER = "# yaml-language-server: $schema=../src/vllm_patchkit/json_schema/manifest.schema.json\n"


def read_manifests(directories, patch_set: PatchSet, *, strict: bool = True) -> tuple[dict[str, Manifest], dict[str, str]]:
    """Manifests by release, merged across the sets' folders. Strict: through `manifest.load_manifests`
    (every pin present and known); otherwise only parsed (pin reads what it is about to replace)."""
    dirs = [Path(directories)] if isinstance(directories, (str, Path)) else [Path(d) for d in directories]
    if strict:
        loaded = load_manifests(dirs, patch_set)
        return {v: l.manifest for v, l in loaded.items()}, {v: l.path for v, l in loaded.items()}
    out, paths = {}, {}
    for d in dirs:
        for path in sorted(d.glob("*.yaml")):
            m = parse_manifest(path)
            if m.vllm in out:
                base = out[m.vllm]
                m = msgspec.structs.replace(base, patches=[*base.patches, *m.patches],
                                            not_applicable=[*base.not_applicable, *m.not_applicable])
            else:
                paths[m.vllm] = str(path)
            out[m.vllm] = m
    return out, paths


def dump_fingerprint(f: Fingerprint) -> dict:
    """A pin as a manifest holds it: unset fields left out, and no empty `wrappers`."""
    d = {k: v for k, v in msgspec.to_builtins(f).items() if v is not None}
    if not d.get("wrappers"):
        d.pop("wrappers", None)
    return d


def render(m: Manifest) -> str:
    doc: dict = {"vllm": m.vllm, "generated_by": m.generated_by, "patches": [_entry(e) for e in m.patches]}
    if m.not_applicable:
        doc["not_applicable"] = [{"patch": n.patch, "reason": n.reason} for n in m.not_applicable]
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def _entry(e) -> dict:
    d: dict = {"patch": e.patch, "targets": {s: dump_fingerprint(f) for s, f in e.targets.items()}}
    if e.reach:  # what the implementation reaches in vLLM (reach.py): left out when there is nothing
        d["reach"] = {k: {n: v for n, v in msgspec.to_builtins(r).items() if v is not None}
                      for k, r in sorted(e.reach.items())}
    return d


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
        ids = {PatchKey.parse(k).id for k in mine}
        out[name] = msgspec.structs.replace(m, patches=[e for e in m.patches if e.patch in mine],
                                            not_applicable=[n for n in m.not_applicable if n.patch in ids])
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

"""Declare: read patch files and manifests into validated objects, or say exactly what is wrong.

Everything is validated before anything touches vLLM, so a bad file can never
leave a half-applied state.
"""

from __future__ import annotations

import graphlib
from pathlib import Path
from typing import Iterable


from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.features import EnvDeclarations, complete, declare_own, read_features
from vllm_patchkit.declaration.yaml_files import parse_file, read_yaml
from vllm_patchkit.declaration import validation
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Manifest


def parse_patch(path: Path) -> Patch:
    """One patch file -> Patch, or DeclarationError/PatchSetErrors naming file and field."""
    return validation.to_object(parse_file(path, validation.Patch, "a mapping of patch fields"))


def parse_manifest(path: Path) -> Manifest:
    return validation.to_object(parse_file(path, validation.Manifest, "a manifest mapping"))


def _collect(errors: list, fn, *args):
    try:
        return fn(*args)
    except PatchSetErrors as exc:
        errors.extend(exc.errors)
    except DeclarationError as exc:
        errors.append(exc)
    return None


def _declared_id(path: Path) -> dict[str, str]:
    """{id: file} for a file that failed to load but still names its id (for better follow-on errors)."""
    try:
        data = read_yaml(path)
    except (DeclarationError, PatchSetErrors):
        return {}
    pid = data.get("id") if isinstance(data, dict) else None
    return {pid: str(path)} if isinstance(pid, str) else {}


def load_patch_set(dirs: Iterable) -> PatchSet:
    """Read every *.yaml under the given folders (or patch-set sources); check ids and `requires` across files."""
    errors: list[DeclarationError] = []
    ps = PatchSet()
    broken: dict[str, str] = {}  # id -> file, of files that failed to load but say their id
    # id -> (set name, file) of its first declaration: an id belongs to one set. Two sets declaring one id used to
    # become two versions of one patch (one of them never applied and had no row).
    owner: dict[str, tuple[str, str, str]] = {}
    env = EnvDeclarations()  # an environment variable is declared once across every set read
    for d in dirs:
        set_name = getattr(d, "name", None) if not isinstance(d, (str, Path)) else None
        d = Path(getattr(d, "patches", d))
        features = read_features(d, env, errors)
        parsed = []
        for path in sorted(d.glob("*.yaml")):
            before = len(errors)
            patch = _collect(errors, parse_patch, path)
            if patch is None:
                if not any(getattr(e, "over_bound", False) for e in errors[before:]):  # never read such a file twice
                    broken.update(_declared_id(path))
                continue
            declare_own(patch, str(path), env, errors)
            parsed.append((path, patch))
        for path, patch in parsed:
            patch = complete(patch, str(path), features, env, errors)
            if patch is None:
                continue
            first = owner.get(patch.id)
            if set_name is not None and first is not None and first[0] != set_name:
                errors.append(DeclarationError(
                    str(path), "id",
                    f"patch id {patch.id!r} is declared by two patch sets: {set_name!r} ({path}, {patch.key}) and "
                    f"{first[0]!r} ({first[1]}, {first[2]}); a patch id must be unique across sets (rename one of them)"))
                continue
            if patch.key in ps.patches:
                errors.append(
                    DeclarationError(str(path), "id", f"duplicate patch {patch.key} (also in {ps.files[patch.key]})")
                )
                continue
            if set_name is not None:
                owner.setdefault(patch.id, (set_name, str(path), patch.key))
            ps.patches[patch.key] = patch
            ps.files[patch.key] = str(path)
            if set_name is not None:
                ps.set_of[patch.key] = set_name
    ids = {p.id for p in ps.patches.values()}
    for key, p in ps.patches.items():
        for i, dep in enumerate(p.requires):
            if dep in broken:
                errors.append(DeclarationError(ps.files[key], f"requires[{i}]",
                                               f"patch {dep!r} is declared in {broken[dep]}, which failed to load (see its error)"))
            elif dep not in ids:
                errors.append(DeclarationError(ps.files[key], f"requires[{i}]", f"unknown patch id {dep!r}"))
    graph = {p.id: set(p.requires) & ids for p in ps.patches.values()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        first = next(k for k, p in ps.patches.items() if p.id == cycle[0])
        errors.append(DeclarationError(ps.files[first], "requires", f"cycle: {' -> '.join(cycle)}"))
    if errors:
        raise PatchSetErrors(errors)
    return ps


def installed_sources() -> list:
    """Every installed patch set (the framework's own first), as sources `load_patch_set` reads."""
    from vllm_patchkit.declaration.patchsets import discover

    return discover(with_env=False)


def manifest_dirs(sources: Iterable) -> list[Path]:
    """The manifests folders of the given sources, the framework's first (it is the main one)."""
    return [s.manifests for s in sources if getattr(s, "manifests", None) is not None]


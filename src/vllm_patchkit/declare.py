"""Declare: read patch files and manifests into validated objects, or say exactly what is wrong.

Everything is validated before anything touches vLLM, so a bad file can never
leave a half-applied state.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable

import yaml
from pydantic import ValidationError

from .errors import DeclarationError, PatchSetErrors
from .schema import Manifest, Patch


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<file>"


def _validation_errors(file: str, exc: ValidationError) -> list[DeclarationError]:
    errs = []
    for e in exc.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; typo?)"
        elif "input" in e and e["type"] not in ("missing",):
            msg = f"{msg} (got {e['input']!r:.80})"
        errs.append(DeclarationError(file, _field_path(loc), msg))
    return errs


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(str(path), "<file>", f"cannot read: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<file>"
        raise DeclarationError(str(path), where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None


def parse_patch(path: Path) -> Patch:
    """One patch file -> Patch, or DeclarationError/PatchSetErrors naming file and field."""
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DeclarationError(str(path), "<file>", f"expected a mapping of patch fields, got {type(data).__name__}")
    try:
        return Patch.model_validate(data)
    except ValidationError as exc:
        raise PatchSetErrors(_validation_errors(str(path), exc)) from None


def parse_manifest(path: Path) -> Manifest:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DeclarationError(str(path), "<file>", f"expected a manifest mapping, got {type(data).__name__}")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise PatchSetErrors(_validation_errors(str(path), exc)) from None


@dataclass
class PatchSet:
    """All patch versions, by key id@version, with the file each came from."""

    patches: dict[str, Patch] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def by_id(self, patch_id: str) -> list[Patch]:
        return [p for p in self.patches.values() if p.id == patch_id]


def _collect(errors: list, fn, *args):
    try:
        return fn(*args)
    except PatchSetErrors as exc:
        errors.extend(exc.errors)
    except DeclarationError as exc:
        errors.append(exc)
    return None


def load_patch_set(dirs: Iterable[Path]) -> PatchSet:
    """Read every *.yaml under the given folders; check ids and `requires` across files."""
    errors: list[DeclarationError] = []
    ps = PatchSet()
    for d in dirs:
        for path in sorted(Path(d).glob("*.yaml")):
            patch = _collect(errors, parse_patch, path)
            if patch is None:
                continue
            if patch.key in ps.patches:
                errors.append(
                    DeclarationError(str(path), "id", f"duplicate patch {patch.key} (also in {ps.files[patch.key]})")
                )
                continue
            ps.patches[patch.key] = patch
            ps.files[patch.key] = str(path)
    ids = {p.id for p in ps.patches.values()}
    for key, p in ps.patches.items():
        for i, dep in enumerate(p.requires):
            if dep not in ids:
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


def builtin_patch_dirs() -> list[Path]:
    """The patch set shipped with this distribution (vllm_patchkit.patches)."""
    return [Path(str(resources.files("vllm_patchkit.patches")))]


def builtin_manifest_dir() -> Path:
    return Path(str(resources.files("vllm_patchkit.manifests")))

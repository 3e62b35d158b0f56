"""Patch sets: where patches come from. The framework's own set, then every installed distribution's.

A distribution contributes a set through the entry-point group `vllm_patchkit.patch_sets`;
the entry point names a `PatchSetSource` (or a callable returning one): the set's name, its
patches folder and its manifests folder (a set's model adapters are its own modules' business). The
framework ships only
its own observing hooks (`core`); a product's patches (this repository's own set
among them) arrive through the same entry point as any third party's. A set that is asked
for but missing or empty is an error naming it, never an empty set.
"""

from __future__ import annotations

import os
from importlib import metadata, resources
from pathlib import Path
from typing import Iterable, Optional

from msgspec import Struct, field

from vllm_patchkit.declaration.entry_point_inputs import module_files, watching_environ
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.schema import Patch

GROUP = "vllm_patchkit.patch_sets"
EXTRA_ENV = "VLLM_PATCHKIT_EXTRA_PATCHES"
CORE = "core"


class PatchSetSource(Struct, frozen=True):
    """One patch set: a name, a folder of patch YAML (+ modules), its manifests."""

    name: str
    patches: Path
    manifests: Optional[Path] = None
    origin: str = ""  # where it was declared (entry point, environment variable)
    # files the set's declaration depends on besides its folders: the entry point's module (and its packages'
    # __init__), every module of its distribution imported by then, and its distribution's entry_points.txt,
    # METADATA and RECORD (the start-up cache's inputs: entry_point_inputs)
    inputs: tuple[str, ...] = ()
    # environment variables the entry point's answer depends on. A set declares those the framework cannot see it
    # read (at the import of a module imported before the call, or from C); the framework adds those it saw read
    # while it loaded and called the entry point (entry_point_inputs.watching_environ). The start-up cache's inputs.
    env: tuple[str, ...] = ()


def core_set() -> PatchSetSource:
    """The framework's own hooks (config-ready points, step counters), pinned like any patch."""
    here = Path(str(resources.files("vllm_patchkit.hooks")))
    return PatchSetSource(CORE, here, here / "manifests", "vllm_patchkit (framework)")


def _from_entry_point(ep) -> PatchSetSource:
    where = f"entry point {ep.name} = {ep.value} (group {GROUP})"
    try:
        with watching_environ() as read:
            obj = ep.load()
            src = obj() if callable(obj) and not isinstance(obj, PatchSetSource) else obj
    except Exception as exc:  # a plugin's import error is reported as that plugin's, with its name
        raise DeclarationError(where, "load", f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(src, PatchSetSource):
        raise DeclarationError(where, "value", f"expected a PatchSetSource, got {type(src).__name__}")
    declared = src.env
    if isinstance(declared, str) or not isinstance(declared, (tuple, list)) or not all(
            isinstance(n, str) and n for n in declared):
        raise DeclarationError(where, "env", f"expected a tuple of environment variable names, got {declared!r:.80}")
    return PatchSetSource(src.name, Path(src.patches), Path(src.manifests) if src.manifests else None,
                          where, tuple(module_files(ep)), tuple(sorted(set(declared) | read)))


def installed_sets() -> list[PatchSetSource]:
    """Every set contributed through the entry-point group, ordered by set name."""
    eps = metadata.entry_points(group=GROUP)
    return sorted((_from_entry_point(ep) for ep in eps), key=lambda s: s.name)


def env_sets() -> list[PatchSetSource]:
    """Folders named in $VLLM_PATCHKIT_EXTRA_PATCHES (quick experiments); each may hold manifests/."""
    raw = os.environ.get(EXTRA_ENV, "")
    out = []
    for p in (Path(x) for x in raw.split(os.pathsep) if x):
        out.append(PatchSetSource(f"extra:{p.name}", p, p / "manifests" if (p / "manifests").is_dir() else None,
                                  EXTRA_ENV))
    return out


def check_sources(sources: Iterable[PatchSetSource]) -> list[PatchSetSource]:
    """Every folder exists and holds a patch; set names are unique. All problems at once."""
    sources = list(sources)
    errors, seen = [], {}
    for s in sources:
        where = s.origin or s.name
        if s.name in seen:
            other_where, other_folder = seen[s.name]
            if s.name.startswith("extra:"):  # two folders of $VLLM_PATCHKIT_EXTRA_PATCHES with one basename
                errors.append(DeclarationError(where, str(s.patches), (
                    f"patch set {s.name!r} is also the name of {other_folder} (a set from this variable is named after "
                    f"its folder's basename, so {other_folder} and {s.patches} would be one set); rename one of the "
                    "two folders, or list a folder once")))
            else:
                errors.append(DeclarationError(where, "name", (
                    f"patch set {s.name!r} ({s.patches}) also contributed by {other_where} ({other_folder}); "
                    "set names must be unique")))
            continue
        seen[s.name] = (where, s.patches)
        if not s.patches.is_dir():
            errors.append(DeclarationError(where, str(s.patches), "no such folder (expected a folder of patch YAML files)"))
        elif not any(s.patches.glob("*.yaml")):
            errors.append(DeclarationError(where, str(s.patches), "holds no patch (expected *.yaml patch files)"))
        if s.manifests is not None and not s.manifests.is_dir():
            errors.append(DeclarationError(where, str(s.manifests), "no such manifests folder"))
    if errors:
        raise PatchSetErrors(errors)
    return sources


def discover(names: Optional[Iterable[str]] = None, *, with_env: bool = True) -> list[PatchSetSource]:
    """The framework's set, the installed sets, the environment's folders; `names` narrows (core always)."""
    sources = [core_set(), *installed_sets(), *(env_sets() if with_env else [])]
    if names is not None:
        wanted = set(names)
        unknown = wanted - {s.name for s in sources}
        if unknown:
            raise DeclarationError("--set", ", ".join(sorted(unknown)),
                                   f"no such patch set (installed: {', '.join(s.name for s in sources)})")
        sources = [s for s in sources if s.name in wanted or s.name == CORE]
    return check_sources(sources)


class PatchSet(Struct):
    """What the sets hold once read: all patch versions, by key id@version, with the file and set each came from."""

    patches: dict[str, Patch] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    set_of: dict[str, str] = field(default_factory=dict)  # key -> name of the patch set it came from

    def by_id(self, patch_id: str) -> list[Patch]:
        return [p for p in self.patches.values() if p.id == patch_id]

    def requires_of(self, patch: Patch) -> list[str]:
        """`requires` plus what its stage implies: a config-stage patch depends on the config-ready
        point of each of its processes (the hooks marked `config_ready: true`)."""
        out = list(patch.requires)
        if patch.stage == "config":
            for hook in self.patches.values():
                if hook.config_ready and set(hook.processes) & set(patch.processes) and hook.id not in out:
                    out.append(hook.id)
        return out

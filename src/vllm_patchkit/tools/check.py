"""The check: compare every patch's targets with a vLLM release, before installing it.

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

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.upstream.compat import judge_all
from vllm_patchkit.declaration.declare import PatchSet
from vllm_patchkit.tools.releases import Release, ReleaseError, open_release
from vllm_patchkit.declaration.schema import Fingerprint, Kind, Manifest, ManifestEntry, Patch
from vllm_patchkit.upstream.sigdiff import compare, missing_breakages, new_home
from vllm_patchkit.upstream.sourcediff import body_diff
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.targets import load_object


_HAS_SOURCE = frozenset({"function", "method", "staticmethod", "classmethod", "class"})


# -- per patch ----------------------------------------------------------------------------------
def target_specs(patch: Patch) -> list[str]:
    """Every upstream place pinned for the patch: its target, the copies of it, the callables it uses."""
    return patch.pinned_specs


def examine(release: Release, patch: Patch, pins: Optional[dict[str, Fingerprint]],
            pinned_on: Optional[Release] = None, *,
            impl_here: bool = True) -> tuple[dict[str, Union[Fingerprint, Missing]], list[Breakage]]:
    """Fingerprints of the patch's pinned places on the release, and the breakages against `pins`.

    `pinned_on`: the release the pins were read from, when at hand: a by-value copy of the target that was
    already there is not a change of this release (pin reported it when the patch was first pinned).
    `impl_here`: the patch's set is installed where this runs (`set_on_path`), so an implementation module
    not found on this Python's path is a finding; False for a loose folder of patches that is not (left to
    start-up, as the loader runs where the set is installed)."""
    pins = pins or {}
    live = _live_foreign_check(release, patch)
    by_source = patch.source_pinned_specs
    found: dict[str, Union[Fingerprint, Missing]] = {}
    out: list[Breakage] = []
    target_id = None
    for spec in target_specs(patch):
        if patch.kind is Kind.set and (patch.instances or patch.inherited_from) and spec in (patch.target,
                                                                                             patch.inherited_from):
            found[spec], more = _set_place(release, patch, spec, pins.get(spec))  # the loader's reading, statically
            out.extend(more)
            continue
        is_copy = spec in patch.copies and spec != patch.target  # `uses` are checked like targets
        pin = pins.get(spec)
        with_digest = spec in by_source or (pin is not None and pin.source_digest is not None)
        got = release.lookup(spec, with_digest)
        if (isinstance(got, Missing) and got.inherited_from and patch.instances and spec == patch.target):
            # `instances: true` patches objects, whose lookup goes through the MRO: the base's method is what
            # they call and what is compared (the loader reads it the same way: targets.resolve_through_mro)
            got = release.lookup(got.inherited_from, with_digest)
        found[spec] = got
        foreign = live(spec) if live is not None and (spec == patch.target or is_copy) else None
        if foreign is not None:  # another plugin's object: its signature says nothing about vLLM's
            out.append(foreign)
            continue
        if pin is not None:
            out.extend(compare(patch.key, spec, pin, got, copy=is_copy))
            if spec in by_source and pin.source_digest is None and pin.kind in _HAS_SOURCE:
                out.append(Breakage(BreakageKind.unpinned, patch.key, spec, detail=(
                    f"{patch.key} copies the body of {spec} (`reimplements`), but its pin has no source digest: "
                    "re-pin on the release the copy was made from (`vllm-patchkit pin`)")))
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
            why = misdeclared.class_target(patch.kind.value, spec, got.kind)
            if why is None and patch.kind in (Kind.wrap, Kind.replace) and target_id is not None:
                why = misdeclared.held_by_value(spec, target_id[1])
            if why is not None:
                out.append(Breakage(BreakageKind.misdeclared, patch.key, spec, detail=why))
                continue
            out.extend(_convention(patch, got, impl_here))
            if patch.kind in (Kind.wrap, Kind.replace):
                before = set(pinned_on.holders(spec)) if pinned_on is not None and pins else set()
                out.extend(Breakage(BreakageKind.copy_undeclared, patch.key, spec, new=held)
                           for held in release.holders(spec) if held not in patch.copies and held not in before)
        elif is_copy and target_id is not None:
            held = release.identity(spec)
            if held is not None and held[0] != target_id[0]:
                out.append(Breakage(BreakageKind.copy_differs, patch.key, spec, old=target_id[1], new=held[1]))
    return found, judge_all(patch, out)


def _set_place(release: Release, patch: Patch, spec: str,
               pin: Optional[Fingerprint]) -> tuple[Union[Fingerprint, Missing], list[Breakage]]:
    """A `set` on the objects of a class (`instances`) or on one subclass over its base (`inherited_from`): what is
    pinned at `spec` and what changed, by the loader's rules (`verify._set_place`, `misdeclared.py`).

    - `instances`: the target is an attribute the class's methods assign on each object (`instance_attribute`,
      with the value digest of the literal `__init__` assigns); gone when no method assigns it any more;
    - `inherited_from`: the target is pinned `absent` (the subclass does not define it) and the base's attribute
      as any class attribute (its value digest). The subclass defining it itself, or the MRO finding it at another
      base, is a misdeclaration the loader refuses with the same words, never "moved"."""
    if patch.instances:
        got = _instance_attribute(release, spec)
        if pin is not None:
            return got, compare(patch.key, spec, pin, got)
        return got, missing_breakages(patch.key, spec, got) if isinstance(got, Missing) else []
    got = release.lookup(spec)
    if spec == patch.inherited_from:
        if isinstance(got, Missing) and got.inherited_from:
            return got, []  # the base inherits it too: the target's reading names the class the MRO finds
        if pin is not None:
            return got, compare(patch.key, spec, pin, got)
        return got, missing_breakages(patch.key, spec, got) if isinstance(got, Missing) else []
    if isinstance(got, Fingerprint):
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec,
                              detail=misdeclared.now_defined(spec, patch.inherited_from))]
    if got.inherited_from == patch.inherited_from:
        absent = Fingerprint(kind="absent")
        return absent, [] if pin is None else compare(patch.key, spec, pin, absent)
    if got.inherited_from:
        return got, [Breakage(BreakageKind.misdeclared, patch.key, spec,
                              detail=misdeclared.inherited_elsewhere(spec, patch.inherited_from, got.inherited_from))]
    return got, missing_breakages(patch.key, spec, got)


def _instance_attribute(release: Release, spec: str) -> Union[Fingerprint, Missing]:
    """`spec` as an attribute of each object: read from the release's source (`StaticRelease.instance_attribute`),
    or, for `--live`, from the imported class's source as the loader reads it (`fingerprint.live_instance_attribute`)."""
    from vllm_patchkit.tools.releases import LiveRelease, StaticView

    if isinstance(release, StaticView):
        return release.release.instance_attribute(spec)
    reader = getattr(release, "instance_attribute", None)
    if reader is not None:
        return reader(spec)
    if isinstance(release, LiveRelease):
        from vllm_patchkit.upstream import fingerprint as fp
        from vllm_patchkit.upstream.targets import TargetError, resolve

        cls_spec, _, attr = spec.rpartition(".")
        try:
            cls = resolve(cls_spec).get_raw()
        except TargetError as exc:
            return Missing(spec, str(exc))
        if not isinstance(cls, type):
            return Missing(spec, f"{cls_spec} is not a class")
        got = fp.live_instance_attribute(cls, attr)
        return got if isinstance(got, Fingerprint) else Missing(spec, got[0], unreadable=got[1])
    return Missing(spec, f"{getattr(release, 'label', release)} cannot read attributes of objects", unreadable=True)


_PLUGINS_LOADED: list[str] = []


def load_other_plugins() -> list[str]:
    """`--live`: run every other general plugin's entry point (`vllm.general_plugins`, as vLLM does in each
    process, `VLLM_PLUGINS` honoured), never vllm-patchkit's own, so a target another plugin replaces with
    `setattr` is seen as the loader will see it. Once per process; returns what failed, as notes."""
    if _PLUGINS_LOADED:
        return _PLUGINS_LOADED[1:]
    import logging
    import os
    from importlib.metadata import entry_points

    _PLUGINS_LOADED.append("loaded")
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else allowed.split(",")
    for ep in entry_points(group="vllm.general_plugins"):
        if ep.name == "vllm_patchkit" or (names is not None and ep.name not in names):
            continue
        try:
            ep.load()()
        except Exception as exc:  # another plugin's failure is its own; say so and read on
            _PLUGINS_LOADED.append(f"plugin {ep.name} failed to load: {type(exc).__name__}: {exc}")
            logging.getLogger("vllm.patchkit").warning("vllm-patchkit: %s", _PLUGINS_LOADED[-1])
    return _PLUGINS_LOADED[1:]


def _live_foreign_check(release: Release, patch: Patch):
    """For the installed vLLM read by import (`--live`): a function telling, per target, whether another
    plugin's code stands there (the loader's `conflict`, `verify.foreign_replacement`), as a breakage; None
    otherwise. A static reading sees only vLLM's source, never a run-time replacement."""
    from vllm_patchkit.tools.releases import LiveRelease

    if not isinstance(release, LiveRelease) or patch.kind not in (Kind.wrap, Kind.replace):
        return None
    load_other_plugins()

    def foreign(spec: str) -> Optional[Breakage]:
        from vllm_patchkit.upstream.targets import TargetError, resolve
        from vllm_patchkit.runtime.verify import foreign_replacement

        try:
            raw = resolve(spec).get_raw()
        except TargetError:
            return None
        f = foreign_replacement(patch, spec, raw)
        return None if f is None else Breakage(BreakageKind.foreign_replacement, patch.key, spec, new=f.found)

    return foreign


def _convention(patch: Patch, target: Fingerprint, impl_here: bool = True) -> list[Breakage]:
    """The implementation must accept every call the release can make to the target (as at start-up), and
    it must be importable at all: a module not found on this Python's path (not installed where `check`
    runs), one that does not parse, or a name it does not define is what the loader refuses at start-up."""
    from vllm_patchkit.upstream import convention

    out = []
    for p in convention.problems_for(patch, target.signature, target_kind=target.kind):  # read statically
        if p.code == "implementation_missing" and not impl_here:
            continue  # a loose folder of patches, not installed here: the module may well be where it serves
        kind = (BreakageKind.implementation_unimportable if p.code in ("implementation_missing", "implementation")
                else BreakageKind.convention_mismatch)
        out.append(Breakage(kind, patch.key, patch.target, parameter=p.parameter, new=p.code, detail=p.message))
    return out


@functools.lru_cache(maxsize=1)
def _installed_set_names() -> frozenset[str]:
    try:
        from vllm_patchkit.declaration.patchsets import CORE, installed_sets

        return frozenset({CORE, *(s.name for s in installed_sets())})
    except Exception:
        return frozenset()


def set_on_path(patch_set: PatchSet, key: str) -> bool:
    """Whether the patch's own set is installed where this runs: found through an installed distribution's
    entry point (or the framework's own), or its folder is on this Python's path (inside a `sys.path` entry).
    Then its implementation modules must import here as they will where it serves."""
    import os
    import sys

    file = patch_set.files.get(key)
    if file is None:
        return True
    name = patch_set.set_of.get(key)
    if name is not None and name in _installed_set_names():
        return True
    folder = os.path.realpath(os.path.dirname(file))
    for entry in sys.path:
        root = os.path.realpath(entry or os.getcwd())
        if folder == root or folder.startswith(root + os.sep):
            return True
    return False


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
    """One patch on the release. `compatible`: only differences this patch survives, against an older
    release's pins (pin carries it forward); `stale`: the same against the release's own manifest (the
    loader compares pins exactly, so the manifest must be re-pinned)."""

    patch: str  # id@version checked (id alone when no version is pinned anywhere)
    status: str  # ok | compatible | stale | broken | not_applicable | unpinned
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
        return f"{self.breakage.explain()} — affects {', '.join(self.patches)} ({self.breakage.verdict()})"

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
            _, patches = same.setdefault((b.kind, b.explain(), b.breaking, b.compat), (b, []))
            if b.patch not in patches:
                patches.append(b.patch)
        by_target: dict[str, list[Finding]] = {}
        for b, patches in same.values():
            by_target.setdefault(b.target, []).append(Finding(b, tuple(patches)))
        return [f for group in by_target.values() for f in group]

    @property
    def failed(self) -> bool:
        """A breaking difference, or a compatible one the release's own manifest has not re-pinned."""
        return any(b.breaking for b in self.breakages) or any(r.status == "stale" for r in self.results)

    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        out = {"ok": 0, "compatible": 0, "stale": 0, "broken": 0, "not_applicable": 0, "unpinned": 0}
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
    if own is not None:
        _contradictions(patch_set, own_key, own, paths, results)
    return Report(version, release.label, results)


def _contradictions(patch_set: PatchSet, own_key: str, own: Manifest, paths: dict[str, str],
                    results: list[PatchResult]) -> None:
    """The release's own manifest lists a required patch whose `when.vllm` excludes the release: broken, naming
    the manifest file and entry and the patch file (contradictions.py; the loader refuses it at start-up)."""
    from vllm_patchkit.declaration.contradictions import discovered_folders, find

    if not find(patch_set, {own_key: own}, paths):
        return
    for c in find(patch_set, {own_key: own}, paths, folders=discovered_folders()):
        res = next((r for r in results if r.patch.split("@")[0] == c.key.split("@")[0]), None)
        if res is None:
            continue
        patch = patch_set.patches[c.key]
        res.breakages.append(Breakage(BreakageKind.when_excludes, c.key, patch.target or c.key,
                                      detail=c.explain()))
        res.status = "broken"


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
                # marked by a tool, not decided by a reviewer: what the loader does with it when a model needs
                # it: refuse start-up (a version admits the release) or skip it silently (none does)
                from vllm_patchkit.declaration.preconditions import version_matches

                admitted = any(version_matches(p.when, version) for p in patch_set.by_id(pid))
                res.breakages.append(Breakage(BreakageKind.required_not_applicable, newest.key,
                                              newest.target or pid, new="refused" if admitted else "skipped",
                                              detail=na.reason))
            return res
        entry = next((e for e in own.patches if e.patch.split("@")[0] == pid), None)
        if entry is None:
            base = older_entry(pid, manifests, version, paths)
            res = _compare_entry(release, patch_set, base, newest) if base else _unpinned(release, newest, patch_set)
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
        res = _unpinned(release, newest, patch_set)
        where = f"the manifest for vLLM {baseline} does not list {pid}" if baseline is not None else \
            f"no manifest older than vLLM {version} lists {pid}"
        res.breakages.append(Breakage(BreakageKind.unpinned, newest.key, newest.target or pid, detail=where))
        res.status = "unpinned"
        return res
    return _compare_entry(release, patch_set, base, newest)


_OPENED: dict[str, tuple[Optional[Release], str]] = {}


def pinned_release(release: Release, version: str) -> tuple[Optional[Release], str]:
    """The release pins were read from, read statically (installed, or its wheel in the cache), or None and
    why not; opened once per process."""
    if _same(release, version):
        return None, f"vLLM {version} is the release checked (its installed source differs from the pin)"
    if version not in _OPENED:
        try:
            _OPENED[version] = (open_release(version), "")
        except ReleaseError as exc:
            _OPENED[version] = (None, f"the source of vLLM {version} is not at hand ({exc})")
    return _OPENED[version]


def with_source_diffs(release: Release, pinned_on: str, breakages: list[Breakage]) -> list[Breakage]:
    """Each `source_changed` with the unified diff of the copied body, from the release it was pinned on to
    this one. When the pinned release's source is not at hand the finding says so instead of a diff."""
    if not any(b.kind is BreakageKind.source_changed for b in breakages):
        return breakages
    old, why = pinned_release(release, pinned_on)
    why = f"no diff: {why}"
    out = []
    for b in breakages:
        if b.kind is BreakageKind.source_changed:
            was = old.definition(b.target) if old is not None else None
            now = release.definition(b.target)
            if was is not None and now is not None:
                text = body_diff(was, now, f"{b.target} (vLLM {pinned_on})", f"{b.target} (vLLM {release.version()})")
                b = replace(b, diff=text or "the normalised bodies read the same; the digest rule differs")
            else:
                b = replace(b, diff=why if old is None else f"no diff: {b.target} not readable in both releases")
        out.append(b)
    return out


def _same(release: Release, version: str) -> bool:
    try:
        return Version(release.version() or "0") == Version(version)
    except Exception:
        return False


def _compare_entry(release, patch_set, base: Baseline, newest: Patch) -> PatchResult:
    patch = patch_set.patches[base.entry.patch]
    _, breakages = examine(release, patch, dict(base.entry.targets), pinned_release(release, base.vllm)[0],
                           impl_here=set_on_path(patch_set, patch.key))
    breakages = with_source_diffs(release, base.vllm, breakages)
    note = "" if patch.version == newest.version else f"newest version is {newest.key}, not listed for vLLM {base.vllm}"
    if any(b.breaking for b in breakages):
        status = "broken"
    elif breakages:
        own = Version(base.vllm) == Version(release.version() or "0")
        status = "stale" if own else "compatible"
        note = note or ("pins differ from the release by changes this patch survives: re-run `vllm-patchkit pin`"
                        if own else "changes this patch survives: `vllm-patchkit pin` carries it forward")
    else:
        status = "ok"
    return PatchResult(patch.key, status, breakages, pins_from=base.vllm, note=note)


def _unpinned(release, patch: Patch, patch_set: Optional[PatchSet] = None) -> PatchResult:
    here = set_on_path(patch_set, patch.key) if patch_set is not None else True
    _, breakages = examine(release, patch, None, impl_here=here)  # at least: do the targets exist?
    return PatchResult(patch.key, "unpinned", breakages)

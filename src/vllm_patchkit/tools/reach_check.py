"""The reach of a patch on a release, offline: what `pin` records and what `check` reports gone.

`pin` and `check` read the implementation's reach (`upstream/reach.py`) against the release's own source
(`reach_types.py`; the installed vLLM is read statically too, so both say the same of it and of a wheel or tree).
`check` also asks the release about every name the manifest entry pinned that today's reading did not reach (the
implementation changed since, or a type that was inferred then is not now): a name the release no longer defines is
a `reach_missing` breakage either way, naming the implementation's line when the reading has one. A class swapped
in by a `set` owes vLLM's inherited methods the attributes they read on its objects (`reach_provide.py`, kind
`provide`): pinned when it provides them, `reach_missing` naming vLLM's reader when it does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.pins import ManifestEntry, ReachPin
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools import reach_provide
from vllm_patchkit.tools.reach_types import ReleaseTypes
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import reach
from vllm_patchkit.upstream.findings import Breakage, BreakageKind
from vllm_patchkit.upstream.impl_static import ImplUnreadable


def static_of(release) -> Optional[StaticRelease]:
    """The release's source read statically (a wheel, a tree, or the installed folder)."""
    inner = getattr(release, "release", None)
    if isinstance(inner, StaticRelease):
        return inner
    static = getattr(release, "static", None)
    return static() if callable(static) else None


def types_of(release) -> Optional[ReleaseTypes]:
    st = static_of(release)
    if st is None:
        return None
    cached = getattr(st, "_reach_types", None)
    if cached is None:
        cached = st._reach_types = ReleaseTypes(st)
    return cached


def instance_param(patch: Patch) -> Optional[int]:
    """Where the implementation gets the target's object: a wrap's 2nd parameter, a method replacement's 1st."""
    row = traits(patch)
    if patch.implementation is None or patch.target is None or ":" not in patch.target:
        return None
    if row.wraps_original:
        return 1
    if row.stands_in and Target.parse(patch.target).is_member:
        return 0
    return None


def read(release, patch: Patch) -> list[reach.ReachItem]:
    """The patch's reach on the release ([] for a patch with no implementation function, or no readable source)."""
    types = types_of(release)
    pos = instance_param(patch)
    if types is None or patch.implementation is None or patch.target is None:
        return []
    try:
        return reach.read(patch.implementation, patch.target, pos, types)
    except ImplUnreadable:
        return []  # the implementation's own finding says so (examine: implementation_unimportable)


def owed(release, patch: Patch) -> list[reach_provide.Owed]:
    """What a class swapped in by this `set` must provide to vLLM's methods ([] for any other patch)."""
    st = static_of(release)
    return reach_provide.read(st, patch) if st is not None and reach_provide.applies(patch) else []


def pins(items: list[reach.ReachItem]) -> dict[str, ReachPin]:
    """What a manifest entry records: each followed name the release defines, with how it defines it."""
    out: dict[str, ReachPin] = {}
    for i in items:
        if i.followed and i.member is not None:
            out.setdefault(i.key, ReachPin(kind=i.kind, defined=i.member.defined))
    return out


def root_of(patch_set: PatchSet, key: str) -> Optional[Path]:
    """The folder above the patch's YAML folder: lines are shown as `patches/x.py:74`."""
    file = patch_set.files.get(key)
    return Path(file).parent.parent if file else None


def breakages(release, patch: Patch, entry: Optional[ManifestEntry], root: Optional[Path] = None) -> list[Breakage]:
    """`reach_missing` for each name the implementation reaches (today's reading, and the entry's pins) that the
    release does not define."""
    version = release.version()
    items = read(release, patch)
    out: list[Breakage] = []
    seen = set()
    for i in items:
        if i.followed and i.member is None and i.key not in seen:
            seen.add(i.key)
            out.append(Breakage(BreakageKind.reach_missing, patch.key, i.key, old=i.kind, new=version,
                                detail=reach.where(i, root)))
    for o in owed(release, patch):
        if o.item.member is None:
            out.append(Breakage(BreakageKind.reach_missing, patch.key, o.item.key, old="provide", new=version,
                                detail=f"{o.where()}; {patch.value_from}"))
    types = types_of(release)
    reached = {i.key for i in items}
    for key, pin in sorted((entry.reach if entry is not None else {}).items()):
        if key in reached or key in seen or types is None or pin.kind == "provide":
            continue
        reached = Target.parse(key)
        if pin.kind == "import":
            found = types.module_defines(reached.module, reached.qualname)
        else:
            found = types.member(f"{reached.module}:{reached.owner or ''}", reached.attr)
        if found is None:
            out.append(Breakage(BreakageKind.reach_missing, patch.key, key, old=pin.kind, new=version,
                                detail=f"pinned in the manifest entry of {patch.key}"))
    return out


def resolved(items: list[reach.ReachItem]) -> tuple[int, int]:
    """(names followed, all names reached): the share of the implementation's use of vLLM that was resolved."""
    keys = {(i.kind, i.owner, i.name, i.followed) for i in items}
    return sum(1 for k in keys if k[3]), len(keys)


__all__ = ["breakages", "instance_param", "pins", "read", "resolved", "root_of", "static_of", "types_of"]


def with_reach(release, patch_set: PatchSet, entries: list[ManifestEntry]) -> tuple[list[ManifestEntry], list[str]]:
    """`pin`: each entry with the reach its implementation has on the release; and, for a name the release does not
    define, why the entry cannot be pinned (the loader would refuse it at start-up)."""
    import msgspec

    out, problems = [], []
    for e in entries:
        patch = patch_set.patches[e.patch]
        root = root_of(patch_set, e.patch)
        items = read(release, patch) + [o.item for o in owed(release, patch)]
        gone = [b.explain() for b in breakages(release, patch, None, root)]
        if gone:
            problems.append(f"{e.patch}: listed for vLLM {release.version()} but cannot be pinned: {'; '.join(gone)}")
        out.append(msgspec.structs.replace(e, reach=pins(items)))
    return out, problems

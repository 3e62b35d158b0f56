"""The plan of one process: which version of each patch runs here, in `requires` order and at which stage, and
the checks made before anything is applied (every module a listed patch names exists; no manifest contradicts
its patches). The loader makes it once; its records start `pending` here."""

from __future__ import annotations

import graphlib
from typing import Any, Optional

from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.names import PatchKey, Target
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.availability import Unavailable, planned_version, unavailable
from vllm_patchkit.runtime.modules import module_exists
from vllm_patchkit.runtime.record import PatchRecord

Plan = list[tuple[Patch, Optional[ManifestEntry], str]]  # (the patch version chosen, its manifest entry, its stage)


def plan_of(patch_set: PatchSet, loaded: Any, vllm_version: str, manifest_note: str, pins_of: Any,
            records: dict[str, PatchRecord], unavailable_of: dict[str, Unavailable]) -> Plan:
    """Choose the version of each patch the manifest (`loaded`) lists; order by `requires`. Fills `records` (one
    per patch id).

    A patch the manifest does not offer stays pending, with the reason kept in
    `unavailable_of`: whether that matters is decided at its stage, once it is
    known whether this process and this model need it. An observing core hook
    (`observer: true`) is taken unpinned instead, so that stage can run at all.
    """
    m = loaded.manifest if loaded else None
    chosen: dict[str, tuple[Patch, Optional[ManifestEntry]]] = {}
    listed = {PatchKey.parse(e.patch).id: e for e in (m.patches if m else [])}
    marked_na = {n.patch for n in (m.not_applicable if m else [])}
    for patch_id in sorted({p.id for p in patch_set.patches.values()}):
        versions = sorted(patch_set.by_id(patch_id), key=lambda p: p.version)
        path = loaded.path if loaded else None
        patch, entry, excluded = planned_version(versions, listed.get(patch_id), vllm_version, path)
        chosen[patch_id] = (patch, entry)
        rec = PatchRecord(patch=patch.key, patch_set=patch_set.set_of.get(patch.key), kind=patch.kind.value,
                          required=patch.required, stage=patch.stage, target=patch.target,
                          expected_calls=patch.expected_calls.value)
        records[patch_id] = rec
        if entry is None:
            why = excluded or unavailable(patch_id, m, path, manifest_note, vllm_version, pins_of)
            if patch.observer and patch_id not in marked_na:
                rec.detail["unpinned"] = f"observing hook applied without a pin ({why.reason})"
            else:
                unavailable_of[patch_id] = why
    graph = {patch_id: set(patch_set.requires_of(p)) & chosen.keys() for patch_id, (p, _) in chosen.items()}
    order = list(graphlib.TopologicalSorter(graph).static_order())
    stage_of: dict[str, str] = {}
    plan = []
    for patch_id in order:
        patch, entry = chosen[patch_id]
        stage = patch.stage
        if any(stage_of.get(d) == "config" for d in patch.requires):
            stage = "config"  # a dependent cannot run before what it depends on
        stage_of[patch_id] = stage
        records[patch_id].stage = stage
        plan.append((patch, entry, stage))
    return plan


def check_modules(plan: Plan, unavailable_of: dict[str, Unavailable], patch_set: PatchSet,
                  known: frozenset = frozenset()) -> None:
    """Every module a listed patch names must exist, before anything is applied (`known`: found by the
    start-up cache's writer in this installation; a file deleted since fails at verify, as a patch failure)."""
    errors = []
    for patch, entry, _ in plan:
        if entry is None and patch.id in unavailable_of:
            continue
        named = [("target", patch.target), ("implementation", patch.implementation), ("value_from", patch.value_from)]
        named += [(f"copies[{i}]", c) for i, c in enumerate(patch.copies)]
        named += [(f"uses[{i}]", c) for i, c in enumerate(patch.uses)]
        for fld, spec in named:
            if spec is None:
                continue
            module = Target.parse(spec).module
            if module not in known and not module_exists(module):
                errors.append(DeclarationError(patch_set.files[patch.key], fld,
                                               f"module {module!r} not found (expected an importable module in {spec!r})"))
    if errors:
        raise PatchSetErrors(errors)


def check_contradictions(patch_set: PatchSet, manifests: dict) -> None:
    """A manifest listing a required patch whose own `when.vllm` excludes its release would be skipped here
    as not needed, silently: a declaration error naming the manifest entry and the patch file
    (contradictions.py; `check` and `pin` refuse it in the same words)."""
    from vllm_patchkit.declaration.contradictions import discovered_folders, find

    if find(patch_set, manifests):  # the folders are looked up only to name the right file
        raise PatchSetErrors([c.as_error() for c in find(patch_set, manifests, folders=discovered_folders())])

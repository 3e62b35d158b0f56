"""Apply: install a verified patch at its target and at every declared copy that holds the original (the
closures: wrappers.py; on each object vLLM builds: instances.py); undo: applied.py."""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import SET_BY, Applied
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.runtime.wrappers import build_callable, rewrap_descriptor
from vllm_patchkit.upstream.targets import MISSING, Place, TargetError, function_of, main_aliases, resolve

log = logging.getLogger("vllm.patchkit")

def install(patch: Patch, place: Place, copies: list[Place], impl: Any, count: bool, ctx: Any = None) -> Applied:
    """Install at the target and at every declared copy that holds the original.

    `ctx`: the PatchContext the loader made for this patch (a wrap with an implementation); a detached
    one when installed without a loader, so its counters are kept on it.
    """
    if ctx is None and traits(patch).wraps_original and impl is not None:
        ctx = PatchContext.detached(patch)
    if patch.instances:  # on each object vLLM builds: only such patches import that machinery
        from vllm_patchkit.runtime.instances import install_on_instances, install_value_on_instances
    if patch.instances and traits(patch).sets_value:
        return install_value_on_instances(patch, place, impl if patch.value_from is not None else patch.value, count)
    if patch.instances:
        return install_on_instances(patch, place, impl, count, ctx)
    applied = Applied(patch, ctx=ctx)
    raw = place.get_raw()
    if traits(patch).sets_value:
        place.set_raw(impl if patch.value_from is not None else patch.value)
        applied.places.append((place, raw))
        SET_BY[(id(place.owner), place.attr)] = patch.key
        return applied
    original = function_of(raw)
    bound = place.owner_is_class and not isinstance(raw, staticmethod)
    if ctx is not None:
        ctx.bind_target(original, bound)
    fn = build_callable(patch, original, impl, applied.counter, count, ctx, bound)
    new_raw = rewrap_descriptor(raw, fn)
    place.set_raw(new_raw)
    applied.places.append((place, raw))
    applied.installed, applied.original = fn, original
    done = set()
    for copy in copies:
        held = copy.get_raw()
        done.add(copy.spec)
        if held is not MISSING and function_of(held) is original:
            copy.set_raw(fn)
            applied.places.append((copy, held))
    applied.late_copies = [c for c in patch.copies if c not in done]
    if not place.owner_is_class:  # a declared place in the module run as the program (`python -m ...`)
        for spec in main_aliases([patch.target, *patch.copies]):
            try:
                alias = resolve(spec, import_module=False)
            except TargetError:
                continue
            held = alias.get_raw()
            if held is not MISSING and function_of(held) is original:
                alias.set_raw(fn)
                applied.places.append((alias, held))
    return applied


def set_env_default(patch: Patch, applied: Applied) -> str:
    """Set the default when unset; an explicit value is always kept."""
    name, value = patch.env_default.name, patch.env_default.value
    current = os.environ.get(name)
    if current is None:
        os.environ[name] = value
        applied.env = (name, None)
        log.info("vllm-patchkit: %s set %s=%s (was unset)", patch.key, name, value)
        return f"set {name}={value} (was unset)"
    return f"kept explicit {name}={current}"

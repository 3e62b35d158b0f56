"""What a target's live place holds, in the words verify refuses it with: an object the kind cannot take, a
function held by value from where it is defined, the code sites of foreign wrapper layers, a copy whose module is
still importing.

Read from the live object alone (no pin); verify.py compares with the pins.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Optional

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.provenance import code_site, describe_site, outside_upstream
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.targets import Place, TargetError, resolve


def kind_misfit(patch: Patch, place: Place, raw: Any) -> Optional[Finding]:
    """A `wrap`/`replace` installs a function: only a function or method (staticmethod and
    classmethod kept as they are) can take one without changing what vLLM sees."""
    if not traits(patch).installs_function or isinstance(raw, (staticmethod, classmethod)):
        return None
    if isinstance(raw, property) and traits(patch).wraps_original and raw.fget is not None:
        return None  # the getter is wrapped; the class keeps a property (apply.rewrap_descriptor)
    t = type(raw)
    tname = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    if isinstance(raw, property):
        what, found, remedy = ("a property", "property", "`wrap` wraps a property's getter and keeps it a property; "
                               "`replace` would put a function in its place; declare kind: set for a value")
    elif isinstance(raw, type):  # the words `check` uses (misdeclared.py)
        return Finding("kind", misdeclared.class_target(patch.kind.value, patch.target, "class"),
                       "a function or method", "class")
    elif not callable(raw):
        if hasattr(t, "__get__"):
            what, found, remedy = (f"a {tname} descriptor, not a function", tname,
                                   "declare kind: set, or wrap the function it holds")
        else:
            what, found, remedy = (f"a non-callable {tname} value", tname, "declare kind: set to change its value")
    elif (place.owner_is_class and not isinstance(raw, types.FunctionType) and not hasattr(raw, "__wrapped__")
          and not hasattr(t, "__get__")):
        what, found, remedy = (f"a callable {tname} object on a class", tname,
                               "a function in its place would be bound as a method and receive self; "
                               "patch the function it calls")
    else:
        return None
    return Finding("kind", f"{patch.target} is {what}; `{patch.kind.value}` supports functions and methods only "
                           f"({remedy})", "a function or method", found)


def held_by_value(patch: Patch, func: Any) -> Optional[Finding]:
    """The target names a function imported (or aliased) by value from where it is defined: the same rule and
    words as `check` (misdeclared.py). Told apart from a replacement: the place the function's own
    `__module__:__qualname__` names holds this very object."""
    if not traits(patch).installs_function or type(func) is not types.FunctionType:
        return None
    defined_at = f"{func.__module__}:{func.__qualname__}"
    if defined_at == patch.target or "<" in func.__qualname__:
        return None
    try:
        home = resolve(defined_at, import_module=False)
    except TargetError:
        return None
    if fp.innermost(home.get_raw()) is not func:
        return None
    return Finding("target", misdeclared.held_by_value(patch.target, defined_at), patch.target, defined_at)


def layer_sites(raw: Any, upstream_module: str) -> str:
    """Each foreign `__wrapped__` layer's code site, with its distribution."""
    out, seen, obj = [], set(), raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    while hasattr(obj, "__wrapped__") and id(obj) not in seen:
        seen.add(id(obj))
        if not getattr(obj, "__vllm_patchkit__", None):
            _, file, _ = code_site(obj)
            if not file or outside_upstream(file, upstream_module):
                out.append(describe_site(obj))
        obj = obj.__wrapped__
    return "; ".join(out) or "a layer of unknown origin"


def initializing(spec: str) -> bool:
    """The copy's module is being imported right now: it imported the target (a lazy patch is applied from
    that nested import) and has not reached its `from ... import` line yet."""
    mod = sys.modules.get(Target.parse(spec).module)
    return bool(getattr(getattr(mod, "__spec__", None), "_initializing", False))

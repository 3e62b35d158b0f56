"""Declarations that name the wrong place or the wrong kind of object: one rule, two readers.

The loader reads the live object at start-up (`verify.py`), `check` and `pin` read the release's source
(`check.examine`); both ask the functions here, so a declaration one refuses the other refuses too, in the
same words (issue 20: `check` said ok for a `wrap` of a class and for a name imported by value, which the
loader then refused, the second time with an untrue "replaced by another object").
"""

from __future__ import annotations

from typing import Optional, Sequence

from vllm_patchkit.declaration.kinds import declaration_of
from vllm_patchkit.declaration.names import Target


def class_target(patch_kind: str, target: str, target_kind: str) -> Optional[str]:
    """Why a wrap/replace cannot be installed at `target` when it is a class; None when it is not one."""
    if not declaration_of(patch_kind).installs_function or target_kind != "class":
        return None
    return (f"{target} is a class; `{patch_kind}` supports functions and methods only (a function in its place "
            "breaks isinstance, subclassing and its class attributes; wrap its __init__ or a method instead)")


def held_by_value(target: str, defined_at: str, holders: Sequence[str] = ()) -> Optional[str]:
    """Why `target` cannot be the declared target when the object there is defined at `defined_at` (imported
    by value, or an alias); None when it is defined where it is named. `holders`: the other places a patch at
    `defined_at` must list in `copies` (offline, where the release's holders are known), named all at once."""
    if defined_at == target:
        return None
    listed = ", ".join(sorted({target, *holders} - {defined_at}))
    return (f"{target} holds {defined_at} by value (imported or aliased there, not defined there): patching it "
            f"would leave every other holder calling the original; declare the target as {defined_at} and list "
            f"{listed} in `copies`")


def now_defined(target: str, inherited_from: str) -> str:
    """Why a `set` declared with `inherited_from` cannot be applied when the subclass defines the attribute itself
    (upstream's own override now, or anybody else's)."""
    place = Target.parse(target)  # a member: `inherited_from` is only for one
    owner, attr = place.owner_target, place.attr
    return (f"{owner} defines {attr} itself: it does not inherit it from {inherited_from} (`inherited_from`), so "
            f"the patch would overwrite {owner}'s own value instead of overriding the inherited one; re-read that "
            "value and declare the set again (without `inherited_from` if overwriting it is still wanted)")


def inherited_elsewhere(target: str, declared: str, actual: str) -> str:
    """Why a `set` declared with `inherited_from` does not fit when the MRO finds the attribute at another base."""
    return (f"{target} is inherited from {actual}, not from {declared} (`inherited_from`): the value the patch "
            f"overrides is {actual}'s; re-read it and declare inherited_from: {actual}")

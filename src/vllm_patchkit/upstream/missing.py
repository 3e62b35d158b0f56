"""A target that is not there, as a static or live reading finds it: shared by `check` and the loader's
signature comparison (sigdiff), so both say the same thing about an absent place."""

from __future__ import annotations

from typing import Optional

from msgspec import Struct


class Missing(Struct, frozen=True):
    """A target that is not there: why, and where a definition of the same name now lives."""

    spec: str
    reason: str
    moved_to: tuple[str, ...] = ()
    unreadable: bool = False  # found, but defined outside the release (cannot be read statically)
    # the class still has the attribute, but only through a base: the base's definition (`module:Base.attr`)
    inherited_from: Optional[str] = None

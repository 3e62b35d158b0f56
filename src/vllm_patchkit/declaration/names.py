"""The two names every layer passes around, parsed in one place: a target `module:Qualname` and a patch key
`id@version`.

Each was split by hand where it was read (`partition(":")`, `rpartition(".")`, `split("@")`), each site its own
idea of the form. Here the form is said once, a malformed name is refused with the name and the form expected,
and a name is parsed once per process (the parse is cached: this runs at vLLM start-up in every process).
NamedTuples, not dataclasses: cheap to build, unpackable (`module, qualname = Target.parse(s)`)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Optional


class Target(NamedTuple):
    """A place in an importable module: `vllm.v1.core.sched.scheduler:Scheduler._free_request`."""

    module: str
    qualname: str

    @staticmethod
    def parse(text: str) -> "Target":
        """`module:Qualname` -> Target; ValueError naming `text` when it is not of that form."""
        return _target(text)

    @property
    def owner(self) -> Optional[str]:
        """The qualname's parent (`Class` for `Class.meth`), None for a module-level name."""
        return self.qualname.rpartition(".")[0] or None

    @property
    def owner_target(self) -> Optional["Target"]:
        """`module:Class` for `module:Class.meth`, None for a module-level name."""
        owner = self.owner
        return None if owner is None else Target(self.module, owner)

    @property
    def attr(self) -> str:
        """The last name of the qualname (`meth` for `Class.meth`, `f` for `f`)."""
        return self.qualname.rpartition(".")[2]

    @property
    def is_member(self) -> bool:
        """A name inside a class (or another object), not a module-level one."""
        return "." in self.qualname

    @property
    def parts(self) -> list[str]:
        """The qualname's names, outermost first (`["Class", "meth"]`)."""
        return self.qualname.split(".")

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


class PatchKey(NamedTuple):
    """One version of one patch: `stats-scheduler@3`."""

    id: str
    version: int

    @staticmethod
    def parse(text: str) -> "PatchKey":
        """`id@version` -> PatchKey; ValueError naming `text` when it is not of that form."""
        return _patch_key(text)

    def __str__(self) -> str:
        """The canonical key (`Patch.key`'s form: `x@03` reads as version 3 and prints `x@3`)."""
        return f"{self.id}@{self.version}"


@lru_cache(maxsize=None)
def _target(text: str) -> Target:
    module, sep, qualname = text.partition(":")
    if not sep or not module or not qualname or ":" in qualname:
        raise ValueError(f"{text!r} is not a target: expected the form module:Qualname")
    return Target(module, qualname)


@lru_cache(maxsize=None)
def _patch_key(text: str) -> PatchKey:
    patch_id, sep, version = text.partition("@")
    if not sep or not patch_id or not (version.isascii() and version.isdigit()):
        raise ValueError(f"{text!r} is not a patch key: expected the form id@version (a whole number)")
    return PatchKey(patch_id, int(version))

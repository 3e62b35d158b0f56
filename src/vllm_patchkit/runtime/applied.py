"""What a patch changed in this process, kept so that undo puts back the exact original objects."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

from msgspec import Struct, field

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.wrappers import MARK, Counter
from vllm_patchkit.upstream.targets import Place, TargetError, resolve

log = logging.getLogger("vllm.patchkit")

#: (id of the owner, attribute) -> the key of the `set` patch that wrote it in this process. A value carries no
#: mark, and vLLM may define the very value a patch sets (0.32.0's Step3p5ToolParser.structural_tag_model):
#: only this tells "set by an earlier loader here" from "upstream defines it now".
SET_BY: dict[tuple[int, str], str] = {}
#: (id of the mapping, key) -> the key of the `register` patch that set that entry in this process (as SET_BY)
ENTRY_BY: dict[tuple[int, str], str] = {}


class Applied(Struct):
    """What was changed, so unpatch() can put back the exact original objects."""

    patch: Patch
    places: list[tuple[Place, Any]] = field(default_factory=list)  # (place, original raw)
    env: Optional[tuple[str, Optional[str]]] = None  # (name, previous value)
    counter: Counter = field(default_factory=Counter)

    late_copies: list[str] = field(default_factory=list)  # declared copies not imported at install time
    instances: Any = None  # `instances: true`: the objects patched at construction (weakly held)
    installed: Any = None  # the function we installed
    original: Any = None
    ctx: Any = None  # the PatchContext its implementation is handed (a wrap with an implementation)
    restore: Optional[Callable[[], None]] = None  # run last by undo (an instances `set`: the objects made meanwhile)

    def undo(self) -> None:
        for place, original in reversed(self.places):
            place.set_raw(original)
            if SET_BY.get((id(place.owner), place.attr)) == self.patch.key:
                del SET_BY[(id(place.owner), place.attr)]
        method = self.patch.target.rpartition(".")[2] if self.patch.instances else None
        for obj in list(self.instances or ()) if not traits(self.patch).sets_value else ():
            # objects made while patched: back to the class's method
            bound = obj.__dict__.get(method)
            if getattr(getattr(bound, "__func__", None), MARK, None) == self.patch.key:
                del obj.__dict__[method]

        for spec in self.late_copies:  # imported after install: they took our wrapper by value
            try:
                place = resolve(spec, import_module=False)
            except TargetError:
                continue
            if place.get_raw() is self.installed:
                place.set_raw(self.original)
        if self.restore is not None:
            self.restore()
        if self.env is not None:
            name, previous = self.env
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous

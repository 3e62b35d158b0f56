"""PatchContext: everything a `wrap` implementation needs, handed to it instead of found by it.

A `wrap` implementation is called `impl(wrapped, instance, args, kwargs, ctx)`.
The context is one object per applied patch per process (the loader makes it
at apply time): it reads declared parameters however vLLM passed them, keeps
cheap counters and rare notes for the patch's record, refuses start-up,
judges the patch's own YAML `when`, and hands out the upstream helpers it
`uses`. So a patch module holds no YAML parsing, no process state and no
framework internals: what it needs changes in the YAML, not in its code.
Outside the plugin (a test calling the implementation), `PatchContext.detached`
gives the same API; counters and notes then stay on the context.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Optional

from vllm_patchkit.declaration.errors import PatchkitError, Refusal
from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch

log = logging.getLogger("vllm.patchkit")

MISSING: Any = object()
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def live_target(spec: str) -> tuple[Callable, bool]:
    """The function at `spec` and whether its first parameter is the instance (method, classmethod, property)."""
    from vllm_patchkit.upstream.targets import function_of, resolve

    place = resolve(spec)
    raw = place.get_raw()
    return function_of(raw), place.owner_is_class and not isinstance(raw, staticmethod)


class PatchContext:
    """One applied patch's view of its declaration, its target and its record (see the module docstring)."""

    __slots__ = ("patch", "record", "refused", "_flush", "_counts", "_notes", "_slots", "_target")

    def __init__(self, patch: Patch, *, record: Any = None, flush: Optional[Callable[[], Any]] = None):
        self.patch = patch
        self.record = record  # the loader's PatchRecord, or None (detached)
        self.refused: Optional[str] = None
        self._flush = flush
        self._counts: dict[str, int] = {}
        self._notes: dict[str, Any] = {}
        self._slots: Optional[dict[str, tuple[Optional[int], Any]]] = None
        self._target: Optional[tuple[Callable, bool]] = None

    @classmethod
    def detached(cls, patch: Patch) -> "PatchContext":
        """A context with no loader: for tests and hand-installed patches (the target is resolved on first use)."""
        return cls(patch)

    def bind_target(self, function: Callable, bound: bool) -> None:
        """Set at install: the original function and whether vLLM passes the instance first."""
        self._target, self._slots = (function, bound), None

    # -- declared parameters -------------------------------------------------
    def _layout(self) -> dict[str, tuple[Optional[int], Any]]:
        """Position (instance excluded; None: keyword-only) and upstream default of each declared param."""
        if self._target is None:
            self._target = live_target(self.patch.target)
        function, bound = self._target
        sig = inspect.signature(function)
        params = list(sig.parameters.values())[1 if bound else 0:]
        by_name = {p.name: (i, p) for i, p in enumerate(params)}
        slots = {}
        for name in self.patch.params:
            if name not in by_name:
                raise PatchkitError(f"vllm-patchkit: {self.patch.key}: declared parameter {name!r} is not a parameter "
                                    f"of {self.patch.target}{sig}")
            i, p = by_name[name]
            slots[name] = (i if p.kind in _POSITIONAL else None, MISSING if p.default is p.empty else p.default)
        self._slots = slots
        return slots

    def _slot(self, name: str) -> tuple[Optional[int], Any]:
        slots = self._slots if self._slots is not None else self._layout()
        slot = slots.get(name)
        if slot is None:
            raise PatchkitError(f"vllm-patchkit: {self.patch.key}: parameter {name!r} is not declared in its "
                                f"`params` ({list(self.patch.params)}); declare every target parameter it reads")
        return slot

    def arg(self, args: tuple, kwargs: dict, name: str, default: Any = MISSING) -> Any:
        """The value of declared parameter `name` in this call, however it was passed (else its default)."""
        pos, upstream_default = self._slot(name)
        if pos is not None and pos < len(args):
            return args[pos]
        if name in kwargs:
            return kwargs[name]
        if default is not MISSING:
            return default
        if upstream_default is not MISSING:
            return upstream_default
        raise PatchkitError(f"vllm-patchkit: {self.patch.key}: parameter {name!r} was not passed and has no default")

    def with_arg(self, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[tuple, dict]:
        """The same call with `name` set to `value`: in its slot if passed positionally, else by keyword."""
        pos, _ = self._slot(name)
        if pos is not None and pos < len(args):
            return args[:pos] + (value,) + args[pos + 1:], kwargs
        return args, {**kwargs, name: value}

    # -- the record ----------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        """Add to a counter (cheap: one dict update). `a.b` counts into detail["a"]["b"] at flush."""
        counts = self._counts
        counts[name] = counts.get(name, 0) + n

    @property
    def counts(self) -> dict[str, Any]:
        """The counters as the record's detail shows them."""
        out: dict[str, Any] = {}
        for name, n in list(self._counts.items()):  # list(): atomic copy, the flush thread may read mid-step
            head, dot, tail = name.partition(".")
            if dot:
                out.setdefault(head, {})[tail] = n
            else:
                out[name] = n
        return out

    @property
    def notes(self) -> dict[str, Any]:
        """What `note` recorded so far (a copy)."""
        return dict(self._notes)

    def publish(self, detail: dict) -> None:
        """Copy the counters into a record's detail (the loader calls this at every flush)."""
        detail.update(self.counts)

    def note(self, flush: bool = True, **detail: Any) -> None:
        """Rare decisions (start-up numbers, one line per runner) into the record's detail."""
        self._notes.update(detail)
        if self.record is not None:
            self.record.detail.update(detail)
            self.publish(self.record.detail)  # the counters with it, even where records are not written
            if flush and self._flush is not None:
                self._flush()

    def refuse(self, message: str, exc: Any = Refusal) -> None:
        """Mark the record refused, flush, and raise `exc` (a class, given the message, or an instance)."""
        self.refused = message
        if self.record is not None:
            self.record.set("refused", FailureCode.refused, message)
            self.publish(self.record.detail)
            if self._flush is not None:
                self._flush()
        log.error("vllm-patchkit: %s refused: %s", self.patch.key, message)
        raise exc if isinstance(exc, BaseException) else exc(message)

    # -- the declaration ------------------------------------------------------
    def holds_for(self, model_config: Any, served_module: Optional[str] = None) -> tuple[bool, str]:
        """Does the patch's `when` (architectures, served_by) hold for this model? (answer, one-line reason).

        `served_module`: the module of the class actually serving it (a loaded model); default:
        what vLLM's registry resolves the architecture to.
        """
        from vllm_patchkit.declaration.preconditions import served_by_module, served_ok

        when = self.patch.when
        archs = list(getattr(model_config, "architectures", None) or [])
        matched = archs if when.architectures is None else [a for a in archs if a in when.architectures]
        if not matched:
            return False, f"architectures {archs} not in {sorted(when.architectures or [])}"
        arch = matched[0]
        if when.served_by is None:
            return True, f"architecture {arch}"
        module = served_module if served_module is not None else served_by_module(arch)
        if not served_ok(when.served_by, module):
            return False, f"{arch} served by {module}, not {when.served_by}"
        return True, f"{arch} served by {module}"

    def use(self, name: str) -> Any:
        """The upstream object of the `uses:` entry whose last name component is `name` (pinned, verified)."""
        from vllm_patchkit.upstream.targets import resolve

        for spec in self.patch.uses:
            if Target.parse(spec).attr == name:
                place = resolve(spec)
                return getattr(place.owner, place.attr)
        raise PatchkitError(f"vllm-patchkit: {self.patch.key}: {name!r} is not among its `uses` "
                            f"({list(self.patch.uses)})")

    def __repr__(self) -> str:
        return f"<PatchContext {self.patch.key} {'attached' if self.record is not None else 'detached'}>"


__all__ = ["MISSING", "PatchContext", "live_target"]

"""Kind `subclass`: a subclass of a vLLM class that vLLM itself selects through a VllmConfig field.

Plugins override vLLM methods by subclassing (ATOM's Scheduler subclasses) and make vLLM use the
subclass by writing a config field (`SchedulerConfig.scheduler_cls`). By hand that fails quietly:
an override whose base method changed signature breaks only when vLLM calls it; a field someone
else already set gets overwritten; a class that is selected but never built changes nothing. Here:

- verify (import of the subclass, each listed override defined on the subclass side and taking the
  base method's pinned signature, no undeclared override of a base method another patch pins) runs
  with the other patches' verification, before anything is installed;
- `select` judges the field on the process's VllmConfig: vLLM's default (or a value naming the base
  itself) is replaced; our class already there is "already"; anything else is a `conflict`, never
  overwritten; a base vLLM would not build here (AsyncScheduler instead of Scheduler) is a skip;
- `install` sets the field, counts the subclass's constructions (its own `__init__`, marked as ours)
  and `undo` puts back the exact previous value and `__init__`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

from msgspec import Struct

from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.wrappers import MARK, ours
from vllm_patchkit.upstream.targets import function_of
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.pinned import compare as _compare
from vllm_patchkit.upstream.targets import MISSING, Place, TargetError, load_object, resolve

#: how vLLM turns a field into the class it builds: field path -> the config method it calls
#: (vllm/v1/engine/core.py: `vllm_config.scheduler_config.get_scheduler_cls()`, right before
#: `Scheduler(...)`). A field not listed here is judged by its value alone.
SELECTORS: dict[str, str] = {"scheduler_config.scheduler_cls": "scheduler_config.get_scheduler_cls"}


def dotted(cls: type) -> str:
    """The `module.Qualname` form vLLM's config fields accept for a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def spec_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _finding(code: str, reason: str, expected: Any = None, found: Any = None) -> Finding:
    return Finding(code, reason, expected, found)


# -- verify -------------------------------------------------------------------------------------
def check(patch: Patch, entry: Optional[ManifestEntry], place: Place,
          pinned_elsewhere: Optional[dict[str, list[str]]] = None):
    """The subclass against its base: returns (implementation class, None) or (None, Finding).

    `pinned_elsewhere`: pinned place -> keys of the patches pinning it (the loader's whole plan);
    an override of one of those places that `overrides` does not list is `undeclared_override`.
    """
    base = place.get_raw()
    if not isinstance(base, type):
        return None, _finding("kind", f"{patch.target} is a {type(base).__name__}, not a class: kind "
                                      f"{patch.kind.value} needs the base class vLLM would build", "a class", type(base).__name__)
    for name in patch.overrides:
        spec = f"{patch.target}.{name}"
        try:
            where = resolve(spec)
        except TargetError as exc:
            where = inherited_place(base, name)  # the base inherits it: pinned as its definer has it
            if where is None:
                return None, _finding("target", f"listed override {name!r} has no base method: {exc}", spec,
                                      "missing")
        pin = entry.targets.get(spec) if entry is not None else None
        if pin is None:
            return None, _finding("unpinned", f"{spec} (a base method {patch.key} overrides) has no pin in the "
                                              "manifest", "a pinned fingerprint", None)
        raw = where.get_raw()
        bad = _compare(spec, pin, fp.live(raw, True, with_digest=pin.source_digest is not None), raw, patch)
        if bad is not None:
            return None, bad
    try:
        impl = load_object(patch.implementation)
    except TargetError as exc:
        return None, _finding("implementation", f"implementation {patch.implementation}: {exc}", "importable",
                              "error")
    if not isinstance(impl, type) or not issubclass(impl, base):
        found = (f"bases {[spec_of(c) for c in impl.__mro__[1:-1]]}" if isinstance(impl, type)
                 else type(impl).__name__)
        return None, _finding("implementation", f"implementation {patch.implementation} is not a subclass of "
                                                f"{patch.target}", f"a subclass of {patch.target}", found)
    own = own_side(impl, base)
    for name in patch.overrides:
        bad = _override_problem(patch, impl, own, name, entry.targets[f"{patch.target}.{name}"])
        if bad is not None:
            return None, bad
    bad = _undeclared(patch, own, base, pinned_elsewhere or {})
    return (impl, None) if bad is None else (None, bad)


def inherited_place(base: type, name: str) -> Optional[Place]:
    """Where the base class's `name` is defined when the base only inherits it (its MRO's first definer)."""
    definer = next((c for c in base.__mro__[1:] if name in c.__dict__), None)
    if definer is None or definer is object:
        return None
    return Place(f"{spec_of(definer)}.{name}", definer, name)


def own_side(impl: type, base: type) -> list[type]:
    """The implementation and its mixins: the classes of its MRO that are not the base or above it."""
    return [c for c in impl.__mro__ if c not in base.__mro__]


def _override_problem(patch: Patch, impl: type, own: list[type], name: str, pin):
    definer = next((c for c in own if name in c.__dict__), None)
    if definer is None:
        came = next((c for c in impl.__mro__ if name in c.__dict__), None)
        return _finding("override", f"{patch.implementation} does not override {name!r}: it inherits it from "
                                    f"{spec_of(came) if came else 'nowhere'}, so `overrides` lists an override "
                                    "that is not there", f"{name} defined on {patch.implementation} (or a mixin of it)",
                        f"inherited from {spec_of(came)}" if came else "missing")
    raw = definer.__dict__[name]
    kind = fp.raw_kind(raw, True)
    if kind != pin.kind:
        return _finding("convention", f"{spec_of(definer)}.{name} is a {kind} where the base's is a {pin.kind}: "
                                      "vLLM's calls bind differently", pin.kind, kind)
    func = function_of(raw)
    found = convention.problems(func, pin.signature, shape="replace", name=f"{spec_of(definer)}.{name}",
                                target_kind=pin.kind, calls=convention.pinned_calls(pin))
    if found and name == "__init__":
        judged = judge_constructor(patch, func)
        if judged is not None:
            found = judged
    if found:
        return _finding("convention", f"override of {patch.target}.{name}: {convention.reason(found)}",
                        pin.signature, convention.signature_text(function_of(raw)))
    return None


def judge_constructor(patch: Patch, init: Any, calls=None) -> Optional[list]:
    """A subclass `__init__` judged against the constructions vLLM really makes (`callsites.py`): [] when it
    takes every one, the problems of those it rejects; None when no call can be judged (none found, or one
    passes *args/**kwargs): then the base's signature decides."""
    import inspect

    from vllm_patchkit.upstream import callsites

    if calls is None:
        calls = callsites.installed(patch.config_field, SELECTORS.get(patch.config_field))
    if not calls or not all(c.judgeable for c in calls):
        return None
    try:
        sig = inspect.signature(init) if not isinstance(init, inspect.Signature) else init
    except (TypeError, ValueError):
        return None
    out = []
    for c in calls:
        why = callsites.accepts(sig, c)
        if why is not None:
            out.append(Finding("constructed", f"vLLM constructs {patch.config_field}'s class as "
                                          f"Cls{c.text()} at {c.where}: {patch.implementation}.__init__"
                                          f"{convention.signature_text(sig)} rejects it ({why})"))
    return out


def _undeclared(patch: Patch, own: list[type], base: type, pinned: dict[str, list[str]]):
    """Only overrides of base methods another patch pins: those are the ones a silent override hurts."""
    for cls in own:
        for name, raw in cls.__dict__.items():
            if name in patch.overrides or ours(raw) is not None:
                continue
            for b in base.__mro__[:-1]:
                spec = f"{spec_of(b)}.{name}"
                others = [k for k in pinned.get(spec, ()) if k != patch.key]
                if name in b.__dict__ and others:
                    return _finding("undeclared_override",
                                    f"{spec_of(cls)} overrides {name!r}, which {', '.join(others)} pin(s) as {spec}, "
                                    f"but `overrides` does not list it: list it (its signature is then checked "
                                    "against the base's pin)", list(patch.overrides), name)
    return None


# -- the field ----------------------------------------------------------------------------------
class Selection(Struct):
    """The field on this process's VllmConfig, what it held and what will be set."""

    owner: Any
    attr: str
    previous: Any
    value: Any
    resolver: Optional[Callable[[], Any]] = None
    already: bool = False
    skip: Any = None  # a Finding when the base is not what vLLM builds here: not needed in this process


def _walk(vllm_config: Any, path: str):
    """(owner object, attribute, field default) of a dotted VllmConfig field; a Finding when it is absent."""
    parts = path.split(".")
    owner = vllm_config
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else None
        known = part in fields if fields is not None else hasattr(owner, part)
        if not known:
            where = ".".join(["VllmConfig", *parts[:i]])
            return _finding("config_field", f"config_field {path}: {where} has no field {part!r}",
                            "a field of the VllmConfig", "missing")
        if i == len(parts) - 1:
            f = fields.get(part) if fields is not None else None
            default = f.default if f is not None and f.default is not dataclasses.MISSING else None
            return owner, part, default
        owner = getattr(owner, part)


def _names(value: Any, cls: type) -> bool:
    return value is cls or (isinstance(value, str) and value == dotted(cls))


def _resolver(vllm_config: Any, field_path: str) -> Optional[Callable[[], Any]]:
    method = SELECTORS.get(field_path)
    if method is None:
        return None
    obj = vllm_config
    for part in method.split("."):
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def select(patch: Patch, vllm_config: Any, impl: type, base: type):
    """Judge the field before anything is installed: a Selection, or a Finding (`conflict`, `config_field`)."""
    if vllm_config is None:
        return _finding("config_field", f"no VllmConfig in this process to set {patch.config_field} on",
                        "the config stage's VllmConfig", None)
    walked = _walk(vllm_config, patch.config_field)
    if not isinstance(walked, tuple):
        return walked
    owner, attr, default = walked
    current = getattr(owner, attr)
    value = dotted(impl) if isinstance(current, str) else impl  # a field holding a string keeps holding one
    sel = Selection(owner, attr, current, value, _resolver(vllm_config, patch.config_field))
    if _names(current, impl):
        sel.already = True
        return sel
    if not (current == default or _names(current, base)):
        return _finding("conflict", f"{patch.config_field} holds {current!r} (another plugin's class or the "
                                    f"user's choice), not vLLM's default {default!r} or {patch.target}: refusing to "
                                    "overwrite it", f"{default!r} or {dotted(base)}", repr(current))
    if sel.resolver is not None:
        try:
            chosen = sel.resolver()
        except Exception as exc:  # vLLM's own resolution failing is data here
            return _finding("config_field", f"vLLM cannot resolve {patch.config_field}={current!r}: "
                                            f"{type(exc).__name__}: {exc}", dotted(base), repr(current))
        if chosen is not base:
            sel.skip = _finding("not_selected", f"with {patch.config_field}={current!r} vLLM builds "
                                                f"{spec_of(chosen)} here, not the declared base {patch.target}: "
                                                "the subclass would replace a different class",
                                patch.target, spec_of(chosen))
    return sel


# -- apply --------------------------------------------------------------------------------------
class SubclassApplied(Applied):
    """Undo puts back the subclass's own `__init__` (Applied.places) and the field's previous value."""

    selection: Optional[Selection] = None

    def undo(self) -> None:
        super().undo()
        sel = self.selection
        if sel is not None and getattr(sel.owner, sel.attr) is sel.value:  # someone else's later value is kept
            setattr(sel.owner, sel.attr, sel.previous)


def _counting_init(patch: Patch, impl: type, own: Any, counter) -> Callable:
    """The subclass's `__init__`, counting constructions; the inherited one is reached through super()."""
    if own is not MISSING:
        original = function_of(own)

        def __init__(self, *args, **kwargs):
            counter.calls += 1
            original(self, *args, **kwargs)
    else:
        original = impl.__init__

        def __init__(self, *args, **kwargs):
            counter.calls += 1
            super(impl, self).__init__(*args, **kwargs)
    functools.update_wrapper(__init__, original)
    __init__.__wrapped__ = original
    __init__.__qualname__ = f"{impl.__qualname__}.__init__"
    setattr(__init__, MARK, patch.key)
    return __init__


def install(patch: Patch, impl: type, sel: Selection, count: bool) -> SubclassApplied:
    applied = SubclassApplied(patch, selection=sel)
    if count:
        where = Place(f"{impl.__module__}:{impl.__qualname__}.__init__", impl, "__init__")
        raw = where.get_raw()
        where.set_raw(_counting_init(patch, impl, raw, applied.counter))
        applied.places.append((where, raw))
    setattr(sel.owner, sel.attr, sel.value)
    chosen = sel.resolver() if sel.resolver is not None else impl
    if chosen is not impl:  # vLLM's own resolution must now give the subclass
        applied.undo()
        raise RuntimeError(f"after setting {patch.config_field} vLLM still selects {spec_of(chosen)}")
    return applied


def describe(patch: Patch, sel: Selection) -> dict:
    return {"config_field": patch.config_field, "selects": patch.implementation, "previous": repr(sel.previous)}


__all__ = ["SELECTORS", "Selection", "SubclassApplied", "check", "install", "select"]

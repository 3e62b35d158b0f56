"""Convention: the implementation must take the calls vLLM makes, in the shape its kind promises.

A `wrap` implementation is called `impl(wrapped, instance, args, kwargs[, ctx])`
(wrapt's vocabulary): vLLM's arguments arrive as one tuple and one dict, so any
call vLLM makes fits, and what is judged is the shape (4 or 5 positional
parameters) and the parameters the patch declares it reads (`params:`), each of
which must be a parameter of the target's pinned signature. A `replace`
implementation is called exactly like the target, `impl(*args, **kwargs)`: a
replacement written against the wrong signature (a parameter renamed, dropped,
reordered or made required) breaks only when vLLM makes the call it rejects — a
keyword call from another rank, a call that leaves out a defaulted argument —
long after the loader said "applied", so all its parameters are compared with
the pinned signature.

Every mismatch is one `Finding` (code, where: the parameter, reason); `verify`
turns them into a `convention` finding, and `problems_for` serves the `check`
command.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Union

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.upstream.call_facts import pinned_calls  # noqa: F401 (re-exported: callers name it here)
from vllm_patchkit.upstream.findings import Finding

POSONLY, POSKW, VARPOS, KWONLY, VARKW = (
    "positional-only", "positional-or-keyword", "var-positional", "keyword-only", "var-keyword")

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: POSONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: POSKW,
    inspect.Parameter.VAR_POSITIONAL: VARPOS,
    inspect.Parameter.KEYWORD_ONLY: KWONLY,
    inspect.Parameter.VAR_KEYWORD: VARKW,
}


def _signatures():
    """The signature parser (`sigdiff.parse_signature`, `Param`), imported when a convention is first judged."""
    from vllm_patchkit.upstream import sigdiff

    return sigdiff


def signature_text(impl: Any) -> Optional[str]:
    """`(wrapped, instance, args, kwargs, ctx)`: the implementation's signature without annotations."""
    try:
        sig = impl if isinstance(impl, inspect.Signature) else inspect.signature(impl)
    except (TypeError, ValueError):
        return None
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=inspect.Signature.empty))


def _label(impl: Any) -> str:
    module = getattr(impl, "__module__", None)
    qual = getattr(impl, "__qualname__", None) or getattr(impl, "__name__", None)
    if module and qual:
        return f"{module}:{qual}"
    return repr(impl)[:80]


def _params(sig: inspect.Signature) -> list:
    Param = _signatures().Param
    out, pos = [], 0
    for p in sig.parameters.values():
        kind = _KINDS[p.kind]
        default = None if p.default is p.empty else repr(p.default)
        if kind in (POSONLY, POSKW):
            out.append(Param(p.name, kind, default, pos))
            pos += 1
        else:
            out.append(Param(p.name, kind, default, None))
    return out


def wrap_takes_context(impl: Any) -> Optional[bool]:
    """The shape of a wrap implementation: False for `(wrapped, instance, args, kwargs)`, True with a 5th
    `ctx`; None when it cannot be called that way (or its signature cannot be read)."""
    try:
        sig = impl if isinstance(impl, inspect.Signature) else inspect.signature(impl)
    except (TypeError, ValueError):
        return None
    P = inspect.Parameter
    positional = [p for p in sig.parameters.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == P.VAR_POSITIONAL for p in sig.parameters.values()):
        return None
    if any(p.kind == P.KEYWORD_ONLY and p.default is p.empty for p in sig.parameters.values()):
        return None
    return {4: False, 5: True}.get(len(positional))


def _forwards_everything(sig: inspect.Signature) -> bool:
    """`(*args, **kwargs)`: a replacement that takes any call."""
    P = inspect.Parameter
    return [p.kind for p in sig.parameters.values()] == [P.VAR_POSITIONAL, P.VAR_KEYWORD]


def _wrap_problems(who: str, sig: inspect.Signature, target_signature: str, params: tuple, patch: Optional[str],
                   target_kind: Optional[str]) -> list[Finding]:
    """A wrap: the 4/5-parameter shape, and every declared param a parameter of the target."""
    out = []
    if wrap_takes_context(sig) is None:
        out.append(Finding("shape", f"{who} cannot be called as impl(wrapped, instance, args, kwargs) or "
                                    f"impl(wrapped, instance, args, kwargs, ctx): a wrap takes exactly 4 positional "
                                    f"parameters, or 5 to get the context; its signature is {signature_text(sig)}"))
    if params:
        target = _signatures().parse_signature(target_signature)
        if target is None:
            return out
        names = [p.name for p in target if p.kind not in (VARPOS, VARKW)]
        first = target[0] if target and target[0].positional else None
        if first is not None and (target_kind in ("method", "classmethod") or (
                target_kind not in ("function", "staticmethod") and first.name in ("self", "cls"))):
            names = [n for n in names if n != first.name]  # the instance: `instance`, never a declared parameter
        for name in params:
            if name not in names:
                out.append(Finding("unknown_param", f"patch {patch or '?'} declares parameter '{name}' in `params`, "
                                   f"but the target's signature {target_signature} has no such parameter"
                                   + (" (the instance is `instance`, not a parameter)"
                                      if target and name == target[0].name else ""), where=name))
    return out


def problems(impl: Union[Any, inspect.Signature], target_signature: str, *, shape: str = "wrap",
             name: Optional[str] = None, target_kind: Optional[str] = None, params: Union[tuple, list] = (),
             patch: Optional[str] = None, calls: Optional[tuple] = None) -> list[Finding]:
    """Every way the implementation would reject (or misbind) a call the target accepts.

    `impl`: the implementation callable, or its `inspect.Signature`; `shape`: its kind's call shape
    (declaration/kinds.py), "wrap" (called as impl(wrapped, instance, args, kwargs[, ctx])) or "replace"
    (impl(*args, **kwargs)); `name`: how
    messages name it (`module:qualname`); `target_kind`: the pinned kind ("method"/"classmethod": the
    first parameter is bound by Python, never passed by keyword); `params`: a wrap's declared parameters,
    `patch`: its key (messages name it); `calls` (a replace): (the most positional arguments, the keywords)
    vLLM's calls to the target pass, as pinned (`tools/static_calls.py`): a call the target admits but vLLM never
    makes is not held against the implementation; None: every call the signature admits is judged. An empty
    list: it fits. A signature that cannot be read or parsed is not judged (empty list).
    """
    if not target_signature:
        return []
    try:
        sig = impl if isinstance(impl, inspect.Signature) else inspect.signature(impl)
    except (TypeError, ValueError):
        return []
    who = f"implementation {name or _label(impl)}"
    if shape == "wrap":
        return _wrap_problems(who, sig, target_signature, tuple(params), patch, target_kind)
    if _forwards_everything(sig):
        return []  # fits any target; and the plugin's start-up need not load the signature parser
    target = _signatures().parse_signature(target_signature)
    if target is None:
        return []
    found = _compare(who, target, _params(sig), target_kind)
    if calls is None:
        return found
    from vllm_patchkit.upstream.call_facts import never_called

    return [f for f in found if not never_called(f, target, calls, target_kind)]


def _compare(who: str, target: list, impl: list, target_kind: Optional[str]) -> list[Finding]:
    """Every call the target takes that the implementation would reject or misbind: the target's parameters
    one by one (how vLLM passes each), then the implementation's own (what it wants that vLLM never passes)."""
    binding = _Binding(who, target, impl, target_kind)
    for p in target:
        binding.target_param(p)
    for q in impl:
        binding.impl_param(q)
    return binding.out


def _default_of(p) -> str:
    return f", default {p.default}" if p.default is not None else ""


class _Binding:
    """The two parameter lists compared, one method per way a call can fail; the findings accumulate in `out`
    in the order they are found, and what one parameter's finding said is not said again for another."""

    def __init__(self, who: str, target: list, impl: list, target_kind: Optional[str]) -> None:
        self.who, self.target, self.out = who, target, []
        self.t_pos = [p for p in target if p.positional]
        self.t_names = {p.name for p in target if p.kind not in (VARPOS, VARKW)}
        self.t_by_name = {p.name: p for p in target if p.kind not in (VARPOS, VARKW)}
        self.t_var = next((p for p in target if p.kind == VARPOS), None)
        self.i_pos = [q for q in impl if q.positional]
        self.i_var = next((q for q in impl if q.kind == VARPOS), None)
        self.i_varkw = next((q for q in impl if q.kind == VARKW), None)
        self.i_named = {q.name: q for q in impl if q.kind not in (VARPOS, VARKW)}
        self.i_by_kw = {q.name: q for q in impl if q.kind in (POSKW, KWONLY)}
        if target_kind is not None:
            bound_first = target_kind in ("method", "classmethod")
        else:
            bound_first = bool(self.t_pos) and self.t_pos[0].name in ("self", "cls")
        self.first = self.t_pos[0].name if bound_first and self.t_pos else None  # bound by Python, never passed
        self.renamed_to: set[str] = set()  # implementation names reported as a target parameter's new name
        self.misplaced: set[str] = set()  # implementation names reported at another parameter's position
        self.reordered: set[str] = set()  # target names whose position another implementation parameter holds

    def add(self, code: str, param: str, msg: str) -> None:
        self.out.append(Finding(code, f"{self.who} {msg}", where=param))

    def made_required(self, p, as_name: Optional[str] = None) -> None:
        as_ = f"as '{as_name}'; " if as_name is not None else ""
        self.add("made_required", p.name, f"makes parameter '{p.name}' required ({as_}the target's default is "
                                          f"{p.default}): vLLM's call without it raises TypeError")

    # -- the target's parameters: how vLLM passes each -----------------------------------------------------
    def target_param(self, p) -> None:
        if p.kind == VARPOS:
            self.varargs(p)
        elif p.kind == VARKW:
            self.varkw(p)
        elif p.kind == KWONLY:
            self.keyword_only(p)
        elif not self.renamed(p):  # a positional parameter: passed at its position, or (positional-or-keyword) by name
            self.positional(p)

    def varargs(self, p) -> None:
        if self.i_var is None:
            self.add("no_varargs", p.name,
                     f"has no *args where the target has *{p.name}: vLLM's call with more than {len(self.t_pos)} "
                     "positional arguments raises TypeError")

    def varkw(self, p) -> None:
        if self.i_varkw is None:
            self.add("no_varkw", p.name,
                     f"has no **kwargs where the target has **{p.name}: vLLM's call with any other keyword "
                     "argument raises TypeError")

    def keyword_only(self, p) -> None:
        by_kw = self.i_by_kw.get(p.name)
        if by_kw is None and (self.i_varkw is None or p.name in self.i_named):  # (a positional-only namesake is missed)
            self.add("kwonly_not_accepted", p.name,
                     f"does not accept keyword-only parameter '{p.name}' (the target takes it by keyword"
                     f"{_default_of(p)}): vLLM's keyword call raises TypeError")
        elif by_kw is not None and p.default is not None and by_kw.default is None:
            self.made_required(p)

    def slot(self, p):
        """The implementation's parameter at the target parameter's position (None: it has fewer)."""
        return self.i_pos[p.position] if p.position < len(self.i_pos) else None

    def renamed(self, p) -> bool:
        """The implementation takes the target's parameter at its position under a name the target does not have:
        said here (a positional-only one may take any name), and nothing else about it (True)."""
        slot = self.slot(p)
        if slot is None or slot.name == p.name or slot.name in self.t_names:
            return False
        if p.kind == POSKW and p.name not in self.i_named:
            self.renamed_to.add(slot.name)
            if self.i_varkw is None:
                why = f"vLLM's keyword call {p.name}=... raises TypeError"
            else:
                left = "unset (TypeError)" if slot.default is None else f"at its default {slot.default}"
                why = f"vLLM's keyword call {p.name}=... lands in **{self.i_varkw.name} and leaves '{slot.name}' {left}"
            self.add("renamed", p.name, f"renamed parameter '{p.name}' to '{slot.name}' (position {p.position}): {why}")
        elif p.kind == POSONLY:
            self.renamed_to.add(slot.name)  # callers cannot name a positional-only parameter: any name takes it
        else:
            return False
        if p.default is not None and slot.default is None and p.name != self.first:
            self.made_required(p, as_name=slot.name)
        return True

    def positional(self, p) -> None:
        slot = self.slot(p)
        if p.name not in self.i_named and self.i_var is None and self.i_varkw is None:
            self.add("dropped", p.name,
                     f"does not accept parameter '{p.name}' (the target takes it at position {p.position}"
                     f"{_default_of(p)}): vLLM's call passing it raises TypeError")
        self.position_taken(p, slot)
        by_kw = self.i_by_kw.get(p.name)
        self.keyword_taken(p, by_kw)
        receiver = by_kw if by_kw is not None else (slot if slot is not None and slot.name == p.name else None)
        if receiver is not None and p.default is not None and receiver.default is None and p.name != self.first:
            self.made_required(p)

    def position_taken(self, p, slot) -> None:
        """vLLM's positional call: the value lands in the implementation's parameter of that name."""
        i = p.position
        if slot is not None and slot.name != p.name and (p.kind == POSKW or slot.name in self.t_names):
            self.misplaced.add(slot.name)
            self.reordered.add(p.name)
            self.add("reordered", p.name,
                     f"takes '{slot.name}' at position {i} where the target takes '{p.name}': vLLM's positional call "
                     f"binds the value of '{p.name}' to '{slot.name}'")
        elif slot is None and p.name not in self.misplaced:
            mine = self.i_named.get(p.name)
            if self.i_var is not None:
                if mine is not None and mine.kind == KWONLY:
                    left = "unset (TypeError)" if mine.default is None else f"at its default {mine.default}"
                    self.add("keyword_only", p.name,
                             f"takes parameter '{p.name}' keyword-only where the target takes it at position {i}: "
                             f"vLLM's positional call puts it in *{self.i_var.name} and leaves '{p.name}' {left}")
            elif mine is not None or self.i_varkw is not None:
                self.add("not_positional", p.name,
                         f"does not accept parameter '{p.name}' positionally (the target takes it at position {i}"
                         f"{_default_of(p)}): vLLM's positional call raises TypeError")

    def keyword_taken(self, p, by_kw) -> None:
        """vLLM's keyword call: positional-only in the implementation (a keyword call misses it, even with
        **kwargs), or only reachable through its *args ("dropped" said the rest)."""
        by_keyword = p.kind == POSKW and p.name != self.first
        only_positional = p.name in self.i_named or (self.i_varkw is None and self.i_var is not None)
        if by_keyword and by_kw is None and only_positional:
            self.add("not_by_keyword", p.name,
                     f"does not accept parameter '{p.name}' by keyword (the target takes it{_default_of(p)}): "
                     "vLLM's keyword call raises TypeError")

    # -- the implementation's parameters: what it wants that vLLM does not pass ----------------------------------
    def impl_param(self, q) -> None:
        if q.kind in (VARPOS, VARKW):
            return
        t = self.t_by_name.get(q.name)
        said = q.name in self.misplaced or q.name in self.renamed_to or q.name in self.reordered
        if not said:
            said = self.moved(q, t)
        said = self.extra_required(q, t) or said
        if not said:
            self.extra_positional(q)

    def moved(self, q, t) -> bool:
        if not (t is not None and q.positional and t.positional and q.position != t.position
                and (q.default is None or t.kind == POSKW)):
            return False
        self.add("reordered", q.name,
                 f"takes '{q.name}' at position {q.position} where the target takes it at position {t.position}: "
                 f"vLLM's positional call binds another argument to '{q.name}'")
        return True

    def extra_required(self, q, t) -> bool:
        if t is not None or q.name in self.renamed_to or q.default is not None:
            return False
        when = ("a call that does not pass it raises TypeError" if any(p.kind == VARKW for p in self.target)
                else "every call raises TypeError")
        self.add("extra_required", q.name,
                 f"requires parameter '{q.name}', which the target does not have: vLLM never passes it, so {when}")
        return True

    def extra_positional(self, q) -> None:
        if self.t_var is not None and q.positional and q.position >= len(self.t_pos):
            self.add("extra_positional", q.name,
                     f"takes '{q.name}' at position {q.position}, where the target collects extra positional "
                     f"arguments in *{self.t_var.name}: vLLM's extra positional argument binds to '{q.name}'")


def problems_for(patch: Any, target_signature: Optional[str], *, target_kind: Optional[str] = None,
                 calls: Optional[tuple] = None) -> list[Finding]:
    """The convention problems of a patch's implementation against its target's signature (for `check`, `pin`).

    Empty for a patch with no implementation (a verbatim passthrough), a kind other than wrap/replace,
    or no signature to compare with. The implementation is read from its source (`impl_static.py`), never
    imported — its module may import vLLM, or worse; a module that is not on this Python's path is one
    `implementation_missing` problem, one that cannot be read or parsed, a name it does not define, or a value
    that is not callable one `implementation` problem. A name bound by code that runs at import (no readable
    signature) is not judged. (The loader judges the imported implementation with `problems` at start-up.)
    """
    if not traits(patch).installs_function or patch.implementation is None or not target_signature:
        return []
    from vllm_patchkit.upstream import impl_static

    try:
        d = impl_static.read(patch.implementation)
        sig = impl_static.call_signature(d)
    except impl_static.ImplUnreadable as exc:
        return [Finding("implementation_missing" if exc.missing else "implementation", str(exc))]
    if d.callable is False or d.kind == "module":
        return [Finding("implementation", f"implementation {patch.implementation} is not callable "
                                          f"({'a module' if d.kind == 'module' else 'a literal value'})")]
    if sig is None:
        return []
    return problems(sig, target_signature, shape=traits(patch).call_shape, name=patch.implementation,
                    target_kind=target_kind, params=patch.params, patch=patch.key, calls=calls)


def reason(found: list[Finding]) -> str:
    """One line for a record: the first problem first, every other one after it."""
    return "; ".join(p.reason for p in found)


__all__ = ["problems", "problems_for", "reason", "signature_text", "wrap_takes_context"]

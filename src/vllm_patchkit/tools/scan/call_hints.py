"""Hint passes: how the file's own functions are called, so a helper is read once per distinct call.

A helper the file calls (`_wrap(GPUModelRunner, "execute_model")`) is read with its parameters bound to that
call's vLLM objects and attribute-name strings; a function installed on a vLLM class has its first parameter typed
as an object of that class (its other parameters as the release annotates the method it replaces); an overridden
method's parameters are typed by the vLLM method it overrides. The walk (`sites.py`, `FileScanner.run`) repeats
its reading in hint mode while these grow, then reads the file once more to keep the sites.
"""

from __future__ import annotations

import ast
from typing import Optional

from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.references import SELF, References
from vllm_patchkit.tools.scan.syntax import _short
from vllm_patchkit.tools.scan.value_sets import MAX_VALUES


class CallHints:
    """What the hint passes learn about the file's functions: owns the bindings this pass gathers (the context
    keeps those of the pass before, `call_bindings`, which every pass reads), the functions installed on vLLM
    classes and the overrides' annotations. `hinting`: a hint pass is under way (the recognisers note, not add)."""

    def __init__(self, ctx: FileContext, refs: References):
        self.ctx = ctx
        self.refs = refs
        self._next_bindings: dict[int, list[dict[str, tuple]]] = {}
        # functions installed as methods of a vLLM class: (their first parameter, their other parameters' objects)
        self.installed_self: dict[int, tuple] = {}
        self.override_hints: dict[int, dict[str, tuple]] = {}  # a vLLM method's annotations, for its overrides
        self._installed_before: dict[int, tuple] = {}
        self.hinting = False

    # -- the passes: the walk (sites.py) asks for them until what they learn stops growing
    def reset(self) -> None:
        self.ctx.call_bindings, self.installed_self, self.override_hints = {}, {}, {}

    def start_pass(self) -> None:
        self.hinting, self._next_bindings = True, {}
        self._installed_before = dict(self.installed_self)

    def end_pass(self) -> bool:
        """The bindings this pass gathered become the ones read; True when the pass learned something new."""
        changed = self._next_bindings != self.ctx.call_bindings or self._installed_before != self.installed_self
        self.ctx.call_bindings = self._next_bindings
        return changed

    def stop(self) -> None:
        self.hinting = False

    def note_override(self, method: ast.AST, types: dict[str, str]) -> None:
        """A subclass method's parameters are what vLLM passes the method it overrides (the release's types)."""
        self.override_hints[id(method)] = {k: ("inst", v) for k, v in types.items()}

    def hint_params(self, fn: ast.AST, node: ast.Call, skip_first: bool = False) -> None:
        """Record (hint passes) one call of a function of the file: its parameters bound to the arguments that
        are vLLM objects, or strings the function uses as attribute names (`setattr(cls, name, ...)`)."""
        if not self.hinting:
            return
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]][1 if skip_first else 0:]
        given = list(zip(params, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
        names = _attr_name_params(fn)
        binding: dict[str, tuple] = {}
        for name, arg in given:
            if isinstance(arg, ast.Starred):
                break
            r = self.refs.resolve(arg)
            if r is not None and (r[0] in ("vllm", "inst") or (
                    r[0] == "lit" and isinstance(r[1], str) and name in names)):
                binding[name] = r[:2]
        if not binding:
            return
        calls = self._next_bindings.setdefault(id(fn), [])
        if binding not in calls and len(calls) <= MAX_VALUES:
            calls.append(binding)

    def note_installed(self, dotted: str, value: ast.AST, wrapper_kind: Optional[str]) -> None:
        """A function of the file installed as `vllm.C.m`: vLLM calls it as the method, so its first parameter
        is an object of C (the class itself for a classmethod; none for a staticmethod) and its other parameters
        are what C.m is annotated to take."""
        ref = self.refs.callable_ref(value)
        if ref is None or ref[0] != "func" or len(ref) < 3 or not isinstance(
                ref[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        owner, _, meth = dotted.rpartition(".")
        if not owner or not owner.split(".")[-1][:1].isupper():
            return
        decos = {_short(d).split(".")[-1] for d in ref[2].decorator_list}
        kind = wrapper_kind or ("classmethod" if "classmethod" in decos else
                                "staticmethod" if "staticmethod" in decos else None)
        first = None if kind == "staticmethod" else ("vllm", owner) if kind == "classmethod" else ("inst", owner)
        types = self.ctx.release_call("param_types", dotted) or {}
        self.installed_self[id(ref[2])] = (first, {k: ("inst", v) for k, v in types.items()})

    def hint_sets(self, node: ast.AST) -> list[dict[str, tuple]]:
        """The parameter bindings to read a function's body with: one per distinct call of it (its arguments
        that are vLLM objects, or strings it uses as attribute names), each on top of what is known whatever
        the call (the first parameter of a function installed as a method of a vLLM class; the annotations of
        the vLLM method a subclass method overrides). Past MAX_VALUES distinct calls, one merged reading."""
        base: dict[str, tuple] = dict(self.override_hints.get(id(node), {}))
        params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        inst = self.installed_self.get(id(node))
        if inst is not None:
            if params and inst[0] is not None and params[0] not in base:
                base[params[0]] = (*inst[0], SELF)  # marked: what the method sets on its own object is its own
            for name, ref in inst[1].items():
                base.setdefault(name, ref)
        sets = self.ctx.call_bindings.get(id(node)) or []
        if not sets:
            return [base]
        if len(sets) > MAX_VALUES:
            merged: dict[str, tuple] = {}
            for s in sets:
                merged.update(s)
            sets = [merged]
        return [{**base, **s} for s in sets]


def _attr_name_params(fn: ast.AST) -> set[str]:
    """Parameters a function uses as attribute names: the second argument of setattr/getattr/hasattr/delattr."""
    params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
    out = set()
    for sub in ast.walk(fn):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name)
                and sub.func.id in ("setattr", "getattr", "hasattr", "delattr") and len(sub.args) >= 2
                and isinstance(sub.args[1], ast.Name) and sub.args[1].id in params):
            out.add(sub.args[1].id)
    return out


__all__ = ["CallHints"]

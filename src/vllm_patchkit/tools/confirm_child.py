"""The child of `check --confirm`: exercise each reported name on the vLLM this interpreter imports.

Run as `python -m vllm_patchkit.tools.confirm_child` with a JSON list of probes on stdin; writes one JSON answer per
probe on stdout. A probe imports only what the breakage names (the vLLM module, and the plugin's implementation
module for its import and a set's class): never a platform's kernels on purpose, and the parent bounds the time.

Each answer is `confirmed` (the error was raised here, or vLLM's own code gives no such name: the loader's rule,
`upstream/reach_live.py`), `not_confirmed` (the name is there: check's finding is a false alarm on this release),
or `cannot` (the probe could not be run: why).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import traceback
from typing import Any


def _line_of(exc: BaseException) -> str:
    """The innermost frame outside the import machinery: where the error was raised, as file:line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _import_owner(module: str, qual: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def probe_import(module: str, name: str) -> dict:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return {"verdict": "confirmed", "error": f"{type(exc).__name__}: {exc}", "at": _line_of(exc)}
    try:
        exec(f"from {module} import {name}", {})  # the statement the plugin runs
    except ImportError as exc:
        return {"verdict": "confirmed", "error": f"ImportError: {exc}"}
    return {"verdict": "not_confirmed", "found": f"{module}.{name} imports ({type(getattr(mod, name, None)).__name__})"}


def probe_member(module: str, qual: str, what: str) -> dict:
    """A class attribute or method is exercised by reading it from the class; an attribute vLLM would set on each
    object cannot be read without an object, so the loader's rule on the live class decides (named so)."""
    from vllm_patchkit.upstream import reach_live

    owner, _, name = qual.rpartition(".")
    try:
        cls = _import_owner(module, owner)
    except Exception as exc:
        return {"verdict": "confirmed", "error": f"{type(exc).__name__}: {exc}", "at": _line_of(exc)}
    if not isinstance(cls, type):
        return {"verdict": "cannot", "why": f"{module}:{owner} is not a class here ({type(cls).__name__})"}
    try:
        getattr(cls, name)
        return {"verdict": "not_confirmed", "found": f"{owner}.{name} is an attribute of the class"}
    except AttributeError as exc:
        raised = f"AttributeError: {exc}"
    if reach_live.defines(cls, name):
        return {"verdict": "not_confirmed",
                "found": f"{owner}'s objects get {name} (a field, __getattr__, or a method assigning self.{name})"}
    if what == "method":
        return {"verdict": "confirmed", "error": raised}
    return {"verdict": "confirmed", "error": f"AttributeError: '{owner}' object has no attribute '{name}'",
            "how": f"{owner} and its bases define no {name}, no field of that name and no __getattr__, and no method "
                   f"of theirs assigns self.{name} (their bytecode, as loaded)"}


def probe_provided(cls_spec: str, name: str) -> dict:
    """A `set`'s class must give its objects what vLLM's inherited methods read: import the plugin's class."""
    from vllm_patchkit.upstream import reach_live

    from vllm_patchkit.declaration.names import Target

    module, qual = Target.parse(cls_spec)
    try:
        cls = _import_owner(module, qual)
    except Exception as exc:
        return {"verdict": "cannot", "why": f"the plugin's class {cls_spec} does not import here: "
                                            f"{type(exc).__name__}: {exc}"}
    if not isinstance(cls, type):
        return {"verdict": "cannot", "why": f"{cls_spec} is not a class"}
    if reach_live.defines(cls, name) or any(name in reach_live.assigned_on_self(k) for k in cls.__mro__):
        return {"verdict": "not_confirmed", "found": f"{qual}'s objects get {name}"}
    return {"verdict": "confirmed", "error": f"AttributeError: '{qual}' object has no attribute '{name}'",
            "how": f"no class of {qual}'s MRO defines or assigns self.{name} (bytecode, as loaded)"}


def probe_call(module: str, qual: str, signature: str) -> dict:
    """A used callable whose signature changed: the call the pinned signature took, bound to the live one."""
    try:
        obj = _import_owner(module, qual)
        live = inspect.signature(obj)
    except Exception as exc:
        return {"verdict": "confirmed", "error": f"{type(exc).__name__}: {exc}", "at": _line_of(exc)}
    args, kwargs = [], {}
    for p in _parse(signature).parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        (args.append(object()) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
         else kwargs.__setitem__(p.name, object()))
    try:
        live.bind(*args, **kwargs)
    except TypeError as exc:
        return {"verdict": "confirmed", "error": f"TypeError: {exc}",
                "how": f"a call that {qual}'s pinned signature {signature} takes, bound to its live {live}"}
    return {"verdict": "not_confirmed", "found": f"a call the pinned signature takes binds to the live {live}"}


def _parse(signature: str) -> inspect.Signature:
    """An `inspect.Signature` from its text as pinned: `(a, b=1, *, c) -> int` (annotations and defaults not
    evaluated: each default is a placeholder)."""
    import ast

    text = signature.strip()
    head = text.rsplit(" -> ", 1)[0] if ") -> " in text else text
    fn = ast.parse(f"def f{head}: pass").body[0]
    a = fn.args
    P = inspect.Parameter
    params = []
    pos = a.posonlyargs + a.args
    firsts = len(pos) - len(a.defaults)
    for i, arg in enumerate(pos):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=None if i >= firsts else P.empty))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if d is None else None))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def answer(probe: dict) -> dict:
    kind = probe["probe"]
    try:
        if kind == "import":
            return probe_import(probe["module"], probe["name"])
        if kind == "member":
            return probe_member(probe["module"], probe["qual"], probe["what"])
        if kind == "provided":
            return probe_provided(probe["class"], probe["name"])
        if kind == "call":
            return probe_call(probe["module"], probe["qual"], probe["signature"])
    except Exception as exc:  # the probe itself failed: say so, never a verdict
        return {"verdict": "cannot", "why": f"the probe raised {type(exc).__name__}: {exc}"}
    return {"verdict": "cannot", "why": f"unknown probe {kind!r}"}


def main() -> int:
    probes = json.loads(sys.stdin.read())
    import vllm

    out = {"vllm": getattr(vllm, "__version__", None), "answers": [answer(p) for p in probes]}
    sys.stdout.write("\n" + "PATCHKIT-CONFIRM " + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

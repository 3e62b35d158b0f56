"""A plugin's subclasses of vLLM classes, judged on one release: each override against the base method's
signature, and the base's abstract methods the subclass does not implement.

vLLM calls an override in the base method's place, with the base's calls, so an override is judged by the
project's convention rule for a replacement (`upstream/convention.py`: renamed, dropped, reordered, made-required
parameters ...), the base's signature as the target's. Dunder methods (`__init__` first) are left out: whether vLLM
constructs the class, and how, is the call sites' business, not the base's. An abstract method is one decorated
`abstractmethod` where the MRO first finds the name; a subclass that itself declares abstract methods is abstract
too and not judged for them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from vllm_patchkit.tools.reach_plugin.walk import PluginClass
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream.impl_def import FUNC, signature_of
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.static_tables import dotted

CALLABLE_KINDS = ("method", "classmethod", "staticmethod", "function")


@dataclass(frozen=True)
class Override:
    cls: str  # the plugin class, module:Qualname
    name: str
    base: Optional[str]  # module:Class.name of the base method the MRO finds in the release (None: no such method)
    base_signature: Optional[str]
    problems: tuple[str, ...]
    line: int


def _abstract(fn: ast.AST) -> bool:
    return isinstance(fn, FUNC) and any((dotted(d) or "").rpartition(".")[2] == "abstractmethod"
                                        for d in fn.decorator_list)


def _base_method(release: StaticRelease, bases: list[str], name: str):
    """The base definition of `name` the MRO of the vLLM bases finds first: (spec, fingerprint) or None."""
    for base in bases:
        fp = release.lookup(f"{base}.{name}")
        spec = f"{base}.{name}"
        if isinstance(fp, Missing) and fp.inherited_from:
            spec, fp = fp.inherited_from, release.lookup(fp.inherited_from)
        if not isinstance(fp, Missing):
            return spec, fp
    return None


def overrides(release: StaticRelease, pc: PluginClass) -> list[Override]:
    """Each method of the class's own body that a vLLM base also defines, judged against the base's signature."""
    out = []
    for st in pc.node.body:
        if not isinstance(st, FUNC) or (st.name.startswith("__") and st.name.endswith("__")):
            continue
        found = _base_method(release, pc.vllm_bases, st.name)
        if found is None:
            out.append(Override(pc.spec, st.name, None, None, (), st.lineno))
            continue
        spec, fp = found
        if fp.kind not in CALLABLE_KINDS or not fp.signature:
            out.append(Override(pc.spec, st.name, spec, fp.signature, (), st.lineno))
            continue
        found_problems = convention.problems(signature_of(st.args), fp.signature, shape="replace",
                                             target_kind=fp.kind, name=f"{pc.spec}.{st.name}")
        out.append(Override(pc.spec, st.name, spec, fp.signature, tuple(p.reason for p in found_problems), st.lineno))
    return out


def unimplemented_abstract(release: StaticRelease, pc: PluginClass) -> list[str]:
    """`module:Base.name` of each abstract method of the vLLM bases the class leaves unimplemented."""
    if any(_abstract(st) for st in pc.node.body):
        return []
    first: dict[str, tuple[str, ast.AST]] = {}
    for base in pc.vllm_bases:
        d = release.resolve(base)
        if isinstance(d, Missing) or not isinstance(d.node, ast.ClassDef):
            continue
        for where, node in release._mro(d.module, d.qualname, d.node):
            for st in node.body:
                if isinstance(st, FUNC) and st.name not in first:
                    first[st.name] = (where, st)
    return sorted(f"{where}.{name}" for name, (where, fn) in first.items()
                  if _abstract(fn) and name not in pc.own)


__all__ = ["Override", "overrides", "unimplemented_abstract"]

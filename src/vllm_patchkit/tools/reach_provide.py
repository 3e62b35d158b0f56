"""What a class swapped in by a `set` must provide: the attributes vLLM's own code reads on objects of the class it
replaces (issue 30).

A plugin that sets a vLLM class's name to its own subclass (`kind: set`, `target: module:Class`, `value_from:
plugin:MyClass`) gets every method it does not override from vLLM: the weight loader calls the model's
`load_weights`, the runner its `compute_logits`, and those read `self.x`. A subclass that builds its state itself
(it does not call the base's `__init__`) must set each such `x`; when vLLM renames one (in its `__init__` and its
readers), the subclass still sets the old name and the first call raises `AttributeError`, while the class itself
is unchanged (`{kind: class}` pins nothing of it).

Read from source on the release, nothing imported: the chain is the replaced class and its bases in the release
(C3 order); an attribute is **owed** when a method the plugin class inherits (it does not override it) reads
`self.x`, some method of the chain assigns `self.x` (an attribute of each object), no class body of the chain
defines `x` (a method, a class attribute), no inherited method assigns it itself, and the plugin class (its body,
its own methods' `self.x = ...`, its plugin-side bases) does not define it. A plugin class whose `__init__` calls
`super().__init__` (or that has none) gets what the base's `__init__` assigns. Each owed attribute is a reach item
of kind `provide` with the vLLM reader's file:line: `pin` records the ones the plugin class provides, `check`
reports the ones it does not (`reach_missing`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import impl_static
from vllm_patchkit.upstream.impl_def import FUNC
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.reach import Member, ReachItem
from vllm_patchkit.upstream.static_tables import instance_assignments


def applies(patch: Patch) -> bool:
    """A kind that sets a value (`set`) at a class (`module:Class`), to an object named by `value_from`."""
    return (traits(patch).sets_value and patch.value_from is not None and patch.target is not None
            and ":" in patch.target)


def _plugin_names(spec: str) -> Optional[tuple[set[str], bool]]:
    """(names the plugin class defines, whether it gets the base's `__init__` assignments), or None when
    `value_from` is not a class readable from source."""
    try:
        cls = impl_static.read(spec)
    except impl_static.ImplUnreadable:
        return None
    if cls.kind != "class":
        return None
    names: set[str] = set()
    todo, seen = [cls], set()
    while todo:
        c = todo.pop(0)
        if c.spec in seen:
            continue
        seen.add(c.spec)
        names |= set(impl_static._bindings(c.node.body)) | set(instance_assignments(c.node))
        names |= {st.target.id for st in c.node.body if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
        todo += impl_static.base_defs(c)
    init = impl_static.override(spec, "__init__")
    return names, init is None or init.calls_super("__init__")


def _self_reads(fn: ast.AST) -> list[tuple[str, int]]:
    params = [*fn.args.posonlyargs, *fn.args.args]
    if not params:
        return []
    me = params[0].arg
    return [(n.attr, n.lineno) for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
            and isinstance(n.value, ast.Name) and n.value.id == me]


@dataclass(frozen=True)
class Owed:
    """An attribute vLLM's `reader` (`Class.method`) reads on the object; `item.member` None: not provided."""

    item: ReachItem
    reader: str

    def where(self) -> str:
        return f"{self.reader} at {self.item.file}:{self.item.line}"


def read(release: StaticRelease, patch: Patch) -> list[Owed]:
    """The attributes owed by the class `value_from` names to vLLM's methods of the class `target` names."""
    if not applies(patch):
        return []
    d = release.resolve(patch.target)
    plugin = _plugin_names(patch.value_from)
    if isinstance(d, Missing) or not isinstance(d.node, ast.ClassDef) or plugin is None:
        return []
    own, gets_init = plugin
    chain = release._mro(d.module, d.qualname, d.node)
    in_bodies: set[str] = set()
    assigned: set[str] = set()
    inherited: list[tuple[str, ast.AST]] = []
    for where, node in chain:
        mod = release.module(Target.parse(where).module)
        in_bodies |= set(release._class_scope(node, mod.package if mod else where).names)
        assigned |= set(instance_assignments(node))
        for fn in node.body:
            if isinstance(fn, FUNC) and fn.name not in own and not any(fn.name == f.name for _, f in inherited):
                inherited.append((where, fn))
    got_from_vllm = {a for _, fn in inherited for a in _assigned_by(fn)}
    if gets_init:
        got_from_vllm |= assigned
    out: dict[str, Owed] = {}
    for where, fn in inherited:
        module, qualname = Target.parse(where)
        mod = release.module(module)
        path = mod.path if mod is not None and mod.path else module
        for name, line in _self_reads(fn):
            if name in out or name not in assigned or name in in_bodies or name in got_from_vllm:
                continue
            member = Member("instance_attribute") if name in own else None
            out[name] = Owed(ReachItem("provide", d.where, name, str(path), line, True, member),
                             f"{qualname}.{fn.name}")
    return sorted(out.values(), key=lambda o: o.item.name)


def _assigned_by(fn: ast.AST) -> set[str]:
    holder = ast.ClassDef(name="_", bases=[], keywords=[], body=[fn], decorator_list=[], type_params=[])
    return set(instance_assignments(holder))


__all__ = ["Owed", "applies", "read"]

"""What a release's source says about its classes, for the reach (`upstream/reach.py`): does a class define a name,
how, and what class is its value.

A class defines `name` when the class or a base in the release (C3 order, `StaticRelease._mro`) has it in its body
(a method, a property, a class attribute), as a field (an annotation in the body of a dataclass, a NamedTuple, a
pydantic model or a msgspec Struct), or when one of their methods assigns `self.name` (`instance_assignments`, the
rule `instances: true` pins use). A class with a base outside the release (torch's `nn.Module`) may get the name
from there: `outside`, which the reach counts as not followed, never as missing. A class with `__getattr__` answers
any name: `dynamic`.

The class of a value, in this order: the annotation (`x: T` in the class body, `self.x: T = ...`, a property's or
method's return annotation, `Optional[T]` / `T | None` as `T`, names imported under `if TYPE_CHECKING:` included);
else what every method assigns agrees on: `T(...)` of a class of the release, a parameter annotated `T`,
`param.attr` / `self.attr` typed the same way (two levels). A class outside vLLM (numpy's `ndarray`, `np.zeros(...)`)
is `external`: not vLLM's reach.
"""

from __future__ import annotations

import ast
from typing import Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.reach import Member, is_vllm
from vllm_patchkit.upstream.static_tables import FUNCS, Import, dotted, instance_assignments

FIELDED_BASES = frozenset({"NamedTuple", "BaseModel", "Struct", "TypedDict"})
HARMLESS_BASES = frozenset({"object", "ABC", "Generic", "Protocol", "Enum", "IntEnum", "str", "int"})
PROPERTY = frozenset({"property", "cached_property"})
SEQUENCES = frozenset({"list", "List", "Sequence", "MutableSequence", "tuple", "Tuple", "set", "Set", "frozenset",
                       "FrozenSet", "Iterable", "Iterator", "Collection", "deque"})


class ReleaseTypes:
    """`reach.Types` answered from one release's source."""

    def __init__(self, release: StaticRelease):
        self.r = release
        self._members: dict[tuple[str, str], Optional[Member]] = {}
        self._checking: dict[str, dict[str, Import]] = {}

    # -- classes
    def _class(self, spec: str) -> Optional[tuple[str, str, ast.ClassDef]]:
        d = self.r.resolve(spec)
        if isinstance(d, Missing) or not isinstance(d.node, ast.ClassDef) or not is_vllm(d.module):
            return None  # a class outside vLLM (the folder may hold torch too): not vLLM's reach
        return d.module, d.qualname, d.node

    def target_owner(self, target: str) -> Optional[str]:
        owner = Target.parse(target).owner_target
        found = self._class(str(owner)) if owner else None
        return f"{found[0]}:{found[1]}" if found else None

    def parameter(self, target: str, name: str) -> Optional[Member]:
        d = self.r.resolve(target)
        if isinstance(d, Missing) or not isinstance(d.node, FUNCS):
            return None
        args = d.node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if a.arg == name and a.annotation is not None:
                return self.annotation(d.module, a.annotation, "parameter")
        return None

    def returns(self, target: str) -> Optional[Member]:
        """The class (or fixed tuple of classes) the target's return annotation names."""
        d = self.r.resolve(target)
        if isinstance(d, Missing) or not isinstance(d.node, FUNCS) or d.node.returns is None:
            return None
        return self.annotation(d.module, d.node.returns, "return")

    def module_defines(self, module: str, name: str) -> Optional[str]:
        """`module`, `name` or None (the release has no such module, or the module no such name)."""
        if self.r.module(f"{module}.{name}") is not None:
            return "module"
        if self.r.module(module) is None:
            return None
        got = self.r._lookup(module, name)
        return None if isinstance(got, Missing) else "name"

    # -- annotations
    def annotation(self, module: str, node: Optional[ast.expr], defined: str) -> Member:
        """The class an annotation names, as a Member that is `defined` so."""
        node = _strip_optional(node)
        if isinstance(node, ast.Subscript) and (dotted(node.value) or "").rpartition(".")[2] in SEQUENCES:
            inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
            if isinstance(node.slice, ast.Tuple) and not (len(node.slice.elts) == 2 and isinstance(
                    node.slice.elts[1], ast.Constant) and node.slice.elts[1].value is Ellipsis):
                # a fixed tuple: each position its own class (a class outside vLLM, or none, is None there)
                elems = tuple(self.annotation(module, e, defined) for e in node.slice.elts)
                return Member(defined, elems=tuple(None if m.external else m.type for m in elems))
            item = self.annotation(module, inner, defined)
            return Member(defined, item=item.type) if item.type else Member(defined)
        path = dotted(node) if node is not None else None
        if path is None:
            return Member(defined)
        got = self.r._dotted_in(module, path)
        if isinstance(got, Missing):
            imp = self._type_checking(module).get(path.split(".")[0])
            if imp is not None and len(path.split(".")) == 1:
                got = self.r._lookup(imp.module, imp.name) if self.r.module(imp.module) else ("external", imp.module)
        if isinstance(got, tuple) and got[0] == "def" and isinstance(got[3], ast.ClassDef) and is_vllm(got[1]):
            return Member(defined, f"{got[1]}:{got[2]}")
        if isinstance(got, tuple) and (got[0] == "external" or (got[0] == "def" and not is_vllm(got[1]))):
            return Member(defined, external=True)
        return Member(defined)

    def _type_checking(self, module: str) -> dict[str, Import]:
        """Names a module imports under `if TYPE_CHECKING:` (annotations only; the tables leave them out)."""
        if module not in self._checking:
            out: dict[str, Import] = {}
            mod = self.r.module(module)
            raw = self.r.source.read(mod.path) if mod is not None and mod.path else None
            for st in ast.parse(raw).body if raw else []:
                if isinstance(st, ast.If) and (dotted(st.test) or "").rpartition(".")[2] == "TYPE_CHECKING":
                    for s in st.body:
                        if isinstance(s, ast.ImportFrom):
                            from vllm_patchkit.upstream.static_tables import absolute

                            for a in s.names:
                                out[a.asname or a.name] = Import(absolute(s.module, s.level, mod.package), a.name)
            self._checking[module] = out
        return self._checking[module]

    # -- members
    def member(self, cls: str, name: str) -> Optional[Member]:
        key = (cls, name)
        if key not in self._members:
            self._members[key] = None  # a cycle through this name reads as unknown, once
            self._members[key] = self._member(cls, name, depth=0)
        return self._members[key]

    def _member(self, cls: str, name: str, depth: int) -> Optional[Member]:
        if isinstance(self.r.resolve(cls), Missing):
            return None  # the class itself is gone: so is every name on it
        found = self._class(cls)
        if found is None:
            return Member("outside")  # not a class of vLLM's (torch's): a name may come from there
        module, qual, node = found
        chain = self.r._mro(module, qual, node)
        fielded = any(_fielded(n) for _, n in chain)
        for where, n in chain:  # in the body: a def, a class attribute, an annotated field
            mod = Target.parse(where).module
            scope = self.r._class_scope(n, self.r.module(mod).package if self.r.module(mod) else mod)
            b = scope.names.get(name)
            if isinstance(b, FUNCS):
                decos = {(dotted(d.func if isinstance(d, ast.Call) else d) or "").rpartition(".")[2]
                         for d in b.decorator_list}
                kind = "property" if decos & PROPERTY else "method"
                return self.annotation(mod, b.returns, kind)
            if b is not None:
                ann = _annotation_in_body(n, name)
                return self.annotation(mod, ann, "class_attribute") if ann is not None else Member("class_attribute")
            ann = _annotation_in_body(n, name)
            if ann is not None and fielded:
                return self.annotation(mod, ann, "field")
        for where, n in chain:  # assigned on each object by a method
            assigned = instance_assignments(n).get(name)
            if assigned:
                mod = Target.parse(where).module
                ann = next((a for _, a in chain for a in [_annotation_in_body(a, name)] if a is not None), None) \
                    or _self_annotation(n, name)
                if ann is not None:
                    return self.annotation(mod, ann, "instance_attribute")
                return self._inferred(mod, cls, n, assigned, depth)
        if any(isinstance(b, FUNCS) for _, n in chain for b in [self.r._class_scope(n, "").names.get("__getattr__")]):
            return Member("dynamic")
        if _outside_bases(self.r, chain) or _base_api(chain, name):
            return Member("outside")
        return None

    def _inferred(self, module: str, cls: str, node: ast.ClassDef, assigned, depth: int) -> Member:
        """The class every assignment of the attribute agrees on (one unknown: unknown)."""
        got: set = set()
        for method, value in assigned:
            fn = next((f for f in node.body if isinstance(f, FUNCS) and f.name == method), None)
            got.add(self._value_class(module, cls, fn, value, depth))
        if len(got) == 1:
            only = got.pop()
            if only == "external":
                return Member("instance_attribute", external=True)
            return Member("instance_attribute", only)
        return Member("instance_attribute")

    def _value_class(self, module: str, cls: str, fn, value: Optional[ast.expr], depth: int):
        """`T(...)`, a parameter annotated `T`, `param.attr` / `self.attr` typed the same way; None: unknown."""
        if value is None or depth > 2:
            return None
        if isinstance(value, ast.Call):
            path = dotted(value.func)
            got = self.r._dotted_in(module, path) if path else None
            if isinstance(got, tuple) and got[0] == "def" and isinstance(got[3], ast.ClassDef):
                return f"{got[1]}:{got[2]}" if is_vllm(got[1]) else "external"
            if isinstance(got, tuple) and got[0] == "def" and isinstance(got[3], FUNCS) and got[3].returns is not None:
                m = self.annotation(got[1], got[3].returns, "returns")  # a factory function's return annotation
                return "external" if m.external else m.type
            if isinstance(got, tuple) and got[0] == "external":
                return "external"
            return None
        if isinstance(value, ast.Name) and fn is not None:
            for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
                if a.arg == value.id and a.annotation is not None:
                    m = self.annotation(module, a.annotation, "parameter")
                    return "external" if m.external else m.type
            return None
        if isinstance(value, ast.Attribute):
            params = [*fn.args.posonlyargs, *fn.args.args] if fn is not None else []
            if isinstance(value.value, ast.Name) and params and value.value.id == params[0].arg:
                base = cls
            else:
                base = self._value_class(module, cls, fn, value.value, depth + 1)
            if base and base != "external":
                m = self._member(base, value.attr, depth + 1) if (base, value.attr) not in self._members \
                    else self._members[(base, value.attr)]
                return None if m is None else "external" if m.external else m.type
        return None


def _strip_optional(node: Optional[ast.expr]) -> Optional[ast.expr]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Subscript) and (dotted(node.value) or "").rpartition(".")[2] == "Optional":
        return _strip_optional(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return _strip_optional(sides[0]) if len(sides) == 1 else None
    return node


def _annotation_in_body(node: ast.ClassDef, name: str) -> Optional[ast.expr]:
    for st in node.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name:
            return st.annotation
    return None


def _self_annotation(node: ast.ClassDef, name: str) -> Optional[ast.expr]:
    """`self.name: T = ...` in one of the class's methods."""
    for fn in node.body:
        if isinstance(fn, FUNCS) and fn.args.args:
            me = fn.args.args[0].arg
            for st in ast.walk(fn):
                if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Attribute) and st.target.attr == name
                        and isinstance(st.target.value, ast.Name) and st.target.value.id == me):
                    return st.annotation
    return None


#: what a fielded base outside vLLM gives every class built on it, by that base's name
BASE_API = {
    "NamedTuple": frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults", "count", "index"}),
    "TypedDict": frozenset({"get", "items", "keys", "values", "setdefault", "pop", "popitem", "update", "copy",
                            "clear"}),
}
_PYDANTIC_V1 = frozenset({"dict", "json", "copy", "parse_obj", "parse_raw", "schema", "schema_json", "construct",
                          "validate", "update_forward_refs"})


def _base_api(chain, name: str) -> bool:
    """Is `name` given by a fielded base outside vLLM (a NamedTuple's `_replace`, a pydantic model's
    `model_dump`)? Only those names: a field the class no longer declares is still gone."""
    for _, n in chain:
        for b in n.bases:
            base = (dotted(b.value if isinstance(b, ast.Subscript) else b) or "").rpartition(".")[2]
            if base == "BaseModel" and (name.startswith("model_") or name in _PYDANTIC_V1):
                return True
            if name in BASE_API.get(base, ()):
                return True
    return False


def _fielded(node: ast.ClassDef) -> bool:
    """A dataclass, a NamedTuple, a pydantic model, a msgspec Struct: an annotation in its body is a field."""
    decos = {(dotted(d.func if isinstance(d, ast.Call) else d) or "").rpartition(".")[2] for d in node.decorator_list}
    bases = {(dotted(b.value if isinstance(b, ast.Subscript) else b) or "").rpartition(".")[2] for b in node.bases}
    return "dataclass" in decos or "config" in decos or bool(bases & FIELDED_BASES)


def _outside_bases(release: StaticRelease, chain) -> bool:
    """Does a class of the chain have a base the release does not define (a name may come from there)?"""
    inside = {w for w, _ in chain}
    for where, n in chain:
        for b in n.bases:
            path = dotted(b.value if isinstance(b, ast.Subscript) else b)
            if path is None or path.rpartition(".")[2] in HARMLESS_BASES | FIELDED_BASES:
                continue
            got = release._dotted_in(Target.parse(where).module, path)
            if not (isinstance(got, tuple) and got[0] == "def" and f"{got[1]}:{got[2]}" in inside and is_vllm(got[1])):
                return True
    return False


__all__ = ["ReleaseTypes"]

"""The walk of every function of a plugin on one release: the reach's own walk (`upstream/reach.py`) with the
plugin's names in scope.

What it adds to the walk of one implementation:
- a name the plugin imports from vLLM is a value (`Ref`): `envs.VLLM_X` and `Cls.attr` are read on the module or
  class the release has; calling it is a call of a vLLM callable (`CallUse`: a class constructed, a function
  called), judged later against the release's signature (`signatures.py`);
- a method called on an object of a known vLLM class is a `CallUse` too (the receiver bound);
- the `self` of a plugin class that subclasses a vLLM class is an object of that plugin class: a name the class
  (or its plugin-side bases) defines is the plugin's own, any other must come from the vLLM bases (`PluginTypes`);
  `super()` in its methods is the first vLLM base;
- parameters annotated with a vLLM class (`x: SchedulerOutput`, `Optional[...]`, `list[...]`) are objects of it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules, PluginName, VllmName
from vllm_patchkit.tools.reach_types import SEQUENCES, ReleaseTypes, _strip_optional
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import reach
from vllm_patchkit.upstream.impl_def import FUNC
from vllm_patchkit.upstream.impl_static import ImplUnreadable, _bindings
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.reach import Items, Member, Obj, Opaque, ReachItem, _Callable, _Function, _Walk, _GO_ON
from vllm_patchkit.upstream.static_tables import dotted, instance_assignments

PLUGIN = "plugin"  # Member.defined of a name a plugin class defines itself: not vLLM's reach


@dataclass(frozen=True)
class Ref:
    """A vLLM module or name the plugin refers to, as a value."""

    name: VllmName


@dataclass(frozen=True)
class CallShape:
    positional: int
    keywords: tuple[str, ...]
    star: bool  # `*args` in the call: its positional count is unknown
    starstar: bool  # `**kwargs` in the call: its keywords are unknown

    @classmethod
    def of(cls, node: ast.Call) -> "CallShape":
        return cls(sum(1 for a in node.args if not isinstance(a, ast.Starred)),
                   tuple(k.arg for k in node.keywords if k.arg is not None),
                   any(isinstance(a, ast.Starred) for a in node.args), any(k.arg is None for k in node.keywords))

    def text(self) -> str:
        parts = [f"{self.positional} positional"] + [f"{k}=" for k in self.keywords]
        return ", ".join(parts + ["*args"] * self.star + ["**kwargs"] * self.starstar)


@dataclass(frozen=True)
class CallUse:
    """A call of a vLLM callable: `class` (constructed), `function`, `bound` (a method on an object), `via_class`
    (`Cls.method(...)`)."""

    callee: str  # module:Qualname in the release
    how: str
    shape: CallShape
    file: str
    line: int


class PluginClass:
    """A plugin class with vLLM bases: the names it defines itself, and its vLLM bases (in the release)."""

    def __init__(self, spec: str, node: ast.ClassDef, own: set[str], vllm_bases: list[str]):
        self.spec, self.node, self.own, self.vllm_bases = spec, node, own, vllm_bases


class PluginTypes:
    """`reach.Types` for a walk of the plugin: a plugin class's names first, the release's for the rest."""

    def __init__(self, inner: ReleaseTypes, plugin: PluginModules):
        self.inner, self.p, self.r = inner, plugin, inner.r
        self.classes: dict[str, PluginClass] = {}
        self.via: dict[tuple[str, str], str] = {}  # (plugin class, name) -> the vLLM base that has it
        self.set_anywhere = _assigned_anywhere(plugin)
        for module, qual, node in plugin.classes():
            self._plugin_class(module, qual, node, 0)

    def _plugin_class(self, module: str, qual: str, node: ast.ClassDef, depth: int) -> Optional[PluginClass]:
        spec = f"{module}:{qual}"
        if spec in self.classes or depth > 10:
            return self.classes.get(spec)
        own = set(_bindings(node.body)) | set(instance_assignments(node)) | {
            st.target.id for st in node.body if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
        bases: list[str] = []
        for b in node.bases:
            path = dotted(b.value if isinstance(b, ast.Subscript) else b)
            got = self.p.resolve(module, path) if path else None
            if isinstance(got, VllmName) and got.qual:
                cls = self.vllm_class(got)
                if cls:
                    bases.append(cls)
            elif isinstance(got, PluginName) and got.qual:
                inner = self.p.definition(got)
                if isinstance(inner, ast.ClassDef):
                    pc = self._plugin_class(got.module, got.qual, inner, depth + 1)
                    if pc is not None:
                        own |= pc.own
                        bases += [x for x in pc.vllm_bases if x not in bases]
                    else:
                        own |= set(_bindings(inner.body)) | set(instance_assignments(inner))
        if not bases:
            return None
        self.classes[spec] = PluginClass(spec, node, own, bases)
        return self.classes[spec]

    def vllm_class(self, name: VllmName) -> Optional[str]:
        """`module:Class` where the release defines the class `name` refers to (None: not a vLLM class there)."""
        got = self.r._dotted_in(name.module, name.qual) if self.r.module(name.module) else None
        if isinstance(got, tuple) and got[0] == "def" and isinstance(got[3], ast.ClassDef) and reach.is_vllm(got[1]):
            return f"{got[1]}:{got[2]}"
        return None

    # -- reach.Types
    def target_owner(self, target: str) -> Optional[str]:
        return self.inner.target_owner(target)

    def parameter(self, target: str, name: str) -> Optional[Member]:
        return self.inner.parameter(target, name)

    def module_defines(self, module: str, name: str) -> Optional[str]:
        return self.inner.module_defines(module, name)

    def member(self, cls: str, name: str) -> Optional[Member]:
        pc = self.classes.get(cls)
        if pc is None:
            return self.inner.member(cls, name)
        if name in pc.own:
            return Member(PLUGIN, external=True)
        for base in pc.vllm_bases:
            m = self.inner.member(base, name)
            if m is not None:
                self.via[(cls, name)] = base
                return m
        self.via[(cls, name)] = pc.vllm_bases[0]
        if name in self.set_anywhere:  # set on the object by the plugin's code elsewhere: not followed
            return Member("outside")
        return None


class PluginWalk(_Walk):
    """The walk over a plugin's functions: its names in scope, calls of vLLM callables collected."""

    def __init__(self, types: PluginTypes, plugin: PluginModules):
        super().__init__(types, target="")
        self.p, self.pt, self.r = plugin, types, types.r
        self.calls: list[CallUse] = []

    def imports(self, module: str, file: str) -> None:
        return None  # the plugin's imports are read on their own (`imports.py`), with their guards

    def find(self, module: str, name: str):
        d = self.p.find(module, name)
        if d is None:
            raise ImplUnreadable(f"{module}:{name} is not one of the plugin's functions")
        return d

    def function_state(self, module: str, file: str, env: dict, ctx: Optional[str], depth: int) -> "_PluginFunction":
        return _PluginFunction(self, module, file, env, ctx, depth)

    def value_of(self, module: str, annotation: Optional[ast.expr]) -> reach.Value:
        """The value a parameter annotated so holds: an object of a vLLM class (or of a plugin class with vLLM
        bases), a sequence of them, or None."""
        node = _strip_optional(annotation)
        if isinstance(node, ast.Subscript) and (dotted(node.value) or "").rpartition(".")[2] in SEQUENCES:
            inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
            got = self.value_of(module, inner)
            return Items(got.cls) if isinstance(got, Obj) else None
        path = dotted(node) if node is not None else None
        got = self.p.resolve(module, path) if path else None
        if isinstance(got, VllmName) and got.qual:
            cls = self.pt.vllm_class(got)
            return Obj(cls) if cls else None
        if isinstance(got, PluginName) and got.spec in self.pt.classes:
            return Obj(got.spec)
        return None

    def items_found(self) -> list[ReachItem]:
        """The walk's items, a plugin class's own names dropped and the rest owned by the vLLM base that has them."""
        out = []
        for i in self.items:
            if i.member is not None and i.member.defined == PLUGIN:
                continue
            owner = i.owner.split(" (")[0]
            if owner in self.pt.classes:
                base = self.pt.via.get((owner, i.name), self.pt.classes[owner].vllm_bases[0])
                i = ReachItem(i.kind, i.owner.replace(owner, base, 1), i.name, i.file, i.line, i.followed, i.member)
            out.append(i)
        return out


class _PluginFunction(_Function):
    w: PluginWalk

    def statement(self, st: ast.stmt) -> None:
        if isinstance(st, ast.ImportFrom) and not st.level and reach.is_vllm(st.module or ""):
            for a in st.names:
                self.env[a.asname or a.name] = Ref(VllmName(st.module, a.name))
            return
        if isinstance(st, ast.Import):
            for a in st.names:
                if reach.is_vllm(a.name):
                    self.env[a.asname or a.name.split(".")[0]] = Ref(VllmName(a.name if a.asname else "vllm"))
            return
        super().statement(st)

    def eval(self, node: Optional[ast.expr], call: bool = False) -> reach.Value:
        if isinstance(node, ast.Name) and node.id not in self.env:
            got = self.w.p.resolve(self.module, node.id)
            if isinstance(got, VllmName) and got.qual and "." not in got.qual and not self._defined(got):
                got = next((alt for alt in self.w.p.alternatives(self.module, node.id) if self._defined(alt)), got)
            return Ref(got) if isinstance(got, VllmName) else _PluginRef(got) if isinstance(got, PluginName) else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
                and self.env.get("__class__") is not None):
            for a in node.args:
                self.eval(a)
            return Obj(self.w.pt.classes[self.env["__class__"].cls].vllm_bases[0])
        return super().eval(node, call)

    def _defined(self, name: VllmName) -> bool:
        return self.w.types.module_defines(name.module, name.qual) is not None

    def member_of(self, base: reach.Value, node: ast.Attribute, call: bool) -> reach.Value:
        if isinstance(base, _PluginRef):
            return None
        if not isinstance(base, Ref):
            return super().member_of(base, node, call)
        name, r = node.attr, base.name
        if not r.qual:  # a module of vLLM: a submodule or a name in it
            defined = self.w.types.module_defines(r.module, name)
            self.w.record("import", r.module, name, self.file, node.lineno, defined)
            if defined is None:
                return Opaque(f"{r.module}.{name}")
            return Ref(VllmName(f"{r.module}.{name}")) if defined == "module" else Ref(VllmName(r.module, name))
        got = self.w.r._dotted_in(r.module, r.qual) if self.w.r.module(r.module) else None
        if isinstance(got, tuple) and got[0] == "module":
            return self.member_of(Ref(VllmName(got[1])), node, call)
        if isinstance(got, tuple) and got[0] == "def" and isinstance(got[3], ast.ClassDef) and reach.is_vllm(got[1]):
            cls = f"{got[1]}:{got[2]}"
            if name.startswith("__") and name.endswith("__"):
                return None
            member = self.w.types.member(cls, name)
            self.w.record("method" if call else "attribute", cls, name, self.file, node.lineno, member)
            return Ref(VllmName(got[1], f"{got[2]}.{name}")) if member is not None else Opaque(f"{r.qual}.{name}")
        if got is None or isinstance(got, Missing):
            return None  # the name itself is missing: its import says so
        self.w.record("attribute", r.spec, name, self.file, node.lineno, None, followed=False)
        return Opaque(f"{r.qual}.{name}")

    def called(self, node: ast.Call, got: reach.Value) -> object:
        shape = CallShape.of(node)
        if isinstance(got, _Callable) and got.spec:
            owner, _, meth = got.spec.rpartition(".")
            owner = self.w.pt.via.get((owner, meth), owner) if owner in self.w.pt.classes else owner
            self.w.calls.append(CallUse(f"{owner}.{meth}", "bound", shape, self.file, node.lineno))
            return _GO_ON
        if isinstance(got, _PluginRef):
            spec = got.name.spec if got.name else None
            return Obj(spec) if spec in self.w.pt.classes else _GO_ON
        if not isinstance(got, Ref) or not got.name.qual:
            return _GO_ON
        r = got.name
        found = self.w.r._dotted_in(r.module, r.qual) if self.w.r.module(r.module) else None
        if not (isinstance(found, tuple) and found[0] == "def" and reach.is_vllm(found[1])):
            return None
        spec, defn = f"{found[1]}:{found[2]}", found[3]
        if isinstance(defn, ast.ClassDef):
            self.w.calls.append(CallUse(spec, "class", shape, self.file, node.lineno))
            return Obj(spec)
        if isinstance(defn, FUNC):
            self.w.calls.append(CallUse(spec, "via_class" if "." in found[2] else "function", shape, self.file,
                                        node.lineno))
            m = self.w.pt.inner.annotation(found[1], defn.returns, "returns")
            return Obj(m.type) if m.type and not m.external else Items(m.item) if m.item else Opaque(f"{r.qual}()")
        return None


@dataclass(frozen=True)
class _PluginRef:
    name: Optional[PluginName]


def _assigned_anywhere(plugin: PluginModules) -> set[str]:
    """Attribute names the plugin stores on some object (`x.name = ...`, `setattr(x, "name", ...)`)."""
    out: set[str] = set()
    for mod in plugin.modules.values():
        for n in ast.walk(mod.tree):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                out.add(n.attr)
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                  and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
                out.add(n.args[1].value)
    return out


def walk(plugin: PluginModules, types: PluginTypes) -> PluginWalk:
    """Every module body, class body and function of the plugin walked on the release `types` reads."""
    w = PluginWalk(types, plugin)
    for mod in plugin.modules.values():
        w.function(mod.name, mod.path, mod.tree, {}, None, 0)
    for module, qual, node in plugin.classes():
        w.function(module, plugin.modules[module].path, node, {}, None, 0)
    for module, owner, fn in plugin.functions():
        env: dict[str, reach.Value] = {}
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for a in params:
            v = w.value_of(module, a.annotation)
            if v is not None:
                env[a.arg] = v
        cls = f"{module}:{owner}" if owner else None
        decos = {(dotted(d) or "").rpartition(".")[2] for d in fn.decorator_list}
        if cls in types.classes and params and not decos & {"staticmethod", "classmethod"}:
            env[params[0].arg] = env["__class__"] = Obj(cls)
        w.function(module, plugin.modules[module].path, fn, env, None, 0)
    return w


__all__ = ["CallShape", "CallUse", "PluginTypes", "PluginWalk", "Ref", "walk"]

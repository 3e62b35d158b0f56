"""The reach of a patch's implementation: the names of vLLM it touches once it runs, read from its source.

A patch pins the places it is installed at; what its implementation then reads on vLLM's objects is where it
breaks on an upgrade (issue 30): `instance.input_batch.num_prompt_tokens` in a wrap of a runner method needs
`GPUModelRunner.input_batch` and `InputBatch.num_prompt_tokens`. Read here, without importing anything:

- every `from vllm... import x` / `import vllm...` of the implementation's module, and of the modules of the patch
  set's own helpers it calls (kind `import`);
- every attribute read (`attribute`) and method call (`method`) on a value whose vLLM class is known: the target's
  `instance` (a wrap's 2nd parameter, a method's `self`), a value got by `ctx.arg(args, kwargs, "name")` where
  the target's parameter is annotated with a vLLM class, and, transitively, an attribute of one of those whose
  class the release's own assignments or annotations tell (`types.member`);
- through calls of the set's own functions (`decide(instance, ctx)`), the arguments bound to their parameters.

An access on a vLLM value whose class cannot be inferred is an item with `followed=False`: "not followed", counted
and shown, never taken as fine. Dunder names, `getattr(x, "n", default)` (absence tolerated) and values outside
vLLM (numpy arrays) are not vLLM's reach. What the release defines is asked of `types` (`tools/reach_types.py`
answers it from a release's source); this module only walks the implementation.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Union

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream import impl_static
from vllm_patchkit.upstream.impl_def import FUNC

DEPTH = 3  # calls of the set's own functions followed this deep


@dataclass(frozen=True)
class Member:
    """A name a vLLM class defines: how, and the class of its value (or a method's return) when known."""

    defined: str  # method | property | class_attribute | instance_attribute | field | dynamic | outside
    type: Optional[str] = None  # module:Class of the value, in the release
    item: Optional[str] = None  # a list / tuple / set of objects of this class (`list[T]`)
    external: bool = False  # the value's class is known and outside vLLM (numpy, torch): not vLLM's reach
    elems: tuple = ()  # a fixed tuple (`tuple[A, B]`): each position's class (None: not a class of vLLM's)


@dataclass(frozen=True)
class ReachItem:
    """One name of vLLM the implementation reaches, and where (file:line of the implementation)."""

    kind: str  # import | attribute | method
    owner: str  # module:Class (attribute, method), a module (import), or how the value was got (not followed)
    name: str
    file: str
    line: int
    followed: bool = True
    member: Optional[Member] = None  # None with followed: the release defines no such name (a break)

    @property
    def key(self) -> str:
        """`module:Class.name` (an import: `module:name`), as a manifest's `reach` holds it."""
        return f"{self.owner}.{self.name}" if ":" in self.owner else f"{self.owner}:{self.name}"

    @property
    def short(self) -> str:
        """`Class.name` (an import: `module.name`)."""
        return f"{Target.parse(self.owner).qualname}.{self.name}" if ":" in self.owner else f"{self.owner}.{self.name}"


class Types(Protocol):
    """What a release says about its classes (answered from its source by `tools/reach_types.py`)."""

    def target_owner(self, target: str) -> Optional[str]: ...

    def parameter(self, target: str, name: str) -> Optional[Member]: ...

    def member(self, cls: str, name: str) -> Optional[Member]: ...

    def module_defines(self, module: str, name: str) -> Optional[str]: ...

    def returns(self, target: str) -> Optional[Member]: ...


@dataclass(frozen=True)
class Obj:
    cls: str  # an object of this vLLM class


@dataclass(frozen=True)
class Items:
    cls: str  # a sequence of objects of this vLLM class: its items (by index, by iteration) are `Obj(cls)`


@dataclass(frozen=True)
class Opaque:
    how: str  # a vLLM value of unknown class: what was read to get it


@dataclass(frozen=True)
class Elems:
    classes: tuple  # a fixed tuple of values (`tuple[A, B]`): unpacked by position, each an `Obj` (None: unknown)


Value = Union[Obj, Items, Opaque, Elems, None]


def is_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


class _Walk:
    """The walk of one implementation (a whole plugin's walk, `tools/reach_plugin/walk.py`, extends it: its own
    module reader, its own function state)."""

    def __init__(self, types: Types, target: str):
        self.types = types
        self.target = target
        self.items: list[ReachItem] = []
        self.seen: set = set()
        self.modules_read: set[str] = set()

    # -- one function
    def function(self, module: str, file: str, fn: ast.AST, env: dict[str, Value], ctx: Optional[str],
                 depth: int) -> None:
        key = (file, getattr(fn, "lineno", 0), tuple(sorted((k, v) for k, v in env.items() if v is not None)))
        if key in self.seen:
            return
        self.seen.add(key)
        self.imports(module, file)
        state = self.function_state(module, file, dict(env), ctx, depth)
        for st in fn.body:
            state.statement(st)

    def function_state(self, module: str, file: str, env: dict, ctx: Optional[str], depth: int) -> "_Function":
        return _Function(self, module, file, env, ctx, depth)

    def find(self, module: str, name: str):
        """`module.name` followed to its definition (an `ImplDef`); raises `ImplUnreadable`."""
        return impl_static._find(module, name)

    def imports(self, module: str, file: str) -> None:
        """The vLLM names the module imports (top level and in functions: every import statement in it)."""
        if module in self.modules_read:
            return
        self.modules_read.add(module)
        _, tree = impl_static._parse(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and is_vllm(node.module or ""):
                for a in node.names:
                    if a.name != "*":
                        self.record("import", node.module, a.name, file, node.lineno,
                                    self.types.module_defines(node.module, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if is_vllm(a.name) and "." in a.name:
                        mod, _, last = a.name.rpartition(".")
                        self.record("import", mod, last, file, node.lineno, self.types.module_defines(mod, last))

    def record(self, kind: str, owner: str, name: str, file: str, line: int, defined, followed: bool = True) -> None:
        member = defined if isinstance(defined, Member) or defined is None else Member(defined)
        self.items.append(ReachItem(kind, owner, name, file, line, followed, member if followed else None))


class _Function:
    """The walk of one function body: names bound to vLLM values, statements in order."""

    def __init__(self, walk: _Walk, module: str, file: str, env: dict[str, Value], ctx: Optional[str], depth: int):
        self.w, self.module, self.file, self.env, self.ctx, self.depth = walk, module, file, env, ctx, depth

    def statement(self, st: ast.stmt) -> None:
        if isinstance(st, (*FUNC, ast.ClassDef)):
            return  # a nested definition: read when called (not followed here)
        if isinstance(st, ast.Assign):
            value = self.eval(st.value)
            for t in st.targets:
                self.bind(t, value)
            return
        if isinstance(st, ast.AnnAssign):
            value = self.eval(st.value) if st.value is not None else None
            self.bind(st.target, value)
            return
        if isinstance(st, (ast.For, ast.AsyncFor)):
            self.bind(st.target, self.item(self.eval(st.iter)))
            for sub in [*st.body, *st.orelse]:
                self.statement(sub)
            return
        self.children(st)

    def children(self, node: ast.AST) -> None:
        """The statements and expressions inside a compound statement (an `except` or `case` clause, a `with`
        item included), in order."""
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.statement(child)
            elif isinstance(child, ast.expr):
                self.eval(child)
            elif isinstance(child, (ast.ExceptHandler, ast.match_case, ast.withitem)):
                self.children(child)

    def bind(self, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, Elems) and len(value.classes) == len(target.elts) and not any(
                    isinstance(e, ast.Starred) for e in target.elts):
                for e, cls in zip(target.elts, value.classes):  # `state, n = wrapped(...)`: by position
                    self.bind(e, Obj(cls) if cls else Opaque("an item of the target's result"))
                return
            for e in target.elts:
                self.bind(e.value if isinstance(e, ast.Starred) else e, self.item(value))
        else:
            self.eval(target)  # `x.a = v`, `x[i] = v`: what it reads on the way

    # -- expressions
    def eval(self, node: Optional[ast.expr], call: bool = False) -> Value:
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, call)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value)
            self.env[node.target.id] = value
            return value
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value)
            self.eval(node.slice)
            if isinstance(base, Items) and isinstance(node.slice, ast.Slice):
                return base
            return self.item(base)
        if isinstance(node, ast.Lambda):
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.eval(child)
            elif isinstance(child, ast.comprehension):
                self.bind(child.target, self.item(self.eval(child.iter)))
                for cond in child.ifs:
                    self.eval(cond)
        return None

    @staticmethod
    def how(v: Value) -> str:
        if isinstance(v, Items):
            return f"[{Target.parse(v.cls).qualname}]"
        return Target.parse(v.cls).qualname if isinstance(v, Obj) else v.how if isinstance(v, Opaque) else "?"

    def item(self, v: Value) -> Value:
        """An item of `v` (by index, iteration or unpacking): an object of the class of a sequence's items."""
        if isinstance(v, Items):
            return Obj(v.cls)
        if isinstance(v, Elems):
            return Opaque("an item of the target's result")
        return Opaque(f"an item of {self.how(v)}") if v is not None else None

    def attribute(self, node: ast.Attribute, call: bool) -> Value:
        return self.member_of(self.eval(node.value), node, call)

    def member_of(self, base: Value, node: ast.Attribute, call: bool) -> Value:
        """`base.<node.attr>`: recorded when `base` is a vLLM value; the value it gives."""
        name = node.attr
        if base is None or (name.startswith("__") and name.endswith("__")):
            return None
        kind = "method" if call else "attribute"
        if isinstance(base, Items):  # a method of the list itself (`.append`), not vLLM's reach
            return None
        if isinstance(base, Opaque):
            self.w.record(kind, base.how, name, self.file, node.lineno, None, followed=False)
            return Opaque(f"{base.how}.{name}")
        member = self.w.types.member(base.cls, name)
        if member is not None and member.defined == "outside":  # a base outside vLLM may define it
            self.w.record(kind, f"{base.cls} (a base outside vLLM)", name, self.file, node.lineno, None, False)
            return Opaque(f"{self.how(base)}.{name}")
        self.w.record(kind, base.cls, name, self.file, node.lineno, member)
        if member is None or member.external:
            return None if member is not None else Opaque(f"{self.how(base)}.{name}")
        if call and member.defined in ("method", "dynamic"):
            return _Callable(member.type, f"{base.cls}.{name}")  # the call's result: the return annotation
        if member.item:
            return Items(member.item)
        return Obj(member.type) if member.type else Opaque(f"{self.how(base)}.{name}")

    def call(self, node: ast.Call) -> Value:
        func = node.func
        args = [self.eval(a.value if isinstance(a, ast.Starred) else a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords}
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self.ctx:
            if func.attr == "arg" and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
                p = self.w.types.parameter(self.w.target, str(node.args[2].value))
                if p is None:
                    return Opaque(f"parameter {node.args[2].value!r}")
                return None if p.external else Obj(p.type) if p.type else Opaque(f"parameter {node.args[2].value!r}")
            return None
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
            return None  # getattr with a default: absence tolerated
        if isinstance(func, ast.Name) and func.id in ("wrapped",):
            return self.target_result()
        got = self.eval(func, call=True)
        hooked = self.called(node, got)
        if hooked is not _GO_ON:
            return hooked
        if isinstance(got, _Callable):
            return Obj(got.returns) if got.returns else Opaque("a method's result")
        if isinstance(got, Opaque):
            return Opaque(f"{got.how}()")
        if isinstance(func, ast.Name) and self.depth < DEPTH and any(v is not None for v in [*args, *kwargs.values()]):
            self.into(func.id, args, kwargs)
        return None

    def target_result(self) -> Value:
        """What `wrapped(...)` returns: the target's return annotation (a class, a fixed tuple of classes)."""
        returns = getattr(self.w.types, "returns", None)
        m = returns(self.w.target) if returns is not None else None
        if m is None or m.external:
            return Opaque("the target's result")
        if m.elems:
            return Elems(m.elems)
        return Obj(m.type) if m.type else Items(m.item) if m.item else Opaque("the target's result")

    def called(self, node: ast.Call, got: Value) -> object:
        """A hook on each call once its callee is evaluated: a value ends the call's walk with it."""
        return _GO_ON

    def into(self, name: str, args: list, kwargs: dict) -> None:
        """A call of one of the set's own functions: walk it with the vLLM values bound to its parameters."""
        try:
            d = self.w.find(self.module, name)
        except impl_static.ImplUnreadable:
            return
        if not isinstance(d.node, FUNC):  # a module or a value: only a def is walked (its spec is module:Qualname)
            return
        module = Target.parse(d.spec).module
        if is_vllm(module):
            return
        params = [*d.node.args.posonlyargs, *d.node.args.args]
        env: dict[str, Value] = {p.arg: v for p, v in zip(params, args)}
        for k, v in kwargs.items():
            if k is not None and any(p.arg == k for p in [*params, *d.node.args.kwonlyargs]):
                env[k] = v
        ctx = next((p.arg for p in [*params, *d.node.args.kwonlyargs] if p.arg == "ctx"), None)
        self.w.function(module, d.file, d.node, env, ctx, self.depth + 1)


@dataclass(frozen=True)
class _Callable:
    returns: Optional[str]
    spec: Optional[str] = None  # module:Class.method called


_GO_ON = object()


def read(implementation: str, target: str, instance_param: Optional[int], types: Types) -> list[ReachItem]:
    """The reach of `implementation` (module:Qualname) installed at `target`; `instance_param`: the position of the
    parameter holding the target's object (a wrap: 1; a method's replacement: 0; None: no object)."""
    d = impl_static.read(implementation)
    if not isinstance(d.node, FUNC):
        return []
    params = [*d.node.args.posonlyargs, *d.node.args.args]
    env: dict[str, Value] = {}
    owner = types.target_owner(target) if instance_param is not None else None
    if owner is not None and instance_param < len(params):
        env[params[instance_param].arg] = Obj(owner)
    ctx = params[4].arg if instance_param == 1 and len(params) > 4 else None
    w = _Walk(types, target)
    w.function(Target.parse(d.spec).module, d.file, d.node, env, ctx, 0)
    out: dict[tuple, ReachItem] = {}
    for item in w.items:  # each name once, at its first line
        k = (item.kind, item.owner, item.name, item.followed)
        if k not in out or (item.file, item.line) < (out[k].file, out[k].line):
            out[k] = item
    return sorted(out.values(), key=lambda i: (i.file, i.line, i.key))


def where(item: ReachItem, root: Optional[Path] = None) -> str:
    """`file:line`, the file relative to `root` (the patch set's folder's parent) when under it."""
    path = Path(item.file)
    if root is not None:
        try:
            path = path.resolve().relative_to(root.resolve())
        except ValueError:
            pass
    return f"{path.as_posix()}:{item.line}"


__all__ = ["Member", "ReachItem", "Types", "is_vllm", "read", "where"]

"""What a name or an expression of one plugin file refers to, read from the source (never importing it).

Names are followed through the file's scopes: `import vllm.x as y`, `from vllm.x import Y`, simple aliases
(`orig = Y.meth`, `mod = importlib.import_module("vllm.x")`, `getattr(Y, "m")`, `sys.modules["vllm.x"]`), a
parameter annotated with a vLLM class (an object of it), and names imported from the plugin's own packages.
With a release (`upstream.Upstream`) objects are typed by it: `obj.attr` and `f(...)` from vLLM's annotations and
assignments, a `try:`/`except ImportError:` import by the module the release has; a plugin object's attribute is
what its `__init__` stored. This is the pass every other stage of the file scan builds on: the value sets
(`value_sets.py`), the hint passes (`call_hints.py`), the site recognisers (`assignments.py`, `calls.py`) and the
walk (`sites.py`) ask it, through their own `refs`.
"""

from __future__ import annotations

import ast
import builtins as _b
from typing import Any, Iterator, Optional

from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.syntax import _const_str

_BUILTINS = set(dir(_b))

# index keys of a scope (see References.collect): not identifiers, so no plugin name collides with them
ASSIGNS, APPENDS, FORS = " assigns", " appends", " fors"
SELF = "self"  # third element of the reference bound to the first parameter of a function installed on a vLLM class

# A resolved expression is a tuple: ("vllm", dotted) | ("inst", dotted class) | ("func", qual, node)
# | ("class", qual, node) | ("plugin", dotted) | ("ext", dotted) | ("lit", value) | ("vllm_inst", dotted attribute
# of a vLLM object whose class is not known) | ("pobj", qual, node): an object of a class of the file


def _scope_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Statements of one scope, into if/try/with/for blocks, not into nested defs or classes."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(reversed(children))


class References:
    """Name resolution in one file (`ctx`: which file, the scopes the walk is in, the release if any)."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self._resolving: set[int] = set()  # the bindings being resolved (a name bound to itself ends there)

    # -- scopes
    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.ctx.package.split(".") if self.ctx.package else []
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def collect(self, body: list[ast.stmt], args: Optional[ast.arguments] = None, fn: Optional[ast.AST] = None,
                hints: Optional[dict[str, tuple]] = None) -> dict[str, Any]:
        """The names one scope binds. Besides the last binding of each name, three indexes (keys that are no
        identifier) feed the value-set resolution of loops: every value assigned to a name (ASSIGNS), every
        value appended/added to a name (APPENDS), every iterable a `for NAME in ...` of the scope walks (FORS)."""
        hints = dict(hints or {})
        out: dict[str, Any] = dict(hints)
        assigns: dict[str, list] = {}
        appends: dict[str, list] = {}
        fors: dict[str, list] = {}
        out[ASSIGNS], out[APPENDS], out[FORS] = assigns, appends, fors
        if args is not None:
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None and a.arg not in out:
                    out[a.arg] = ("param",)
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.annotation is not None and a.arg not in hints:
                    out[a.arg] = ("annot", a.annotation)
        for node in _scope_nodes(body):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self._bind_import(out, a.asname, (self.ctx.kind_of(a.name), a.name))
                    else:
                        top = a.name.split(".")[0]
                        out[top] = (self.ctx.kind_of(top), top)
            elif isinstance(node, ast.ImportFrom):
                mod = self._absolute(node)
                for a in node.names:
                    if a.name == "*":
                        continue
                    full = f"{mod}.{a.name}" if mod else a.name
                    self._bind_import(out, a.asname or a.name, (self.ctx.kind_of(full), full))
            elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name):
                fors.setdefault(node.target.id, []).append(node.iter)
            elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name)
                  and node.value.func.attr in ("append", "add", "insert", "extend") and node.value.args):
                call = node.value
                arg = call.args[-1]
                appends.setdefault(call.func.value.id, []).append(
                    ("elems", arg) if call.func.attr == "extend" else ("value", arg))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = ("func", self.ctx.qualname(node.name), node)
            elif isinstance(node, ast.ClassDef):
                out[node.name] = ("class", self.ctx.qualname(node.name), node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = ("expr", node.value, len(self.ctx.scopes))
                        assigns.setdefault(t.id, []).append(node.value)
                    elif isinstance(t, (ast.Tuple, ast.List)) and isinstance(node.value, ast.Call):
                        for i, el in enumerate(t.elts):  # `A, B = helper()`: the i-th of what helper returns
                            if isinstance(el, ast.Name):
                                out[el.id] = ("unpack", node.value, i, len(self.ctx.scopes))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = ("expr", node.value, len(self.ctx.scopes)) if node.value is not None else (
                    "annot", node.annotation)
                if node.value is not None:
                    assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name):
                        out[item.optional_vars.id] = ("expr", item.context_expr, len(self.ctx.scopes))
        return out

    def _bind_import(self, out: dict, name: str, b: tuple) -> None:
        """Bind an imported name; of two vLLM imports of one name (`try: from vllm.old import X` / `except
        ImportError: from vllm.new import X`), the one whose module the release has wins, whatever the order."""
        prev = out.get(name)
        if (self.ctx.release is not None and prev is not None and prev[0] == "vllm" and b[0] == "vllm"
                and self._importable(prev[1]) and not self._importable(b[1])):
            return
        out[name] = b

    def _importable(self, dotted: str) -> bool:
        try:
            return self.ctx.release.is_module(dotted) or self.ctx.release.is_module(dotted.rpartition(".")[0])
        except Exception:
            return False

    # -- resolution
    def resolve(self, e: Optional[ast.AST], depth: int = 0) -> Optional[tuple]:
        if e is None or depth > 25:
            return None
        if isinstance(e, ast.Name):
            b, level = self.ctx.lookup(e.id)
            if b is None:
                return ("ext", f"builtins.{e.id}") if e.id in _BUILTINS else None
            return self._binding(b, level, depth)
        if isinstance(e, ast.Attribute):
            r = self.resolve(e.value, depth + 1)
            if r is None:
                return None
            return self.member(r, e.attr, depth)
        if isinstance(e, ast.Call):
            f = self.resolve(e.func, depth + 1)
            if f is None:
                return None
            fname = f[1] if f[0] in ("ext", "vllm", "plugin") else ""
            if fname in ("builtins.getattr", "getattr") and len(e.args) >= 2:
                name = self.str_of(e.args[1], depth)
                if name is None:
                    return None
                r = self.resolve(e.args[0], depth + 1)
                return self.member(r, name, depth) if r is not None else None
            if fname.endswith(("importlib.import_module", "builtins.__import__")) and e.args:
                name = self.str_of(e.args[0], depth)
                return (self.ctx.kind_of(name), name) if name else None
            if f[0] == "vllm" and f[1].split(".")[-1][:1].isupper():
                return ("inst", f[1])  # an object built from a vLLM class
            if f[0] == "vllm" and self.ctx.release is not None:  # a vLLM function annotated to return a class
                t = self.ctx.release_call("return_type", f[1])
                return ("inst", t) if t else None
            if f[0] == "class" and len(f) > 2:
                return ("pobj", f[1], f[2])  # an object of one of the file's own classes
            return None
        if isinstance(e, ast.Subscript):
            key = _const_str(e.slice)
            if key is None:
                return None
            r = self.resolve(e.value, depth + 1)
            if r is not None and r[0] == "ext" and r[1] == "sys.modules":
                return (self.ctx.kind_of(key), key)
            if (r is not None and r[0] in ("vllm", "ext") and isinstance(e.value, ast.Attribute)
                    and e.value.attr == "__dict__"):
                owner = self.resolve(e.value.value, depth + 1)
                if owner is not None and owner[0] == "vllm":
                    return ("vllm", f"{owner[1]}.{key}")
            return None
        if isinstance(e, ast.Constant):
            return ("lit", e.value)
        return None

    def member(self, r: tuple, attr: str, depth: int = 0) -> Optional[tuple]:
        """`X.attr` for a resolved X."""
        if r[0] in ("vllm", "plugin", "ext"):
            if attr in ("__func__", "__wrapped__"):
                return r
            return (r[0], f"{r[1]}.{attr}")
        if r[0] == "inst":  # an attribute of a vLLM object: an object of the class the release types it with
            t = self.ctx.release_call("attr_type", r[1], attr)
            return ("inst", t) if t else ("vllm_inst", f"{r[1]}.{attr}")
        if r[0] == "class":
            return ("plugin_attr", f"{r[1]}.{attr}")
        if r[0] == "pobj" and len(r) > 2:
            return self._pobj_attr(r[2], attr, depth)
        return None

    def str_of(self, e: ast.AST, depth: int = 0) -> Optional[str]:
        """A string constant, or a name bound to one (a module constant, a loop value, a helper's argument)."""
        s = _const_str(e)
        if s is None and isinstance(e, ast.Name):
            r = self.resolve(e, depth + 1)
            s = r[1] if r is not None and r[0] == "lit" and isinstance(r[1], str) else None
        return s

    def _unpacked(self, call: ast.Call, i: int, level: int, depth: int) -> Optional[tuple]:
        """The i-th name a plugin function returns as a tuple (`return ReasoningParser, ReasoningParserManager`
        after importing them in its body), read in that function's scope; None when its returns disagree."""
        saved = self.ctx.scopes
        self.ctx.scopes = saved[: level + 1]
        try:
            fn = self.resolve(call.func, depth + 1)
        finally:
            self.ctx.scopes = saved
        if fn is None or fn[0] != "func" or len(fn) < 3 or id(call) in self._resolving:
            return None
        node = fn[2]
        rets = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)
                and len(r.value.elts) > i]
        if not rets:
            return None
        self._resolving.add(id(call))
        try:
            self.ctx.scopes = [saved[0], self.collect(node.body, node.args, node)]
            got = {self.resolve(r.elts[i], depth + 1) for r in rets}
        finally:
            self.ctx.scopes = saved
            self._resolving.discard(id(call))
        return got.pop() if len(got) == 1 else None

    def callable_ref(self, e: Optional[ast.AST]) -> Optional[tuple]:
        if e is None:
            return None
        if isinstance(e, ast.Lambda):
            return ("func", f"{self.ctx.module}:<lambda>", e)
        return self.resolve(e)

    def _pobj_attr(self, cls: ast.ClassDef, attr: str, depth: int) -> Optional[tuple]:
        """`obj.attr` for an object of a class of this file: what its methods (`__init__` first) store in
        `self.attr`, read in that method's scope with the arguments the class is called with."""
        if not isinstance(cls, ast.ClassDef) or not self.ctx.scopes:
            return None
        methods = sorted((s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))),
                         key=lambda s: s.name != "__init__")
        for fn in methods:
            for sub in ast.walk(fn):
                if not (isinstance(sub, ast.Assign) and len(sub.targets) == 1):
                    continue
                tgt = sub.targets[0]
                if not (isinstance(tgt, ast.Attribute) and tgt.attr == attr and isinstance(tgt.value, ast.Name)
                        and tgt.value.id == (fn.args.args[0].arg if fn.args.args else "self")):
                    continue
                key = id(sub)
                if key in self._resolving:
                    return None
                self._resolving.add(key)
                saved = self.ctx.scopes
                try:
                    hints = (self.ctx.call_bindings.get(id(fn)) or [{}])[0]
                    self.ctx.scopes = [saved[0]]
                    self.ctx.scopes.append(self.collect(fn.body, fn.args, fn, hints))
                    return self.resolve(sub.value, depth + 1)
                finally:
                    self.ctx.scopes = saved
                    self._resolving.discard(key)
        return None

    def _binding(self, b: tuple, level: int, depth: int) -> Optional[tuple]:
        if b[0] in ("vllm", "plugin", "ext", "func", "class", "lit", "inst", "pobj"):
            return b
        if b[0] == "unpack":
            return self._unpacked(b[1], b[2], b[3], depth)
        if b[0] == "annot":
            r = self.resolve(_annotation_name(b[1]), depth + 1)
            return ("inst", r[1]) if r is not None and r[0] == "vllm" else None
        if b[0] == "expr":
            key = id(b[1])
            if key in self._resolving:
                return None
            self._resolving.add(key)
            try:
                saved = self.ctx.scopes
                self.ctx.scopes = self.ctx.scopes[: level + 1]
                try:
                    return self.resolve(b[1], depth + 1)
                finally:
                    self.ctx.scopes = saved
            finally:
                self._resolving.discard(key)
        return None


def _annotation_name(a: ast.AST) -> Optional[ast.AST]:
    if isinstance(a, ast.Constant) and isinstance(a.value, str):  # "GPUModelRunner"
        try:
            return ast.parse(a.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(a, ast.Subscript):  # Optional[X]
        return _annotation_name(a.slice)
    if isinstance(a, ast.BinOp):  # X | None
        return _annotation_name(a.left)
    return a


def _is_self(r: Optional[tuple]) -> bool:
    return r is not None and r[0] in ("vllm", "inst") and len(r) > 2 and r[2] == SELF


__all__ = ["APPENDS", "ASSIGNS", "FORS", "SELF", "References", "_is_self"]

"""The AST visitor: every place one plugin file changes vLLM, found by reading the source (never importing it).

Names are followed through the file's scopes: `import vllm.x as y`, `from vllm.x import Y`, simple aliases
(`orig = Y.meth`, `mod = importlib.import_module("vllm.x")`, `getattr(Y, "m")`, `sys.modules["vllm.x"]`), a
parameter annotated with a vLLM class (an object of it), and names imported from the plugin's own packages.
Beyond single names, a few run-time shapes are followed because plugins install patches through them:
- a helper the file calls (`_wrap(GPUModelRunner, "execute_model")`) is read once per distinct call, its
  parameters bound to that call's vLLM objects and attribute-name strings (`run()`'s hint passes);
- a loop is read once per value it walks: a tuple of classes or names, a table of rows (`for owner, name, wrapper
  in TABLE`), a list the function fills (`mods.append(importlib.import_module(name))` over a constant tuple), or
  the list a plugin function of any file returns (`returns()`);
- objects are typed by the release (with one, `upstream.Upstream`): the first parameter of a function installed
  on a vLLM class, an overridden method's parameters, `obj.attr` and `f(...)` from vLLM's annotations and
  assignments, a `try:`/`except ImportError:` import by the module the release has; a plugin object's attribute
  is what its `__init__` stored.
What the file computes beyond that (names built by string operations, dicts of patches filled at run time) is not
followed: the scan is a reading aid for a reviewer, tuned for recall.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from vllm_patchkit.tools.scan.model import Site

#: Config fields whose value selects a class vLLM builds, -> the VllmConfig path of the field.
CONFIG_FIELDS = {
    "scheduler_cls": "scheduler_config.scheduler_cls",
    "worker_cls": "parallel_config.worker_cls",
    "sd_worker_cls": "parallel_config.sd_worker_cls",
    "worker_extension_cls": "parallel_config.worker_extension_cls",
    "distributed_executor_backend": "parallel_config.distributed_executor_backend",
    "kv_connector_module_path": "kv_transfer_config.kv_connector_module_path",
    "ec_connector_module_path": "ec_transfer_config.ec_connector_module_path",
    "encoder_cache_manager_cls": "ec_manager_config.encoder_cache_manager_cls",
}

#: Registration entry points of vLLM's registries (the last name of the callee).
REGISTRY_CALLS = {
    "register_model", "register_quantization_config", "register_connector", "register_backend",
    "register_module", "register_lora_manager", "register_oot", "register_kv_connector", "register_lazy_module",
    "register_logits_processor", "register_processor", "register_platform", "register_op",
}

WRAPT_CALLS = ("wrap_function_wrapper", "patch_function_wrapper", "wrap_object", "wrap_object_attribute",
               "function_wrapper_on", "transient_function_wrapper")


import builtins as _b

_BUILTINS = set(dir(_b))

# index keys of a scope (see FileScanner.collect): not identifiers, so no plugin name collides with them
ASSIGNS, APPENDS, FORS = " assigns", " appends", " fors"
SELF = "self"  # third element of the reference bound to the first parameter of a function installed on a vLLM class
#: at most this many values are followed through one loop or one helper function (more: the loop is read once)
MAX_VALUES = 16


def is_vllm(path: Optional[str]) -> bool:
    return bool(path) and (path == "vllm" or path.startswith("vllm."))


# -- references --------------------------------------------------------------------------------
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


class FileScanner(ast.NodeVisitor):
    """Sites of one file. `module` is the file's module name; `plugin_tops` the plugin's top-level packages."""

    def __init__(self, path: str, module: str, plugin_tops: set[str], is_package: bool = False,
                 release: Any = None, plugin_returns: Optional[dict[str, list[tuple]]] = None):
        self.path = path
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.plugin_tops = plugin_tops
        # what the release says about types (an `upstream.Upstream`, or None: names only): the module a
        # try/except import falls back to, the class of `obj.attr`, of `f(...)`, of an overridden method's params
        self.release = release if release is not None and getattr(release, "release", None) is not None else None
        # functions of the plugin (any file) that return vLLM objects: dotted name -> the objects (see returns())
        self.plugin_returns: dict[str, list[tuple]] = dict(plugin_returns or {})
        self.sites: list[Site] = []
        self._seen_sites: set[tuple] = set()
        self.scopes: list[dict[str, Any]] = []
        self.qual: list[str] = []
        self.loops: list[dict[str, list[str]]] = []  # for NAME in ("a", "b"): setattr(X, NAME, ...)
        self._resolving: set[int] = set()
        self._multi: set = set()  # guards of the value-set resolution (_values / _elems)
        self.errors: list[tuple[int, str]] = []  # (line, error) of statements the visitor gave up on
        self.facts_classes: list = []  # (qualname, node, bases) of every class of the file
        # filled by the hint passes of run(): how each function of the file is called (one {param: object} per
        # distinct call), and which functions are installed as methods of a vLLM class (their first parameter)
        self.call_bindings: dict[int, list[dict[str, tuple]]] = {}
        self._next_bindings: dict[int, list[dict[str, tuple]]] = {}
        self.installed_self: dict[int, tuple] = {}
        self.override_hints: dict[int, dict[str, tuple]] = {}  # a vLLM method's annotations, for its overrides
        self._hinting = False

    # -- scopes
    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.package.split(".") if self.package else []
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def _kind_of(self, dotted: str) -> str:
        if is_vllm(dotted):
            return "vllm"
        return "plugin" if dotted.split(".")[0] in self.plugin_tops else "ext"

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
                        self._bind_import(out, a.asname, (self._kind_of(a.name), a.name))
                    else:
                        top = a.name.split(".")[0]
                        out[top] = (self._kind_of(top), top)
            elif isinstance(node, ast.ImportFrom):
                mod = self._absolute(node)
                for a in node.names:
                    if a.name == "*":
                        continue
                    full = f"{mod}.{a.name}" if mod else a.name
                    self._bind_import(out, a.asname or a.name, (self._kind_of(full), full))
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
                out[node.name] = ("func", self._qualname(node.name), node)
            elif isinstance(node, ast.ClassDef):
                out[node.name] = ("class", self._qualname(node.name), node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = ("expr", node.value, len(self.scopes))
                        assigns.setdefault(t.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = ("expr", node.value, len(self.scopes)) if node.value is not None else (
                    "annot", node.annotation)
                if node.value is not None:
                    assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name):
                        out[item.optional_vars.id] = ("expr", item.context_expr, len(self.scopes))
        return out

    def _bind_import(self, out: dict, name: str, b: tuple) -> None:
        """Bind an imported name; of two vLLM imports of one name (`try: from vllm.old import X` / `except
        ImportError: from vllm.new import X`), the one whose module the release has wins, whatever the order."""
        prev = out.get(name)
        if (self.release is not None and prev is not None and prev[0] == "vllm" and b[0] == "vllm"
                and self._importable(prev[1]) and not self._importable(b[1])):
            return
        out[name] = b

    def _importable(self, dotted: str) -> bool:
        try:
            return self.release.is_module(dotted) or self.release.is_module(dotted.rpartition(".")[0])
        except Exception:
            return False

    def _qualname(self, name: str) -> str:
        inner = ".".join([*self.qual, name])
        return f"{self.module}:{inner}"

    def lookup(self, name: str, upto: Optional[int] = None) -> Any:
        scopes = self.scopes if upto is None else self.scopes[:upto + 1]
        for i in range(len(scopes) - 1, -1, -1):
            if name in scopes[i]:
                return scopes[i][name], i
        return None, -1

    # -- resolution
    def resolve(self, e: Optional[ast.AST], depth: int = 0) -> Optional[tuple]:
        if e is None or depth > 25:
            return None
        if isinstance(e, ast.Name):
            b, level = self.lookup(e.id)
            if b is None:
                return ("ext", f"builtins.{e.id}") if e.id in _BUILTINS else None
            return self._binding(b, level, depth)
        if isinstance(e, ast.Attribute):
            r = self.resolve(e.value, depth + 1)
            if r is None:
                return None
            return self._member(r, e.attr, depth)
        if isinstance(e, ast.Call):
            f = self.resolve(e.func, depth + 1)
            if f is None:
                return None
            fname = f[1] if f[0] in ("ext", "vllm", "plugin") else ""
            if fname in ("builtins.getattr", "getattr") and len(e.args) >= 2:
                name = self._str_of(e.args[1], depth)
                if name is None:
                    return None
                r = self.resolve(e.args[0], depth + 1)
                return self._member(r, name, depth) if r is not None else None
            if fname.endswith(("importlib.import_module", "builtins.__import__")) and e.args:
                name = self._str_of(e.args[0], depth)
                return (self._kind_of(name), name) if name else None
            if f[0] == "vllm" and f[1].split(".")[-1][:1].isupper():
                return ("inst", f[1])  # an object built from a vLLM class
            if f[0] == "vllm" and self.release is not None:  # a vLLM function annotated to return a class
                t = self._release_call("return_type", f[1])
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
                return (self._kind_of(key), key)
            if (r is not None and r[0] in ("vllm", "ext") and isinstance(e.value, ast.Attribute)
                    and e.value.attr == "__dict__"):
                owner = self.resolve(e.value.value, depth + 1)
                if owner is not None and owner[0] == "vllm":
                    return ("vllm", f"{owner[1]}.{key}")
            return None
        if isinstance(e, ast.Constant):
            return ("lit", e.value)
        return None

    def _member(self, r: tuple, attr: str, depth: int = 0) -> Optional[tuple]:
        """`X.attr` for a resolved X."""
        if r[0] in ("vllm", "plugin", "ext"):
            if attr in ("__func__", "__wrapped__"):
                return r
            return (r[0], f"{r[1]}.{attr}")
        if r[0] == "inst":  # an attribute of a vLLM object: an object of the class the release types it with
            t = self._release_call("attr_type", r[1], attr)
            return ("inst", t) if t else ("vllm_inst", f"{r[1]}.{attr}")
        if r[0] == "class":
            return ("plugin_attr", f"{r[1]}.{attr}")
        if r[0] == "pobj" and len(r) > 2:
            return self._pobj_attr(r[2], attr, depth)
        return None

    def _release_call(self, what: str, *args) -> Any:
        if self.release is None:
            return None
        try:
            return getattr(self.release, what)(*args)
        except (Exception, RecursionError):
            return None

    def _str_of(self, e: ast.AST, depth: int = 0) -> Optional[str]:
        """A string constant, or a name bound to one (a module constant, a loop value, a helper's argument)."""
        s = _const_str(e)
        if s is None and isinstance(e, ast.Name):
            r = self.resolve(e, depth + 1)
            s = r[1] if r is not None and r[0] == "lit" and isinstance(r[1], str) else None
        return s

    # -- value sets: what a loop walks (a tuple of vLLM objects or names, a list the function fills, the list a
    # plugin function returns); each answer a list of resolved references, None for an element not read
    def _in_scope(self, level: int, fn):
        saved = self.scopes
        self.scopes = self.scopes[: level + 1]
        try:
            return fn()
        finally:
            self.scopes = saved

    def _iter_values(self, it: ast.AST) -> tuple[list[tuple], bool]:
        """(the values a loop over `it` binds, whether that is all of them): vLLM objects and constants only."""
        try:
            found = self._elems(it, 0)
        except RecursionError:
            found = None
        if not found:
            return [], False
        known: list[tuple] = []
        for v in found:
            if v is not None and v[0] in ("vllm", "inst", "lit") and v not in known:
                known.append(v)
        complete = all(v is not None and v[0] in ("vllm", "inst", "lit") for v in found)
        return known, complete

    def _iter_rows(self, it: ast.AST, names: list[str]) -> list[dict[str, Optional[tuple]]]:
        """`for owner, name, wrapper in TABLE`: one binding per row of a literal table of tuples (or of a name
        bound to one), or per item of a literal dict's `.items()`; an element the scan cannot read is None."""
        node, depth = it, 0
        items = False
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "items"
                and not node.args):
            node, items = node.func.value, True
        while isinstance(node, ast.Name) and depth < 5:
            b, level = self.lookup(node.id)
            if b is None or b[0] != "expr":
                return []
            node, depth = b[1], depth + 1
        if items and isinstance(node, ast.Dict):
            elts = [[k, v] for k, v in zip(node.keys, node.values) if k is not None]
        elif not items and isinstance(node, (ast.Tuple, ast.List)):
            elts = [list(x.elts) for x in node.elts if isinstance(x, (ast.Tuple, ast.List))]
            if len(elts) != len(node.elts):
                return []
        else:
            return []
        rows = []
        for row in elts:
            if len(row) != len(names):
                return []
            vals = {}
            for n, x in zip(names, row):
                r = self.resolve(x)
                if r is None:
                    vs = self._values(x, 0)
                    r = vs[0] if len(vs) == 1 else None
                vals[n] = r
            rows.append(vals)
        return rows

    def _elems(self, e: ast.AST, depth: int) -> Optional[list]:
        if depth > 12:
            return None
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            out: list = []
            for elt in e.elts:
                if isinstance(elt, ast.Starred):
                    out += self._elems(elt.value, depth + 1) or [None]
                else:
                    out += self._values(elt, depth + 1) or [None]
            return out
        if (isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(e.generators) == 1
                and isinstance(e.elt, ast.Name) and isinstance(e.generators[0].target, ast.Name)
                and e.elt.id == e.generators[0].target.id):  # [m for m in xs if ...]: a filter of xs
            return self._elems(e.generators[0].iter, depth + 1)
        if isinstance(e, ast.Name):
            b, level = self.lookup(e.id)
            if b is None or b[0] not in ("expr", "annot") or (level, e.id) in self._multi:
                return None
            scope = self.scopes[level]
            self._multi.add((level, e.id))
            try:
                out, known = [], False
                for v in scope.get(ASSIGNS, {}).get(e.id, []):
                    if (isinstance(v, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(v.generators) == 1
                            and isinstance(v.generators[0].iter, ast.Name) and v.generators[0].iter.id == e.id):
                        continue  # xs = [x for x in xs if ...] keeps (some of) what xs had
                    sub = self._in_scope(level, lambda v=v: self._elems(v, depth + 1))
                    out += sub if sub is not None else [None]
                    known = known or sub is not None
                for kind, a in scope.get(APPENDS, {}).get(e.id, []):
                    if kind == "elems":
                        sub = self._in_scope(level, lambda a=a: self._elems(a, depth + 1))
                    else:
                        sub = self._in_scope(level, lambda a=a: self._values(a, depth + 1))
                    out += sub if sub else [None]
                    known = True
                return out if known else None
            finally:
                self._multi.discard((level, e.id))
        if isinstance(e, ast.Call):
            f = self.resolve(e.func)
            if f is None:
                return None
            if f[0] == "ext" and f[1] in ("builtins.list", "builtins.tuple", "builtins.sorted", "builtins.set",
                                          "builtins.reversed", "builtins.frozenset") and e.args:
                return self._elems(e.args[0], depth + 1)
            key = f[1] if f[0] == "plugin" else (f[1].replace(":", ".") if f[0] == "func" else None)
            if key and key in self.plugin_returns:
                return list(self.plugin_returns[key])
        return None

    def _values(self, e: ast.AST, depth: int) -> list:
        """The objects an expression can be (more than one through a loop it sits in); [] when unknown."""
        r = self.resolve(e)
        if r is not None and r[0] in ("vllm", "inst", "lit", "plugin", "ext"):
            return [r]
        if depth > 12:
            return []
        if isinstance(e, ast.Name):
            b, level = self.lookup(e.id)
            if b is None:  # the variable of a loop of an enclosing scope: what that loop walks
                for i in range(len(self.scopes) - 1, -1, -1):
                    its = self.scopes[i].get(FORS, {}).get(e.id)
                    if its:
                        out = []
                        for it in its:
                            out += [x for x in (self._in_scope(i, lambda it=it: self._elems(it, depth + 1)) or [])
                                    if x is not None]
                        return out
                return []
            if b[0] == "expr" and id(b[1]) not in self._multi:
                self._multi.add(id(b[1]))
                try:
                    return self._in_scope(level, lambda: self._values(b[1], depth + 1))
                finally:
                    self._multi.discard(id(b[1]))
            return []
        if isinstance(e, ast.Attribute):
            out = []
            for v in self._values(e.value, depth + 1):
                m = self._member(v, e.attr, depth)
                if m is not None:
                    out.append(m)
            return out
        if isinstance(e, ast.Call):
            f = self.resolve(e.func)
            fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
            if fname.endswith(("importlib.import_module", "builtins.__import__")) and e.args:
                return [(self._kind_of(v[1]), v[1]) for v in self._values(e.args[0], depth + 1)
                        if v[0] == "lit" and isinstance(v[1], str)]
            if fname in ("builtins.getattr", "getattr") and len(e.args) >= 2:
                names = [v[1] for v in self._values(e.args[1], depth + 1) if v[0] == "lit" and isinstance(v[1], str)]
                out = []
                for o in self._values(e.args[0], depth + 1):
                    for n in names:
                        m = self._member(o, n, depth)
                        if m is not None:
                            out.append(m)
                return out
            return []
        if isinstance(e, ast.Subscript):
            return [x for x in (self._elems(e.value, depth + 1) or []) if x is not None]
        return []

    def returns(self, tree: ast.Module) -> dict[str, list[tuple]]:
        """The file's top-level functions that return vLLM objects (a list or tuple of them, built in the function
        or a module constant): `module.function` -> the objects. A plugin helper `runner_classes()` returning the
        vLLM classes to patch is walked by the loops that call it, in any file (Scan passes these to every
        file's scanner)."""
        out: dict[str, list[tuple]] = {}
        saved = self.scopes
        try:
            self.scopes = [self.collect(tree.body)]
            for fn in tree.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                self.scopes.append(self.collect(fn.body, fn.args, fn))
                try:
                    found: list[tuple] = []
                    for ret in _own_returns(fn):
                        for v in self._elems(ret.value, 0) or []:
                            if v is not None and v[0] in ("vllm", "inst") and v not in found:
                                found.append(v)
                    if found:
                        out[f"{self.module}.{fn.name}"] = found
                finally:
                    self.scopes.pop()
        except RecursionError:
            pass
        finally:
            self.scopes = saved
        return out

    def _pobj_attr(self, cls: ast.ClassDef, attr: str, depth: int) -> Optional[tuple]:
        """`obj.attr` for an object of a class of this file: what its methods (`__init__` first) store in
        `self.attr`, read in that method's scope with the arguments the class is called with."""
        if not isinstance(cls, ast.ClassDef) or not self.scopes:
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
                saved = self.scopes
                try:
                    hints = (self.call_bindings.get(id(fn)) or [{}])[0]
                    self.scopes = [saved[0]]
                    self.scopes.append(self.collect(fn.body, fn.args, fn, hints))
                    return self.resolve(sub.value, depth + 1)
                finally:
                    self.scopes = saved
                    self._resolving.discard(key)
        return None

    def _binding(self, b: tuple, level: int, depth: int) -> Optional[tuple]:
        if b[0] in ("vllm", "plugin", "ext", "func", "class", "lit", "inst", "pobj"):
            return b
        if b[0] == "annot":
            r = self.resolve(_annotation_name(b[1]), depth + 1)
            return ("inst", r[1]) if r is not None and r[0] == "vllm" else None
        if b[0] == "expr":
            key = id(b[1])
            if key in self._resolving:
                return None
            self._resolving.add(key)
            try:
                saved = self.scopes
                self.scopes = self.scopes[: level + 1]
                try:
                    return self.resolve(b[1], depth + 1)
                finally:
                    self.scopes = saved
            finally:
                self._resolving.discard(key)
        return None

    # -- sites
    def add(self, mechanism: str, node: ast.AST, dotted: Optional[str] = None, what: str = "", **facts) -> Site:
        site = Site(mechanism, self.path, getattr(node, "lineno", 0), dotted, what=what, facts=facts)
        # a statement read once per value of a loop or per call of its function gives its site once per value
        # that changes it: the same place found again is the same site
        key = (mechanism, site.line, getattr(node, "col_offset", 0), dotted, what)
        if key in self._seen_sites:
            return site
        self._seen_sites.add(key)
        self.sites.append(site)
        return site

    HINT_PASSES = 4

    def run(self, tree: ast.Module) -> list[Site]:
        """Hint passes (how the file's functions are called, which are installed on vLLM classes; repeated
        while that grows, so a helper calling a helper is followed), then the pass that keeps the sites."""
        self.call_bindings, self.installed_self, self.override_hints = {}, {}, {}
        for _ in range(self.HINT_PASSES):
            self._hinting, self._next_bindings = True, {}
            installed = dict(self.installed_self)
            self._pass(tree)
            changed = self._next_bindings != self.call_bindings or installed != self.installed_self
            self.call_bindings = self._next_bindings
            if not changed:
                break
        self._hinting = False
        return self._pass(tree)

    def _pass(self, tree: ast.Module) -> list[Site]:
        self.sites, self.errors, self.scopes, self.facts_classes = [], [], [], []
        self._seen_sites = set()
        self.scopes.append(self.collect(tree.body))
        for stmt in tree.body:  # one statement the visitor cannot follow costs that statement, not the file
            depth, qual, loops = len(self.scopes), list(self.qual), list(self.loops)
            try:
                self.visit(stmt)
            except (Exception, RecursionError) as exc:
                self.errors.append((getattr(stmt, "lineno", 0), f"{type(exc).__name__}: {exc}"))
                del self.scopes[depth:]
                self.qual, self.loops = qual, loops
        return self.sites

    def _enter(self, body, args=None, name: Optional[str] = None):
        if name is not None:
            self.qual.append(name)
        self.scopes.append(self.collect(body, args))

    def _leave(self, name: Optional[str] = None):
        self.scopes.pop()
        if name is not None:
            self.qual.pop()

    def visit_FunctionDef(self, node):
        for d in node.decorator_list:
            self._decorator(d, node)
        for d in [*node.args.defaults, *node.args.kw_defaults, *node.decorator_list]:
            if d is not None:
                self.visit(d)
        self.qual.append(node.name)
        self.qual.append("<locals>")
        try:
            for hints in self._hint_sets(node):  # once per distinct way the function is called
                self.scopes.append(self.collect(node.body, node.args, node, hints))
                try:
                    for stmt in node.body:
                        self.visit(stmt)
                finally:
                    self.scopes.pop()
        finally:
            self.qual.pop()
            self.qual.pop()

    def _hint_sets(self, node: ast.AST) -> list[dict[str, tuple]]:
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
        sets = self.call_bindings.get(id(node)) or []
        if not sets:
            return [base]
        if len(sets) > MAX_VALUES:
            merged: dict[str, tuple] = {}
            for s in sets:
                merged.update(s)
            sets = [merged]
        return [{**base, **s} for s in sets]

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.scopes.append({a.arg: ("param",) for a in node.args.args})
        self.visit(node.body)
        self.scopes.pop()

    def visit_ClassDef(self, node):
        for d in node.decorator_list:
            self._decorator(d, node)
            self.visit(d)
        for b in node.bases:
            self.visit(b)
        bases = []
        for b in node.bases:
            r = self.resolve(b)
            if r is not None and r[0] == "vllm":
                bases.append(r[1])
            elif r is not None and r[0] == "class":  # a plugin base: its vLLM bases are followed later
                bases.append(f"plugin:{r[1]}")
        cls_qual = self._qualname(node.name)
        if any(is_vllm(b) for b in bases):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.add("subclass_override", stmt, None, f"{cls_qual}.{stmt.name}",
                             cls=cls_qual, cls_node=node, bases=[b for b in bases if is_vllm(b)], method=stmt.name,
                             fn=stmt, calls_super=_calls_super(stmt, node))
                    if self.release is not None:  # its parameters are what vLLM passes the method it overrides
                        for b in bases:
                            if is_vllm(b):
                                types = self._release_call("param_types", f"{b}.{stmt.name}") or {}
                                if types:
                                    self.override_hints[id(stmt)] = {k: ("inst", v) for k, v in types.items()}
                                    break
        self.facts_classes.append((cls_qual, node, bases))
        self._enter(node.body, None, node.name)
        for stmt in node.body:
            self.visit(stmt)
        self._leave(node.name)

    def visit_For(self, node):
        rows: list[dict[str, Optional[tuple]]] = []
        if isinstance(node.target, ast.Name):
            found, complete = self._iter_values(node.iter)
            rows = [{node.target.id: v} for v in [*found, *([None] if not complete else [])]] if found else []
        elif isinstance(node.target, ast.Tuple) and all(isinstance(x, ast.Name) for x in node.target.elts):
            rows = self._iter_rows(node.iter, [x.id for x in node.target.elts])
        if rows and len(rows) <= MAX_VALUES:  # the body read once per value (row) the loop walks
            self.visit(node.iter)
            scope = self.scopes[-1]
            names = list(rows[0])
            saved = {n: (n in scope, scope.get(n)) for n in names}
            try:
                for row in rows:
                    for n, v in row.items():
                        if v is None:  # a value the scan cannot read: the name unbound
                            if saved[n][0]:
                                scope[n] = saved[n][1]
                            else:
                                scope.pop(n, None)
                        else:
                            scope[n] = v
                    for stmt in node.body:
                        self.visit(stmt)
            finally:
                for n, (had, old) in saved.items():
                    if had:
                        scope[n] = old
                    else:
                        scope.pop(n, None)
            for stmt in node.orelse:
                self.visit(stmt)
            return
        values = _literal_strings(node.iter)
        if isinstance(node.target, ast.Name) and values:
            self.loops.append({node.target.id: values})
            self.generic_visit(node)
            self.loops.pop()
        else:
            self.generic_visit(node)

    def visit_Assign(self, node):
        for t in node.targets:
            self._assign(t, node.value, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assign(node.target, node.value, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._assign(node.target, node.value, node)
        self.generic_visit(node)

    def visit_Dict(self, node):
        for k, v in zip(node.keys, node.values):
            key = _const_str(k) if k is not None else None
            if key in CONFIG_FIELDS and v is not None:
                self._config_field(key, v, node if k is None else k)
        self.generic_visit(node)

    def visit_Call(self, node):
        try:
            self._call(node)
        finally:
            self.generic_visit(node)

    # -- assignments
    def _assign(self, t: ast.AST, value: ast.AST, node: ast.AST) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(t.elts) else None
            for i, el in enumerate(t.elts):
                if vals is not None:
                    self._assign(el, vals[i], node)
            return
        if isinstance(t, ast.Subscript):
            key = _const_str(t.slice)
            owner = self.resolve(t.value)
            if owner and owner[0] == "ext" and owner[1] == "sys.modules" and is_vllm(key):
                self.add("sys_modules", node, key, f"sys.modules[{key!r}] = {_short(value)}")
            elif owner and owner[0] == "ext" and owner[1] == "os.environ" and key and key.startswith("VLLM"):
                self.add("env", node, None, f"{key} = {_short(value)} (overwrites)", env=key,
                         value=_const_scalar(value), overwrites=True)
            elif owner and owner[0] == "vllm" and isinstance(t.value, ast.Attribute) and t.value.attr == "__dict__" and key:
                self._vllm_set(f"{owner[1]}".removesuffix(".__dict__") + f".{key}", value, node, False)
            return
        if not isinstance(t, ast.Attribute):
            return
        if t.attr in CONFIG_FIELDS:
            self._config_field(t.attr, value, node)
            return
        owner = self.resolve(t.value)
        if _is_self(owner):
            return
        if owner is None:
            if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                self._unresolved(t, value, node)
            if _is_method_type(self, value):
                self.add("instance_attr", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr,
                         impl=self._callable_ref(value.args[0] if value.args else None))
            return
        if owner[0] == "vllm":
            self._vllm_set(f"{owner[1]}.{t.attr}", value, node, False)
        elif owner[0] == "inst":
            self._vllm_set(f"{owner[1]}.{t.attr}", value, node, True)
        elif owner[0] == "vllm_inst":  # an object a vLLM object holds (runner.kv_cache_manager): class unknown
            self._unresolved(t, value, node)

    def _unresolved(self, t: ast.Attribute, value: ast.AST, node: ast.AST) -> None:
        """`obj.m = plugin_wrapper(obj.m)` or `obj.m = closure` calling a saved `obj.m`, where the scan cannot
        tell which vLLM class `obj` is (computed at run time): reported without a target."""
        same = ast.dump(t, annotate_fields=False).replace("Store()", "Load()")

        def is_same(e: ast.AST) -> bool:
            if ast.dump(e, annotate_fields=False) == same:
                return True
            return (isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "getattr"
                    and len(e.args) >= 2 and _const_str(e.args[1]) == t.attr
                    and ast.dump(e.args[0], annotate_fields=False) == ast.dump(t.value, annotate_fields=False)
                    .replace("Store()", "Load()"))

        if isinstance(value, ast.Call):
            f = self.resolve(value.func)
            if f is not None and f[0] in ("func", "plugin") and any(
                    is_same(sub) for a in value.args for sub in ast.walk(a)):
                self.add("wrap", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr, unresolved=_short(t.value),
                         impl=f, calls_original=True)
            return
        ref = self._callable_ref(value)
        if ref is None or ref[0] != "func" or len(ref) < 3 or isinstance(ref[2], ast.Lambda):
            return
        saved = set()
        for scope in self.scopes[1:]:
            for name, b in scope.items():
                if isinstance(b, tuple) and b[0] == "expr" and is_same(b[1]):
                    saved.add(name)
        if saved and any(isinstance(sub, ast.Name) and sub.id in saved for sub in ast.walk(ref[2])):
            self.add("instance_attr", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr,
                     unresolved=_short(t.value), impl=ref, calls_original=True)

    def _callable_ref(self, e: Optional[ast.AST]) -> Optional[tuple]:
        if e is None:
            return None
        if isinstance(e, ast.Lambda):
            return ("func", f"{self.module}:<lambda>", e)
        return self.resolve(e)

    def _vllm_set(self, dotted: str, value: ast.AST, node: ast.AST, instance: bool) -> None:
        if dotted.split(".")[-1] in ("__class__",):
            return
        what = _short(value)
        wrapper_kind = None
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in
                ("classmethod", "staticmethod", "property") and len(value.args) == 1):
            wrapper_kind = value.func.id
            value = value.args[0]
        if self._hinting and not instance:
            self._note_installed(dotted, value, wrapper_kind)
        if isinstance(value, ast.Call):
            f = self.resolve(value.func)
            fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
            if fname.endswith("MethodType") and value.args:
                ref = self._callable_ref(value.args[0])
                self.add("instance_attr" if instance else "wrap", node, dotted, what, instance=True, impl=ref,
                         calls_original=self._calls_original(ref, dotted))
                return
            if fname.endswith(("functools.partial", "functools.partialmethod")) and value.args:
                ref = self._callable_ref(value.args[0])
                orig = self._refers_to(value, dotted)
                self.add("wrap" if orig else "replace", node, dotted, what, instance=instance, impl=ref,
                         calls_original=orig)
                return
            if self._refers_to(value, dotted):
                self.add("wrap", node, dotted, what, instance=instance, impl=f,
                         wrapper=_short(value.func), calls_original=True)
                return
            if f is not None and f[0] in ("func", "plugin") and _is_wrapper_factory(f):
                self.add("wrap", node, dotted, what, instance=instance, impl=f, wrapper=_short(value.func),
                         calls_original=None)
                return
            self.add("setattr", node, dotted, what, instance=instance, value_kind="object")
            return
        ref = self._callable_ref(value)
        if ref is not None and ref[0] == "func":
            orig = self._calls_original(ref, dotted)
            self.add("wrap" if orig else "replace", node, dotted, what, instance=instance, impl=ref,
                     calls_original=orig)
            return
        if ref is not None and (ref[0] == "class" or (ref[0] == "plugin" and ref[1].split(".")[-1][:1].isupper())):
            self.add("class_swap", node, dotted, what, instance=instance, impl=ref)
            return
        if ref is not None and ref[0] in ("plugin", "plugin_attr"):
            self.add("replace", node, dotted, what, instance=instance, impl=ref, calls_original=None)
            return
        if ref is not None and ref[0] == "vllm":
            self.add("setattr", node, dotted, what, instance=instance, value_kind="vllm", value_path=ref[1])
            return
        lit = _literal(value)
        if lit is not _NO:
            self.add("setattr", node, dotted, what, instance=instance, value_kind="literal", value=lit)
            return
        self.add("setattr", node, dotted, what, instance=instance, value_kind="object")

    def _note_installed(self, dotted: str, value: ast.AST, wrapper_kind: Optional[str]) -> None:
        """A function of the file installed as `vllm.C.m`: vLLM calls it as the method, so its first parameter
        is an object of C (the class itself for a classmethod; none for a staticmethod) and its other parameters
        are what C.m is annotated to take."""
        ref = self._callable_ref(value)
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
        types = self._release_call("param_types", dotted) or {}
        self.installed_self[id(ref[2])] = (first, {k: ("inst", v) for k, v in types.items()})

    def _refers_to(self, e: ast.AST, dotted: str) -> bool:
        for sub in ast.walk(e):
            if isinstance(sub, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                r = self.resolve(sub)
                if r is not None and r[0] in ("vllm", "vllm_inst") and r[1] == dotted:
                    return True
        return False

    def _calls_original(self, ref: Optional[tuple], dotted: str) -> Optional[bool]:
        """Does the installed function reach the original (a name bound to it, `X.__wrapped__`, super())?"""
        if ref is None or ref[0] != "func" or len(ref) < 3:
            return None
        fn = ref[2]
        leaf = dotted.split(".")[-1]
        self.scopes.append(self.collect(fn.body, fn.args) if not isinstance(fn, ast.Lambda) else {})
        try:
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Name) and sub.id in ("wrapped", "original", "orig", "_orig", "_original",
                                                            "old", "_old", "fn", "func") and isinstance(sub.ctx, ast.Load):
                    b, _ = self.lookup(sub.id)
                    if b is None or b[0] == "expr":
                        r = self.resolve(sub)
                        if r is None or (r[0] in ("vllm", "vllm_inst") and r[1] == dotted):
                            return True
                if isinstance(sub, (ast.Name, ast.Attribute)) and isinstance(getattr(sub, "ctx", None), ast.Load):
                    r = self.resolve(sub)
                    if r is not None and r[0] in ("vllm", "vllm_inst") and r[1] == dotted:
                        return True
                    if r is None and isinstance(sub, ast.Name) and (self.lookup(sub.id)[0] or ("",))[0] == "expr":
                        # a name bound to one of several objects (`current = getattr(modules[0], NAME)`)
                        if any(v[0] in ("vllm", "vllm_inst") and v[1] == dotted for v in self._values(sub, 0)):
                            return True
                if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == leaf
                        and isinstance(sub.func.value, ast.Call) and isinstance(sub.func.value.func, ast.Name)
                        and sub.func.value.func.id == "super"):
                    return True
            return False
        finally:
            self.scopes.pop()

    def _config_field(self, name: str, value: ast.AST, node: ast.AST) -> None:
        ref = self.resolve(value)
        text = _const_str(value)
        cls = None
        if ref is not None and ref[0] in ("class", "plugin"):
            cls = ref[1]
        elif text and "." in text:
            cls = text
        if cls is None and ref is not None and ref[0] == "vllm":
            cls = ref[1]
        if cls is None and not text and isinstance(value, ast.Attribute) and value.attr == name:
            return  # a field copied from another config (x.scheduler_cls = y.scheduler_cls) is not a choice
        if cls is None and isinstance(value, ast.Constant) and value.value in (None, "auto", ""):
            return  # vLLM's default put back
        self.add("config_field", node, None, f"{name} = {_short(value)}", field=name, config_field=CONFIG_FIELDS[name],
                 cls=cls)

    # -- calls and decorators
    def _hint_params(self, fn: ast.AST, node: ast.Call, skip_first: bool = False) -> None:
        """Record (hint passes) one call of a function of the file: its parameters bound to the arguments that
        are vLLM objects, or strings the function uses as attribute names (`setattr(cls, name, ...)`)."""
        if not self._hinting:
            return
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]][1 if skip_first else 0:]
        given = list(zip(params, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
        names = _attr_name_params(fn)
        binding: dict[str, tuple] = {}
        for name, arg in given:
            if isinstance(arg, ast.Starred):
                break
            r = self.resolve(arg)
            if r is not None and (r[0] in ("vllm", "inst") or (
                    r[0] == "lit" and isinstance(r[1], str) and name in names)):
                binding[name] = r[:2]
        if not binding:
            return
        calls = self._next_bindings.setdefault(id(fn), [])
        if binding not in calls and len(calls) <= MAX_VALUES:
            calls.append(binding)

    def _call(self, node: ast.Call) -> None:
        f = self.resolve(node.func)
        if f is not None and f[0] == "func" and len(f) > 2 and isinstance(f[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._hint_params(f[2], node)
        elif f is not None and f[0] == "class" and len(f) > 2 and isinstance(f[2], ast.ClassDef):
            init = next((s for s in f[2].body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
            if init is not None:
                self._hint_params(init, node, skip_first=True)
        fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
        leaf = fname.split(".")[-1]
        for kw in node.keywords:
            if kw.arg in CONFIG_FIELDS:
                self._config_field(kw.arg, kw.value, kw.value)
        if f is not None and f[0] == "ext":
            if fname in ("builtins.setattr",) and len(node.args) == 3:
                owner = self.resolve(node.args[0])
                names = [_const_str(node.args[1])] if _const_str(node.args[1]) else self._loop_names(node.args[1])
                if not names:  # a name bound to a string constant (RPC_NAME = "...", a loop value, an argument)
                    s = self._str_of(node.args[1])
                    names = [s] if s else []
                if _is_self(owner):
                    return
                if owner is not None and owner[0] in ("vllm", "inst"):
                    for name in names or [None]:
                        if name is None:
                            self.add("setattr", node, f"{owner[1]}.<dynamic>", f"setattr(..., {_short(node.args[1])}, ...)",
                                     dynamic=True)
                        elif name in CONFIG_FIELDS:
                            self._config_field(name, node.args[2], node)
                        else:
                            self._vllm_set(f"{owner[1]}.{name}", node.args[2], node, owner[0] == "inst")
                elif names and names[0] in CONFIG_FIELDS:
                    self._config_field(names[0], node.args[2], node)
                return
            if leaf in WRAPT_CALLS and "wrapt" in fname or leaf == "wrap_function_wrapper":
                self._wrapt(node, node.args)
                return
            if fname in ("os.environ.setdefault", "os.putenv") and len(node.args) >= 2:
                key = _const_str(node.args[0])
                if key and key.startswith("VLLM"):
                    self.add("env", node, None, f"{key} = {_short(node.args[1])}" + (
                        " (default)" if fname.endswith("setdefault") else " (overwrites)"), env=key,
                        value=_const_scalar(node.args[1]), overwrites=not fname.endswith("setdefault"))
                return
            if fname == "os.environ.update" and node.args and isinstance(node.args[0], ast.Dict):
                for k, v in zip(node.args[0].keys, node.args[0].values):
                    key = _const_str(k) if k is not None else None
                    if key and key.startswith("VLLM"):
                        self.add("env", node, None, f"{key} = {_short(v)} (overwrites)", env=key,
                                 value=_const_scalar(v), overwrites=True)
                return
            if fname in ("sys.modules.setdefault", "sys.modules.update", "sys.modules.pop", "sys.modules.__setitem__"):
                keys = [_const_str(node.args[0])] if node.args and _const_str(node.args[0]) else []
                if node.args and isinstance(node.args[0], ast.Dict):
                    keys = [_const_str(k) for k in node.args[0].keys if k is not None]
                for key in keys:
                    if is_vllm(key):
                        self.add("sys_modules", node, key, f"{fname}({key!r}, ...)")
                return
            if leaf == "object" and ("mock.patch" in fname or fname.endswith("patch.object")) and len(node.args) >= 2:
                owner = self.resolve(node.args[0])
                name = _const_str(node.args[1])
                if owner is not None and owner[0] == "vllm" and name:
                    self._vllm_set(f"{owner[1]}.{name}", node.args[2] if len(node.args) > 2 else ast.Constant(None),
                                   node, False)
                return
            if (leaf == "patch" and "mock" in fname) and node.args and is_vllm(_const_str(node.args[0])):
                self.add("setattr", node, _const_str(node.args[0]), _short(node), value_kind="object")
                return
        if f is not None and f[0] == "vllm":
            if leaf in REGISTRY_CALLS or (leaf.startswith("register") and _owner_is_registry(fname)):
                self.add("registry", node, fname, _short(node), names=[_short(a) for a in node.args[:2]])

    def _loop_names(self, e: ast.AST) -> list[str]:
        if isinstance(e, ast.Name):
            for frame in reversed(self.loops):
                if e.id in frame:
                    return frame[e.id]
        return []

    def _wrapt(self, node: ast.AST, args: list[ast.AST]) -> None:
        if len(args) < 2:
            return
        mod = _const_str(args[0])
        if mod is None:
            r = self.resolve(args[0])
            mod = r[1] if r is not None and r[0] == "vllm" else None
        name = _const_str(args[1])
        if is_vllm(mod) and name:
            self.add("wrapt", node, f"{mod}.{name}", _short(node), impl=self._callable_ref(args[2]) if len(args) > 2 else None,
                     module=mod, attr=name)

    def _decorator(self, d: ast.AST, owner: ast.AST) -> None:
        call = d if isinstance(d, ast.Call) else None
        f = self.resolve(call.func if call is not None else d)
        fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
        leaf = fname.split(".")[-1]
        if call is not None and fname.endswith("functools.wraps") and call.args:
            r = self.resolve(call.args[0])
            if r is not None and r[0] in ("vllm", "vllm_inst"):
                self.add("functools_wraps", owner, r[1], f"def {getattr(owner, 'name', '?')} (functools.wraps)",
                         impl=("func", self._qualname(getattr(owner, "name", "?")), owner))
            return
        if call is not None and "wrapt" in fname and leaf in WRAPT_CALLS:
            self._wrapt(owner, call.args)
            return
        if f is not None and f[0] == "vllm" and (leaf in REGISTRY_CALLS or leaf.startswith("register")):
            self.add("registry", owner, fname, f"@{_short(d)} on {getattr(owner, 'name', '?')}",
                     names=[_short(a) for a in (call.args[:2] if call is not None else [])])


# -- helpers ------------------------------------------------------------------------------------
class _No:
    pass


_NO = _No()


def _literal(e: ast.AST) -> Any:
    try:
        return ast.literal_eval(e)
    except Exception:
        return _NO


def _const_str(e: Optional[ast.AST]) -> Optional[str]:
    return e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None


def _const_scalar(e: ast.AST) -> Optional[str]:
    if isinstance(e, ast.Constant) and isinstance(e.value, (str, int, float, bool)):
        return str(e.value)
    return None


def _literal_strings(e: ast.AST) -> list[str]:
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        vals = [_const_str(x) for x in e.elts]
        return [v for v in vals if v] if all(vals) else []
    return []


def _short(e: ast.AST, n: int = 80) -> str:
    try:
        text = ast.unparse(e)
    except Exception:
        return "?"
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


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


def _calls_super(fn: ast.AST, cls: ast.ClassDef) -> bool:
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            v = sub.func.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                return True
            if isinstance(v, ast.Name) and v.id != "self" and any(
                    isinstance(b, (ast.Name, ast.Attribute)) and _short(b).split(".")[-1] == v.id for b in cls.bases):
                return True  # Base.method(self, ...)
    return False


def _is_self(r: Optional[tuple]) -> bool:
    return r is not None and r[0] in ("vllm", "inst") and len(r) > 2 and r[2] == SELF


def _own_returns(fn: ast.AST) -> Iterator[ast.Return]:
    """The `return X` statements of a function itself (not of the functions and classes it defines)."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


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


def _is_method_type(scanner: FileScanner, value: ast.AST) -> bool:
    if not isinstance(value, ast.Call):
        return False
    f = scanner.resolve(value.func)
    return f is not None and f[0] == "ext" and f[1].endswith("MethodType")


def _is_wrapper_factory(f: tuple) -> bool:
    """A plugin function called to build the value: `X.m = make_patched(...)` (its result is installed)."""
    if f[0] == "func" and len(f) > 2:
        fn = f[2]
        return any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for s in ast.walk(fn) if s is not fn)
    return False


def _owner_is_registry(fname: str) -> bool:
    parts = fname.split(".")
    return len(parts) > 1 and any(w in parts[-2] for w in ("Registry", "Factory", "Manager", "CustomOp", "Registries"))


def scan_tree(tree: ast.Module, path: str, module: str, plugin_tops: set[str], is_package: bool = False,
              release: Any = None) -> FileScanner:
    sc = FileScanner(path, module, plugin_tops, is_package, release)
    sc.run(tree)
    return sc


__all__ = ["CONFIG_FIELDS", "FileScanner", "is_vllm", "scan_tree"]

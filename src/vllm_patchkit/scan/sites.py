"""The AST visitor: every place one plugin file changes vLLM, found by reading the source (never importing it).

Names are followed through the file's scopes: `import vllm.x as y`, `from vllm.x import Y`, simple aliases
(`orig = Y.meth`, `mod = importlib.import_module("vllm.x")`, `getattr(Y, "m")`, `sys.modules["vllm.x"]`), a
parameter annotated with a vLLM class (an object of it), and names imported from the plugin's own packages.
What the file does at run time beyond that (a loop computing names, a registry of patches built in a dict) is not
followed: the scan is a reading aid for a reviewer, tuned for recall.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from .model import Site

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


def is_vllm(path: Optional[str]) -> bool:
    return bool(path) and (path == "vllm" or path.startswith("vllm."))


# -- references --------------------------------------------------------------------------------
# A resolved expression is a tuple: ("vllm", dotted) | ("inst", dotted class) | ("func", qual, node)
# | ("class", qual, node) | ("plugin", dotted) | ("ext", dotted) | ("lit", value)


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

    def __init__(self, path: str, module: str, plugin_tops: set[str], is_package: bool = False):
        self.path = path
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.plugin_tops = plugin_tops
        self.sites: list[Site] = []
        self.scopes: list[dict[str, Any]] = []
        self.qual: list[str] = []
        self.loops: list[dict[str, list[str]]] = []  # for NAME in ("a", "b"): setattr(X, NAME, ...)
        self._resolving: set[int] = set()
        self.errors: list[tuple[int, str]] = []  # (line, error) of statements the visitor gave up on
        self.facts_classes: list = []  # (qualname, node, bases) of every class of the file

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

    def collect(self, body: list[ast.stmt], args: Optional[ast.arguments] = None, fn: Optional[ast.AST] = None
                ) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.param_hints.get(id(fn), {})) if fn is not None else {}
        if args is not None:
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None and a.arg not in out:
                    out[a.arg] = ("param",)
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.annotation is not None and a.arg not in self.param_hints.get(id(fn), {}):
                    out[a.arg] = ("annot", a.annotation)
        for node in _scope_nodes(body):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        out[a.asname] = (self._kind_of(a.name), a.name)
                    else:
                        top = a.name.split(".")[0]
                        out[top] = (self._kind_of(top), top)
            elif isinstance(node, ast.ImportFrom):
                mod = self._absolute(node)
                for a in node.names:
                    if a.name == "*":
                        continue
                    full = f"{mod}.{a.name}" if mod else a.name
                    out[a.asname or a.name] = (self._kind_of(full), full)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = ("func", self._qualname(node.name), node)
            elif isinstance(node, ast.ClassDef):
                out[node.name] = ("class", self._qualname(node.name), node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = ("expr", node.value, len(self.scopes))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = ("expr", node.value, len(self.scopes)) if node.value is not None else (
                    "annot", node.annotation)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name):
                        out[item.optional_vars.id] = ("expr", item.context_expr, len(self.scopes))
        return out

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
            if r[0] in ("vllm", "plugin", "ext"):
                if e.attr in ("__func__", "__wrapped__"):
                    return r
                return (r[0], f"{r[1]}.{e.attr}")
            if r[0] == "inst":
                return ("vllm_inst", f"{r[1]}.{e.attr}")
            if r[0] == "class":
                return ("plugin_attr", f"{r[1]}.{e.attr}")
            return None
        if isinstance(e, ast.Call):
            f = self.resolve(e.func, depth + 1)
            if f is None:
                return None
            fname = f[1] if f[0] in ("ext", "vllm", "plugin") else ""
            if fname in ("builtins.getattr", "getattr") and len(e.args) >= 2 and _const_str(e.args[1]):
                r = self.resolve(e.args[0], depth + 1)
                if r is not None and r[0] in ("vllm", "plugin", "ext"):
                    return (r[0], f"{r[1]}.{_const_str(e.args[1])}")
                if r is not None and r[0] == "inst":
                    return ("vllm_inst", f"{r[1]}.{_const_str(e.args[1])}")
                return None
            if fname.endswith(("importlib.import_module", "builtins.__import__")) and e.args and _const_str(e.args[0]):
                name = _const_str(e.args[0])
                return (self._kind_of(name), name)
            if f[0] == "vllm" and f[1].split(".")[-1][:1].isupper():
                return ("inst", f[1])  # an object built from a vLLM class
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

    def _binding(self, b: tuple, level: int, depth: int) -> Optional[tuple]:
        if b[0] in ("vllm", "plugin", "ext", "func", "class"):
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
        self.sites.append(site)
        return site

    def run(self, tree: ast.Module) -> list[Site]:
        self.param_hints: dict[int, dict[str, tuple]] = {}
        self._pass(tree)  # first pass: which vLLM objects the file's own functions are called with
        self.sites, self.errors, self.scopes = [], [], []
        return self._pass(tree)

    def _pass(self, tree: ast.Module) -> list[Site]:
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
        self.scopes.append(self.collect(node.body, node.args, node))
        for stmt in node.body:
            self.visit(stmt)
        self.qual.pop()
        self._leave(node.name)

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
        self.facts_classes.append((cls_qual, node, bases))
        self._enter(node.body, None, node.name)
        for stmt in node.body:
            self.visit(stmt)
        self._leave(node.name)

    def visit_For(self, node):
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
                if b[0] == "expr" and is_same(b[1]):
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
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in
                ("classmethod", "staticmethod", "property") and len(value.args) == 1):
            value = value.args[0]
        if isinstance(value, ast.Call):
            f = self.resolve(value.func)
            fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
            if fname.endswith("MethodType") and value.args:
                ref = self._callable_ref(value.args[0])
                self.add("instance_attr" if instance else "wrap", node, dotted, what, instance=True, impl=ref,
                         calls_original=self._calls_original(ref, dotted))
                return
            if fname.endswith("functools.partial") and value.args:
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
    def _hint_params(self, f: tuple, node: ast.Call) -> None:
        fn = f[2]
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        given = list(zip(params, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
        for name, arg in given:
            if isinstance(arg, ast.Starred):
                break
            r = self.resolve(arg)
            if r is not None and r[0] in ("vllm", "inst"):
                self.param_hints.setdefault(id(fn), {})[name] = r

    def _call(self, node: ast.Call) -> None:
        f = self.resolve(node.func)
        if f is not None and f[0] == "func" and len(f) > 2 and isinstance(f[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._hint_params(f, node)
        fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
        leaf = fname.split(".")[-1]
        for kw in node.keywords:
            if kw.arg in CONFIG_FIELDS:
                self._config_field(kw.arg, kw.value, kw.value)
        if f is not None and f[0] == "ext":
            if fname in ("builtins.setattr",) and len(node.args) == 3:
                owner = self.resolve(node.args[0])
                names = [_const_str(node.args[1])] if _const_str(node.args[1]) else self._loop_names(node.args[1])
                if not names:  # a name bound to a string constant (RPC_NAME = "...")
                    lit = self.resolve(node.args[1])
                    names = [lit[1]] if lit is not None and lit[0] == "lit" and isinstance(lit[1], str) else []
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


def scan_tree(tree: ast.Module, path: str, module: str, plugin_tops: set[str], is_package: bool = False) -> FileScanner:
    sc = FileScanner(path, module, plugin_tops, is_package)
    sc.run(tree)
    return sc


__all__ = ["CONFIG_FIELDS", "FileScanner", "is_vllm", "scan_tree"]

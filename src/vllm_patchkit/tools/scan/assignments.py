"""Sites made by assignment: `X.m = f`, `setattr`-like stores into `__dict__` or `sys.modules`, `os.environ[...]`,
a config field set to a plugin class. Each is told apart (wrap, replace, class swap, a plain value) by what the
assigned value is and whether the installed function reaches the original. Also the config-field choice the call
and dict recognisers share (`config_field`).
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from vllm_patchkit.tools.scan.call_hints import CallHints
from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.references import References, _is_self
from vllm_patchkit.tools.scan.syntax import _const_scalar, _const_str, _short, is_vllm
from vllm_patchkit.tools.scan.value_sets import ValueSets

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


class AssignmentSites:
    """The recognisers of the assignments that make sites, in one file (`ctx`); they read names (`refs`), loop
    values (`vsets`), and tell the hint passes (`hints`) which functions are installed on vLLM classes."""

    def __init__(self, ctx: FileContext, refs: References, vsets: ValueSets, hints: CallHints):
        self.ctx = ctx
        self.refs = refs
        self.vsets = vsets
        self.hints = hints

    def assign(self, t: ast.AST, value: ast.AST, node: ast.AST) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(t.elts) else None
            for i, el in enumerate(t.elts):
                if vals is not None:
                    self.assign(el, vals[i], node)
            return
        if isinstance(t, ast.Subscript):
            key = _const_str(t.slice)
            owner = self.refs.resolve(t.value)
            if owner and owner[0] == "ext" and owner[1] == "sys.modules" and is_vllm(key):
                self.ctx.add("sys_modules", node, key, f"sys.modules[{key!r}] = {_short(value)}")
            elif owner and owner[0] == "ext" and owner[1] == "os.environ" and key and key.startswith("VLLM"):
                self.ctx.add("env", node, None, f"{key} = {_short(value)} (overwrites)", env=key,
                         value=_const_scalar(value), overwrites=True)
            elif owner and owner[0] == "vllm" and isinstance(t.value, ast.Attribute) and t.value.attr == "__dict__" and key:
                self.vllm_set(f"{owner[1]}".removesuffix(".__dict__") + f".{key}", value, node, False)
            elif owner and owner[0] == "vllm" and key:  # an entry of one of vLLM's mappings: a registry
                self.ctx.add("registry", node, owner[1], f"{_short(t.value)}[{key!r}] = {_short(value)}", entry=key,
                             impl=self.refs.callable_ref(value))
            return
        if not isinstance(t, ast.Attribute):
            return
        if t.attr in CONFIG_FIELDS:
            self.config_field(t.attr, value, node)
            return
        owner = self.refs.resolve(t.value)
        if _is_self(owner):
            return
        if owner is None:
            if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                self._unresolved(t, value, node)
            if _is_method_type(self.refs, value):
                self.ctx.add("instance_attr", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr,
                         impl=self.refs.callable_ref(value.args[0] if value.args else None))
            return
        if owner[0] == "vllm":
            self.vllm_set(f"{owner[1]}.{t.attr}", value, node, False)
        elif owner[0] == "inst":
            self.vllm_set(f"{owner[1]}.{t.attr}", value, node, True)
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
            f = self.refs.resolve(value.func)
            if f is not None and f[0] in ("func", "plugin") and any(
                    is_same(sub) for a in value.args for sub in ast.walk(a)):
                self.ctx.add("wrap", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr, unresolved=_short(t.value),
                         impl=f, calls_original=True)
            return
        ref = self.refs.callable_ref(value)
        if ref is None or ref[0] != "func" or len(ref) < 3 or isinstance(ref[2], ast.Lambda):
            return
        saved = set()
        for scope in self.ctx.scopes[1:]:
            for name, b in scope.items():
                if isinstance(b, tuple) and b[0] == "expr" and is_same(b[1]):
                    saved.add(name)
        if saved and any(isinstance(sub, ast.Name) and sub.id in saved for sub in ast.walk(ref[2])):
            self.ctx.add("instance_attr", node, None, f"{_short(t)} = {_short(value)}", attr=t.attr,
                     unresolved=_short(t.value), impl=ref, calls_original=True)

    def vllm_set(self, dotted: str, value: ast.AST, node: ast.AST, instance: bool) -> None:
        if dotted.split(".")[-1] in ("__class__",):
            return
        what = _short(value)
        wrapper_kind = None
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in
                ("classmethod", "staticmethod", "property") and len(value.args) == 1):
            wrapper_kind = value.func.id
            value = value.args[0]
        if self.hints.hinting and not instance:
            self.hints.note_installed(dotted, value, wrapper_kind)
        if isinstance(value, ast.Call):
            f = self.refs.resolve(value.func)
            fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
            if fname.endswith("MethodType") and value.args:
                ref = self.refs.callable_ref(value.args[0])
                self.ctx.add("instance_attr" if instance else "wrap", node, dotted, what, instance=True, impl=ref,
                         calls_original=self._calls_original(ref, dotted))
                return
            if fname.endswith(("functools.partial", "functools.partialmethod")) and value.args:
                ref = self.refs.callable_ref(value.args[0])
                orig = self._refers_to(value, dotted)
                self.ctx.add("wrap" if orig else "replace", node, dotted, what, instance=instance, impl=ref,
                         calls_original=orig)
                return
            if self._refers_to(value, dotted):
                self.ctx.add("wrap", node, dotted, what, instance=instance, impl=f,
                         wrapper=_short(value.func), calls_original=True)
                return
            if f is not None and f[0] in ("func", "plugin") and _is_wrapper_factory(f):
                self.ctx.add("wrap", node, dotted, what, instance=instance, impl=f, wrapper=_short(value.func),
                         calls_original=None)
                return
            self.ctx.add("setattr", node, dotted, what, instance=instance, value_kind="object")
            return
        ref = self.refs.callable_ref(value)
        if ref is not None and ref[0] == "func":
            orig = self._calls_original(ref, dotted)
            self.ctx.add("wrap" if orig else "replace", node, dotted, what, instance=instance, impl=ref,
                     calls_original=orig)
            return
        if ref is not None and (ref[0] == "class" or (ref[0] == "plugin" and ref[1].split(".")[-1][:1].isupper())):
            self.ctx.add("class_swap", node, dotted, what, instance=instance, impl=ref)
            return
        if ref is not None and ref[0] in ("plugin", "plugin_attr"):
            self.ctx.add("replace", node, dotted, what, instance=instance, impl=ref, calls_original=None)
            return
        if ref is not None and ref[0] == "vllm":
            self.ctx.add("setattr", node, dotted, what, instance=instance, value_kind="vllm", value_path=ref[1])
            return
        lit = _literal(value)
        if lit is not _NO:
            self.ctx.add("setattr", node, dotted, what, instance=instance, value_kind="literal", value=lit)
            return
        self.ctx.add("setattr", node, dotted, what, instance=instance, value_kind="object")

    def _refers_to(self, e: ast.AST, dotted: str) -> bool:
        for sub in ast.walk(e):
            if isinstance(sub, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                r = self.refs.resolve(sub)
                if r is not None and r[0] in ("vllm", "vllm_inst") and r[1] == dotted:
                    return True
        return False

    def _calls_original(self, ref: Optional[tuple], dotted: str) -> Optional[bool]:
        """Does the installed function reach the original (a name bound to it, `X.__wrapped__`, super())?"""
        if ref is None or ref[0] != "func" or len(ref) < 3:
            return None
        fn = ref[2]
        leaf = dotted.split(".")[-1]
        self.ctx.scopes.append(self.refs.collect(fn.body, fn.args) if not isinstance(fn, ast.Lambda) else {})
        try:
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Name) and sub.id in ("wrapped", "original", "orig", "_orig", "_original",
                                                            "old", "_old", "fn", "func") and isinstance(sub.ctx, ast.Load):
                    b, _ = self.ctx.lookup(sub.id)
                    if b is None or b[0] == "expr":
                        r = self.refs.resolve(sub)
                        if r is None or (r[0] in ("vllm", "vllm_inst") and r[1] == dotted):
                            return True
                if isinstance(sub, (ast.Name, ast.Attribute)) and isinstance(getattr(sub, "ctx", None), ast.Load):
                    r = self.refs.resolve(sub)
                    if r is not None and r[0] in ("vllm", "vllm_inst") and r[1] == dotted:
                        return True
                    if r is None and isinstance(sub, ast.Name) and (self.ctx.lookup(sub.id)[0] or ("",))[0] == "expr":
                        # a name bound to one of several objects (`current = getattr(modules[0], NAME)`)
                        if any(v[0] in ("vllm", "vllm_inst") and v[1] == dotted for v in self.vsets.values(sub, 0)):
                            return True
                if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == leaf
                        and isinstance(sub.func.value, ast.Call) and isinstance(sub.func.value.func, ast.Name)
                        and sub.func.value.func.id == "super"):
                    return True
            return False
        finally:
            self.ctx.scopes.pop()

    def config_field(self, name: str, value: ast.AST, node: ast.AST) -> None:
        ref = self.refs.resolve(value)
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
        self.ctx.add("config_field", node, None, f"{name} = {_short(value)}", field=name, config_field=CONFIG_FIELDS[name],
                 cls=cls)


class _No:
    pass


_NO = _No()


def _literal(e: ast.AST) -> Any:
    try:
        return ast.literal_eval(e)
    except Exception:
        return _NO


def _is_method_type(scanner: References, value: ast.AST) -> bool:
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


__all__ = ["AssignmentSites", "CONFIG_FIELDS"]

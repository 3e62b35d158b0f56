"""Sites made by a call or a decorator: `setattr(X, "m", f)`, wrapt's wrappers, `os.environ.setdefault`,
`sys.modules.update`, `mock.patch.object`, `functools.wraps(vllm_fn)`, a registration into one of vLLM's registries,
a config field passed as a keyword. Calls of the file's own functions and classes are noted for the hint passes.
"""

from __future__ import annotations

import ast
import re

from vllm_patchkit.tools.scan.assignments import CONFIG_FIELDS, AssignmentSites
from vllm_patchkit.tools.scan.call_hints import CallHints
from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.references import References, _is_self
from vllm_patchkit.tools.scan.syntax import _const_scalar, _const_str, _short, is_vllm

#: Registration entry points of vLLM's registries (the last name of the callee).
REGISTRY_CALLS = {
    "register_model", "register_quantization_config", "register_connector", "register_backend",
    "register_module", "register_lora_manager", "register_oot", "register_kv_connector", "register_lazy_module",
    "register_logits_processor", "register_processor", "register_platform", "register_op",
}

WRAPT_CALLS = ("wrap_function_wrapper", "patch_function_wrapper", "wrap_object", "wrap_object_attribute",
               "function_wrapper_on", "transient_function_wrapper")


class CallSites:
    """The recognisers of calls and decorators in one file (`ctx`: its `loops` is what the walk pushes for a loop
    over literal names, `for NAME in ("a", "b"): setattr(X, NAME, ...)`); a store they find is judged by the
    assignment recognisers (`assigns`), a call of the file's own function noted for the hint passes (`hints`)."""

    def __init__(self, ctx: FileContext, refs: References, hints: CallHints, assigns: AssignmentSites):
        self.ctx = ctx
        self.refs = refs
        self.hints = hints
        self.assigns = assigns
        self._decorating: set[int] = set()  # decorator calls: their registration is the decorator's site

    def call(self, node: ast.Call) -> None:
        f = self.refs.resolve(node.func)
        if f is not None and f[0] == "func" and len(f) > 2 and isinstance(f[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.hints.hint_params(f[2], node)
        elif f is not None and f[0] == "class" and len(f) > 2 and isinstance(f[2], ast.ClassDef):
            init = next((s for s in f[2].body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
            if init is not None:
                self.hints.hint_params(init, node, skip_first=True)
        fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
        leaf = fname.split(".")[-1]
        for kw in node.keywords:
            if kw.arg in CONFIG_FIELDS:
                self.assigns.config_field(kw.arg, kw.value, kw.value)
        if f is not None and f[0] == "ext":
            if fname in ("builtins.setattr",) and len(node.args) == 3:
                owner = self.refs.resolve(node.args[0])
                names = [_const_str(node.args[1])] if _const_str(node.args[1]) else self._loop_names(node.args[1])
                if not names:  # a name bound to a string constant (RPC_NAME = "...", a loop value, an argument)
                    s = self.refs.str_of(node.args[1])
                    names = [s] if s else []
                if _is_self(owner):
                    return
                if owner is not None and owner[0] in ("vllm", "inst"):
                    for name in names or [None]:
                        if name is None:
                            self.ctx.add("setattr", node, f"{owner[1]}.<dynamic>", f"setattr(..., {_short(node.args[1])}, ...)",
                                     dynamic=True)
                        elif name in CONFIG_FIELDS:
                            self.assigns.config_field(name, node.args[2], node)
                        else:
                            self.assigns.vllm_set(f"{owner[1]}.{name}", node.args[2], node, owner[0] == "inst")
                elif names and names[0] in CONFIG_FIELDS:
                    self.assigns.config_field(names[0], node.args[2], node)
                return
            if leaf in WRAPT_CALLS and "wrapt" in fname or leaf == "wrap_function_wrapper":
                self._wrapt(node, node.args)
                return
            if fname in ("os.environ.setdefault", "os.putenv") and len(node.args) >= 2:
                key = _const_str(node.args[0])
                if key and key.startswith("VLLM"):
                    self.ctx.add("env", node, None, f"{key} = {_short(node.args[1])}" + (
                        " (default)" if fname.endswith("setdefault") else " (overwrites)"), env=key,
                        value=_const_scalar(node.args[1]), overwrites=not fname.endswith("setdefault"))
                return
            if fname == "os.environ.update" and node.args and isinstance(node.args[0], ast.Dict):
                for k, v in zip(node.args[0].keys, node.args[0].values):
                    key = _const_str(k) if k is not None else None
                    if key and key.startswith("VLLM"):
                        self.ctx.add("env", node, None, f"{key} = {_short(v)} (overwrites)", env=key,
                                 value=_const_scalar(v), overwrites=True)
                return
            if fname in ("sys.modules.setdefault", "sys.modules.update", "sys.modules.pop", "sys.modules.__setitem__"):
                keys = [_const_str(node.args[0])] if node.args and _const_str(node.args[0]) else []
                if node.args and isinstance(node.args[0], ast.Dict):
                    keys = [_const_str(k) for k in node.args[0].keys if k is not None]
                for key in keys:
                    if is_vllm(key):
                        self.ctx.add("sys_modules", node, key, f"{fname}({key!r}, ...)")
                return
            if leaf == "object" and ("mock.patch" in fname or fname.endswith("patch.object")) and len(node.args) >= 2:
                owner = self.refs.resolve(node.args[0])
                name = _const_str(node.args[1])
                if owner is not None and owner[0] == "vllm" and name:
                    self.assigns.vllm_set(f"{owner[1]}.{name}", node.args[2] if len(node.args) > 2 else ast.Constant(None),
                                   node, False)
                return
            if (leaf == "patch" and "mock" in fname) and node.args and is_vllm(_const_str(node.args[0])):
                self.ctx.add("setattr", node, _const_str(node.args[0]), _short(node), value_kind="object")
                return
        if f is not None and f[0] == "vllm" and id(node) not in self._decorating:
            if leaf in REGISTRY_CALLS or _registers(fname, leaf):
                self.ctx.add("registry", node, fname, _short(node), names=[_short(a) for a in node.args[:2]])

    def _loop_names(self, e: ast.AST) -> list[str]:
        if isinstance(e, ast.Name):
            for frame in reversed(self.ctx.loops):
                if e.id in frame:
                    return frame[e.id]
        return []

    def _wrapt(self, node: ast.AST, args: list[ast.AST]) -> None:
        if len(args) < 2:
            return
        mod = _const_str(args[0])
        if mod is None:
            r = self.refs.resolve(args[0])
            mod = r[1] if r is not None and r[0] == "vllm" else None
        name = _const_str(args[1])
        if is_vllm(mod) and name:
            self.ctx.add("wrapt", node, f"{mod}.{name}", _short(node), impl=self.refs.callable_ref(args[2]) if len(args) > 2 else None,
                     module=mod, attr=name)

    def decorator(self, d: ast.AST, owner: ast.AST) -> None:
        call = d if isinstance(d, ast.Call) else None
        f = self.refs.resolve(call.func if call is not None else d)
        fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
        leaf = fname.split(".")[-1]
        if call is not None and fname.endswith("functools.wraps") and call.args:
            r = self.refs.resolve(call.args[0])
            if r is not None and r[0] in ("vllm", "vllm_inst"):
                self.ctx.add("functools_wraps", owner, r[1], f"def {getattr(owner, 'name', '?')} (functools.wraps)",
                         impl=("func", self.ctx.qualname(getattr(owner, "name", "?")), owner))
            return
        if call is not None and "wrapt" in fname and leaf in WRAPT_CALLS:
            self._wrapt(owner, call.args)
            return
        if f is not None and f[0] == "vllm" and (leaf in REGISTRY_CALLS or leaf.startswith("register")):
            if call is not None:
                self._decorating.add(id(call))  # one registration, one site (the decorator's line)
            self.ctx.add("registry", d, fname, f"@{_short(d)} on {getattr(owner, 'name', '?')}",
                     names=[_short(a) for a in (call.args[:2] if call is not None else [])])


def _registers(fname: str, leaf: str) -> bool:
    """A vLLM callable named for registering (`register` as a word of its name: `register_model_loader`,
    `direct_register_custom_op`, not `unregister`): a method of a registry-like class, or a module function."""
    if not re.search(r"(?:^|_)register(?:_|$)", leaf):
        return False
    owner = fname.split(".")[-2] if "." in fname else ""
    return _owner_is_registry(fname) or owner[:1].islower()


def _owner_is_registry(fname: str) -> bool:
    parts = fname.split(".")
    return len(parts) > 1 and any(w in parts[-2] for w in ("Registry", "Factory", "Manager", "CustomOp", "Registries"))


__all__ = ["CallSites", "REGISTRY_CALLS", "WRAPT_CALLS"]

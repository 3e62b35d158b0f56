"""Static, decorators: the kind a decorated def has live, and the `__wrapped__` layers above it.

The project's rules for what `fingerprint.raw_kind` and `fingerprint.wrapper_layers` will see on the
imported object, guessed from the source (the decorator is not run). Live, a layer is anything with
`__wrapped__`. Applied bottom-up, as Python applies decorators:

- a decorator known not to wrap (`NOT_WRAPPING`: staticmethod, property, abstractmethod, overload,
  pydantic validators, ...) adds nothing;
- `functools.cache`/`lru_cache` add `functools._lru_cache_wrapper` (the layer is an object);
- a decorator defined in the release adds a layer named `<module>.<qualname>` of the function (what a
  `functools.wraps` layer reports live) if its code calls `wraps`/`update_wrapper` or sets
  `__wrapped__`; if it always returns a nested function without them, that nested function is what
  live sees (its signature and digest are read instead, and no layer below it remains); otherwise it
  is taken to return the function unchanged (a registration);
- a decorator from outside the release (torch, ...) counts as one layer;
- vLLM decorators that wrap only in some environments are listed in `KNOWN_DECORATORS` with their
  usual behaviour (`@instrument` wraps when OpenTelemetry is importable; `@with_gpu_sync_check` only
  in a debug mode): in another environment the live layers differ from the pin.

Class decorators that replace methods (vLLM's `@support_torch_compile` rewrites `__init__`) are not seen.
"""

from __future__ import annotations

import ast
from typing import Any, Callable, Optional

from vllm_patchkit.upstream.static_tables import FUNCS, dotted

# Decorators that leave no `__wrapped__` layer (matched on the last dotted name).
NOT_WRAPPING = frozenset({
    "staticmethod", "classmethod", "property", "cached_property", "abstractmethod", "abstractproperty",
    "overload", "override", "final", "setter", "getter", "deleter", "no_type_check", "runtime_checkable",
    "dataclass", "total_ordering", "unique", "unused", "ignore", "export",
    "model_validator", "field_validator", "validator", "root_validator", "field_serializer", "model_serializer",
})
# Decorators whose layer is an object, not a function: live names the object's type.
OBJECT_LAYERS = {"lru_cache": "functools._lru_cache_wrapper", "cache": "functools._lru_cache_wrapper"}
# vLLM's decorators that wrap only in some environments: do they in a standard deployment?
KNOWN_DECORATORS = {
    "vllm.tracing:instrument": True,  # wraps when OpenTelemetry is importable (a dependency of vLLM)
    "vllm.utils.gpu_sync_debug:with_gpu_sync_check": False,  # wraps only in vLLM's GPU-sync debug mode
}
ATTRIBUTE_DECORATORS = frozenset({"property", "cached_property", "setter", "getter", "deleter", "abstractproperty"})

# (module, dotted name written there) -> ("def", module, qualname, node) where the release defines it,
# anything else (a Missing, ("external", ...), ("value", ...)) when it does not define a def there.
Resolver = Callable[[str, str], Any]


def _last(dec: ast.expr) -> str:
    return (dotted(dec.func if isinstance(dec, ast.Call) else dec) or "").rpartition(".")[2]


def sets_wrapped(node: ast.AST) -> bool:
    """Does this decorator (or decorator factory, or class) leave `__wrapped__` on what it returns?"""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if (dotted(n.func) or "").rpartition(".")[2] in ("wraps", "update_wrapper"):
                return True
        elif isinstance(n, ast.Attribute) and n.attr == "__wrapped__" and isinstance(n.ctx, ast.Store):
            return True
    return False


def returned_nested_def(fn: ast.AST) -> Optional[ast.AST]:
    """The nested function a plain decorator always returns (None if it may return anything else)."""
    nested = {st.name: st for st in fn.body if isinstance(st, FUNCS)}
    returns: list[ast.Return] = []
    stack = list(fn.body)
    while stack:
        st = stack.pop()
        if isinstance(st, ast.Return):
            returns.append(st)
        elif not isinstance(st, (*FUNCS, ast.ClassDef)):
            stack.extend(c for c in ast.iter_child_nodes(st) if isinstance(c, ast.stmt))
    names = {r.value.id if isinstance(r.value, ast.Name) else None for r in returns}
    if len(names) == 1:
        name = names.pop()
        return nested.get(name) if name else None
    return None


def kind_of(node: ast.AST, owner_is_class: bool) -> str:
    """As `fingerprint.raw_kind` will see the object in the class or module `__dict__`."""
    if isinstance(node, ast.ClassDef):
        return "class"
    if not owner_is_class:
        return "function"
    for d in node.decorator_list:  # outermost first; decorators that return their argument are skipped
        last = _last(d)
        if last in ("staticmethod", "classmethod"):
            return last
        if last in ATTRIBUTE_DECORATORS:
            return "attribute"
        if last in ("field_validator", "validator", "root_validator"):
            return "classmethod"  # pydantic makes these class methods
        if last == "model_validator":
            mode = next((k.value for k in getattr(d, "keywords", []) if k.arg == "mode"), None)
            after = isinstance(mode, ast.Constant) and mode.value == "after"
            return "method" if after else "classmethod"
        if last not in NOT_WRAPPING:
            break
    return "method"


def decorated(module: str, qual: str, node: ast.AST, resolve: Resolver) -> tuple[ast.AST, tuple[str, ...]]:
    """What `inspect.unwrap` reaches under the decorators of `module:qual`, and the layers above it."""
    if not isinstance(node, FUNCS):
        return node, ()
    bottom, bottom_name, layers = node, f"{module}.{qual}", []
    for dec in reversed(node.decorator_list):
        how = _decorator(module, dec, resolve)
        if how[0] == "layer":
            layers.insert(0, how[1] or bottom_name)
        elif how[0] == "replace":
            bottom, bottom_name, layers = how[2], how[1], []
    return bottom, tuple(layers)


def _decorator(module: str, dec: ast.expr, resolve: Resolver) -> tuple:
    """("none",) | ("layer", name or None for the function's own name) | ("replace", name, nested def)."""
    name = dotted(dec.func if isinstance(dec, ast.Call) else dec)
    last = (name or "").rpartition(".")[2]
    if last in NOT_WRAPPING:
        return ("none",)
    if last in OBJECT_LAYERS:
        return ("layer", OBJECT_LAYERS[last])
    r = resolve(module, name) if name else None
    if not (isinstance(r, tuple) and r[0] == "def"):
        return ("layer", None)  # outside the release: assume a functools.wraps layer
    _, where_module, where_qual, fn = r
    where = f"{where_module}:{where_qual}"
    if where in KNOWN_DECORATORS:
        return ("layer", None) if KNOWN_DECORATORS[where] else ("none",)
    if isinstance(fn, ast.ClassDef):
        return ("layer", f"{where_module}.{where_qual}") if sets_wrapped(fn) else ("layer", None)
    if sets_wrapped(fn):
        return ("layer", None)
    if not isinstance(dec, ast.Call):
        nested = returned_nested_def(fn)
        if nested is not None:
            return ("replace", f"{where_module}.{where_qual}.<locals>.{nested.name}", nested)
    return ("none",)  # returns the function itself (a registration) or nothing we can read


__all__ = ["ATTRIBUTE_DECORATORS", "KNOWN_DECORATORS", "NOT_WRAPPING", "OBJECT_LAYERS", "decorated", "kind_of",
           "returned_nested_def", "sets_wrapped"]

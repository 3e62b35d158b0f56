"""The reach pinned for a patch, checked against the imported vLLM: names only, no source read.

The manifest entry carries what the implementation reaches (`reach: {module:Class.name: {kind, defined}}`, written by
`pin` from the release's source: `reach.py`). At start-up the loader asks the live class whether it still has each
name, the way the static reader (`tools/reach_types.py`) asks the source, so check and the loader give one verdict:

- in the `__dict__` of the class or of a class of its MRO (a method, a property, a class attribute, a slot);
- a field: `__dataclass_fields__`, a NamedTuple's `_fields`, pydantic's `model_fields`, msgspec's `__struct_fields__`;
- `__getattr__` on a class of the MRO other than `object`: any name;
- assigned on each object by a method of a class of the MRO in the class's own top-level package: the method's
  bytecode stores the attribute on its first parameter (`LOAD_FAST self; STORE_ATTR name`), the rule
  `static_tables.instance_assignments` reads from source (static and class methods and nested functions not
  counted). Reading bytecode costs a `co_names` membership test per method, then `dis` only where the name occurs.

An import (`module:name`): the module has the attribute, or a submodule of that name is importable.
A class or module the loader cannot import is reported as missing: the implementation would fail there too.
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import sys
from types import CodeType
from typing import Any, Optional

from vllm_patchkit.declaration.pins import ReachPin

FIELD_TABLES = ("__dataclass_fields__", "_fields", "model_fields", "__struct_fields__")


def _module(name: str) -> Optional[Any]:
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:  # a module the implementation reaches in: it imports it when it runs
        return importlib.import_module(name)
    except Exception:
        return None


def _stores_on_self(code: CodeType, name: str) -> bool:
    """Does this function's own code assign `<first parameter>.name`?"""
    if name not in code.co_names or not (code.co_argcount or code.co_posonlyargcount):
        return False
    me = code.co_varnames[0]
    prev = None
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_ATTR" and ins.argval == name and prev is not None and prev.opname.startswith(
                "LOAD_FAST"):
            loaded = prev.argval[-1] if isinstance(prev.argval, tuple) else prev.argval
            if loaded == me:
                return True
        prev = ins
    return False


def _function_code(value: Any) -> Optional[CodeType]:
    if isinstance(value, (staticmethod, classmethod)):
        return None
    if isinstance(value, property):
        value = value.fget
    while hasattr(value, "__wrapped__"):
        value = value.__wrapped__
    return getattr(value, "__code__", None)


def defines(cls: type, name: str) -> bool:
    """Does an object of `cls` get attribute `name` from vLLM's code (see the module docstring)?"""
    mro = getattr(cls, "__mro__", (cls,))
    if any(name in vars(k) for k in mro):
        return True
    for table in FIELD_TABLES:
        fields = getattr(cls, table, None)
        if isinstance(fields, (dict, tuple, list)) and name in fields:
            return True
    if any("__getattr__" in vars(k) for k in mro if k is not object):
        return True
    top = cls.__module__.split(".")[0]
    for k in mro:
        if k.__module__.split(".")[0] != top:
            continue
        for value in vars(k).values():
            code = _function_code(value)
            if code is not None and _stores_on_self(code, name):
                return True
    return False


def missing(key: str, pin: ReachPin) -> Optional[str]:
    """Why the running vLLM does not have the reached name `key` (None: it has it)."""
    module, _, qual = key.partition(":")
    mod = _module(module)
    if mod is None:
        return f"module {module} cannot be imported"
    if pin.kind == "import":
        if hasattr(mod, qual):
            return None
        try:
            if importlib.util.find_spec(f"{module}.{qual}") is not None:
                return None
        except (ImportError, ValueError):
            pass
        return f"{module} has no {qual}"
    owner, _, name = qual.rpartition(".")
    cls: Any = mod
    for part in owner.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            return f"{module} has no class {owner}"
    if not isinstance(cls, type):
        return f"{module}:{owner} is not a class"
    if defines(cls, name):
        return None
    what = "method" if pin.kind == "method" else "attribute"
    return (f"{owner} defines no such {what} (not on the class or its bases, not a field, and no method of "
            f"{cls.__module__.split('.')[0]}'s classes in its MRO assigns self.{name})")


__all__ = ["defines", "missing"]

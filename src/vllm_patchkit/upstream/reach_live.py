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

from vllm_patchkit.declaration.names import Target
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


_STORE_ATTR = dis.opmap["STORE_ATTR"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_CACHE = dis.opmap.get("CACHE", -1)
#: LOAD_FAST and its variants -> True when it loads two locals (3.13's LOAD_FAST_LOAD_FAST: the last in the low bits)
_LOADS_LOCAL = {op: name.count("LOAD_FAST") == 2 for name, op in dis.opmap.items() if name.startswith("LOAD_FAST")}
#: a first parameter a nested function captures is a cell: loaded by LOAD_DEREF of its slot (0), Python >= 3.11
_LOADS_CELL = {op: False for name, op in dis.opmap.items() if name == "LOAD_DEREF"}


def _stores_on_self(code: CodeType, name: str) -> bool:
    """Does this function's own code assign `<first parameter>.name` (`LOAD_FAST 0; STORE_ATTR name`, `LOAD_DEREF 0`
    when a nested function captures it)? Read from
    the raw bytecode (`co_code` is never specialised): `dis.get_instructions` costs ~1 ms a method."""
    if name not in code.co_names or not (code.co_argcount or code.co_posonlyargcount):
        return False
    wanted = {i for i, n in enumerate(code.co_names) if n == name}
    raw = code.co_code
    loads = {**_LOADS_LOCAL, **_LOADS_CELL} if code.co_varnames[0] in code.co_cellvars else _LOADS_LOCAL
    if max(wanted) < 256:  # no EXTENDED_ARG: the two instructions are adjacent words; bytes.find scans in C
        for load, low in loads.items():
            for arg in range(0, 256, 16) if low else (0,):
                for index in wanted:
                    at = raw.find(bytes((load, arg, _STORE_ATTR, index)))
                    while at != -1:
                        if at % 2 == 0:
                            return True
                        at = raw.find(bytes((load, arg, _STORE_ATTR, index)), at + 1)
        return False
    prev_op, prev_arg, ext = -1, -1, 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | ext
        if op == _EXTENDED_ARG:
            ext = arg << 8
            continue
        ext = 0
        if op == _CACHE:
            continue
        if op == _STORE_ATTR and arg in wanted and prev_op in loads:
            if (prev_arg & 15 if loads[prev_op] else prev_arg) == 0:
                return True
        prev_op, prev_arg = op, arg
    return False


def assigned_on_self(cls: type) -> set[str]:
    """Every attribute the class's own methods assign on their first parameter (what `instance_assignments`
    reads from its source)."""
    out = set()
    for value in vars(cls).values():
        for code in _codes(value):
            out.update(n for n in set(code.co_names) if _stores_on_self(code, n))
    return out


def _codes(value: Any) -> list[CodeType]:
    """The code of a method as the class holds it (a property: its getter, setter and deleter); static and class
    methods have no object parameter and are not counted, as in the static rule."""
    if isinstance(value, (staticmethod, classmethod)):
        return []
    funcs = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
    out = []
    for f in funcs:
        while f is not None and hasattr(f, "__wrapped__"):
            f = f.__wrapped__
        code = getattr(f, "__code__", None)
        if isinstance(code, CodeType) and not code.co_filename.startswith("<"):  # a dataclass's generated
            # `__init__` has no source (the static rule cannot read it); its fields are counted as fields
            out.append(code)
    return out


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
        if any(_stores_on_self(code, name) for value in vars(k).values() for code in _codes(value)):
            return True
    return False


def missing(key: str, pin: ReachPin) -> Optional[str]:
    """Why the running vLLM does not have the reached name `key` (None: it has it)."""
    reached = Target.parse(key)
    module, qual = reached
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
    owner, name = reached.owner or "", reached.attr
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


__all__ = ["assigned_on_self", "defines", "missing"]

"""The vLLM side, read statically: where a dotted path lands in the release (`module:Qualname`), whether the
release has it, and which plugin functions are copies of an upstream body.

The release is read with `vllm_patchkit.tools.static.StaticRelease` (from the installed tree found without importing
it, or from a wheel / source folder); vLLM is never imported by the scan.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import Optional, Union

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.scan.copies import SIMILARITY, normalised, similarity
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import Definition, StaticRelease
from vllm_patchkit.upstream.static_tables import dotted as _dotted



class Upstream:
    """One release, read lazily; every question answered without raising."""

    def __init__(self, release: Optional[StaticRelease]):
        self.release = release
        self._modules: dict[str, bool] = {}
        self._memo: dict[tuple, object] = {}

    @classmethod
    def open(cls, source: Optional[Union[str, Path]] = None) -> "Upstream":
        """`source` (a wheel or folder), else the installed vLLM's tree (found without importing it), else none."""
        try:
            if source is not None:
                return cls(StaticRelease.open(source))
            from vllm_patchkit.tools.releases import installed_root
            from vllm_patchkit.upstream.static_source import DirSource

            root = installed_root()
            return cls(StaticRelease(DirSource(root)) if root is not None else None)
        except Exception:
            return cls(None)

    @property
    def label(self) -> Optional[str]:
        if self.release is None:
            return None
        try:
            return f"vLLM {self.release.version()} ({self.release.label})"
        except Exception:
            return f"vLLM ({self.release.label})"

    def version(self) -> Optional[str]:
        try:
            return self.release.version() if self.release is not None else None
        except Exception:
            return None

    def is_module(self, name: str) -> bool:
        if name not in self._modules:
            ok = False
            if self.release is not None:
                rel = name.replace(".", "/")
                src = self.release.source
                try:
                    ok = src.read(f"{rel}.py") is not None or src.read(f"{rel}/__init__.py") is not None
                except Exception:
                    ok = False
            self._modules[name] = ok
        return self._modules[name]

    def place(self, dotted: str) -> str:
        """`vllm.a.b.C.m` -> `vllm.a.b:C.m`: the longest prefix that is a module of the release (without a
        release: up to the first capitalised name, else all but the last). When that module lacks the lowercase
        name after it (`vllm.a.gone_mod.C.m`, `gone_mod` a module of another release), the place is read as
        without a release: `vllm.a.gone_mod:C.m` names the missing module as a module, not as an attribute."""
        parts = dotted.split(".")
        if self.release is not None:
            for i in range(len(parts), 0, -1):
                if self.is_module(".".join(parts[:i])):
                    rest = parts[i:]
                    if len(rest) < 2 or not rest[0].islower() or not self._lacks(".".join(parts[:i]), rest[0]):
                        return ".".join(parts[:i]) + (":" + ".".join(rest) if rest else "")
                    break
        for i, p in enumerate(parts):
            if p[:1].isupper() and i > 0:
                return ".".join(parts[:i]) + ":" + ".".join(parts[i:])
        return ".".join(parts[:-1]) + ":" + parts[-1] if len(parts) > 1 else dotted

    def _lacks(self, module: str, name: str) -> bool:
        """The release's module neither defines nor imports `name` (nor is it inherited or unreadable there)."""
        d = self.resolve(f"{module}:{name}")
        return isinstance(d, Missing) and not d.inherited_from and not d.unreadable

    def resolve(self, spec: str) -> Optional[Union[Definition, Missing]]:
        if self.release is None or ":" not in spec:
            return None
        try:
            return self.release.resolve(spec)
        except (Exception, RecursionError) as exc:  # a release module that does not parse
            return Missing(spec, f"unreadable: {type(exc).__name__}: {exc}", unreadable=True)

    def definition(self, spec: str) -> Optional[Definition]:
        """The def the release has for `spec`, following an inherited attribute to the base that defines it."""
        d = self.resolve(spec)
        if isinstance(d, Missing) and d.inherited_from:
            d = self.resolve(d.inherited_from)
        return d if isinstance(d, Definition) else None

    # -- what the scan asks about types (each answer a dotted path `vllm.a.b.C`, or None; never raises)
    def _class_def(self, dotted_path: str) -> Optional[tuple[str, str, ast.ClassDef]]:
        """(module, qualname, node) of the class a dotted path names in the release."""
        key = ("class", dotted_path)
        if key not in self._memo:
            out = None
            d = self.resolve(self.place(dotted_path)) if self.release is not None else None
            if isinstance(d, Definition) and isinstance(d.node, ast.ClassDef):
                out = (d.module, d.qualname, d.node)
            self._memo[key] = out
        return self._memo[key]

    def _type_checking_imports(self, module: str) -> dict[str, str]:
        """Names a module imports only under `if TYPE_CHECKING:` (annotations name them): name -> dotted path."""
        key = ("tc", module)
        if key not in self._memo:
            out: dict[str, str] = {}
            table = self.release.module(module) if self.release is not None else None
            raw = self.release.source.read(table.path) if table is not None else None
            lines = raw.decode("utf-8", "replace").splitlines() if raw else []
            for i, line in enumerate(lines):  # only the guarded block is parsed, not the whole module again
                if not re.match(r"if\s+(typing\.)?TYPE_CHECKING\s*:\s*(#.*)?$", line):
                    continue
                block = []
                for nxt in lines[i + 1:]:
                    if nxt.strip() and not nxt[:1].isspace():
                        break
                    block.append(nxt)
                try:
                    tree = ast.parse(textwrap.dedent("\n".join(block)))
                except (SyntaxError, ValueError):
                    continue
                for sub in tree.body:
                    if isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                        for a in sub.names:
                            out[a.asname or a.name] = f"{sub.module}.{a.name}"
            self._memo[key] = out
        return self._memo[key]

    def _annotation_class(self, module: str, ann: Optional[ast.AST], depth: int = 0) -> Optional[str]:
        """The vLLM class an annotation names (`X`, `"X"`, `Optional[X]`, `X | None`), as a dotted path."""
        out = self._annotation_any(module, ann, depth)
        return out if out and (out == "vllm" or out.startswith("vllm.")) else None

    def _annotation_any(self, module: str, ann: Optional[ast.AST], depth: int = 0) -> Optional[str]:
        if ann is None or depth > 4 or self.release is None:
            return None
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            for side in (ann.left, ann.right):
                if not (isinstance(side, ast.Constant) and side.value is None):
                    return self._annotation_class(module, side, depth + 1)
            return None
        if isinstance(ann, ast.Subscript):
            head = _dotted(ann.value) or ""
            if head.split(".")[-1] == "Optional":
                return self._annotation_class(module, ann.slice, depth + 1)
            return None
        name = _dotted(ann)
        if not name:
            return None
        try:
            r = self.release._dotted_in(module, name)
        except (Exception, RecursionError):
            r = None
        if isinstance(r, tuple) and r and r[0] == "def" and isinstance(r[3], ast.ClassDef):
            return f"{r[1]}.{r[2]}"
        head, _, rest = name.partition(".")
        via = self._type_checking_imports(module).get(head)
        if via:
            c = self._class_def(via + (f".{rest}" if rest else ""))
            return f"{c[0]}.{c[1]}" if c else None
        return None

    def _mro_of(self, dotted_path: str) -> list[tuple[str, ast.ClassDef]]:
        c = self._class_def(dotted_path)
        if c is None:
            return []
        try:
            return self.release._mro(c[0], c[1], c[2])
        except (Exception, RecursionError):
            return [(f"{c[0]}:{c[1]}", c[2])]

    def _value_class(self, module: str, value: Optional[ast.AST]) -> Optional[str]:
        """The class of the object an expression builds: `C(...)` for a class `C`, `f(...)` for a function whose
        return annotation names a class, `tuple(f(x) for ...)` / `[f(x) for ...]` as the element's class."""
        if isinstance(value, ast.Call):
            name = _dotted(value.func)
            if name in ("tuple", "list") and value.args and isinstance(value.args[0], ast.GeneratorExp):
                return self._value_class(module, value.args[0].elt)
            if not name:
                return None
            try:
                r = self.release._dotted_in(module, name)
            except (Exception, RecursionError):
                return None
            if isinstance(r, tuple) and r and r[0] == "def":
                if isinstance(r[3], ast.ClassDef):
                    return f"{r[1]}.{r[2]}" if r[1].split(".")[0] == "vllm" else None
                if isinstance(r[3], (ast.FunctionDef, ast.AsyncFunctionDef)):
                    return self._annotation_class(r[1], r[3].returns)
        if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            return self._value_class(module, value.elt)
        return None

    def attr_type(self, class_path: str, attr: str) -> Optional[str]:
        """The class of `obj.attr` for an object of class `class_path`, read from the release: a class-level
        annotation (`attr: C`, a dataclass field), `self.attr: C = ...`, or `self.attr = C(...)` / `= f(...)` (f
        annotated to return a class) in a method; first hit in MRO order. None if unknown or a method."""
        key = ("attr", class_path, attr)
        if key in self._memo:
            return self._memo[key]
        out = None
        for spec, node in self._mro_of(class_path):
            module = Target.parse(spec).module
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                    self._memo[key] = None
                    return None
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.target.id == attr):
                    out = self._annotation_class(module, stmt.annotation)
            if out is None:
                for fn in (s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))):
                    for sub in ast.walk(fn):
                        tgt = sub.target if isinstance(sub, ast.AnnAssign) else (
                            sub.targets[0] if isinstance(sub, ast.Assign) and len(sub.targets) == 1 else None)
                        if not (isinstance(tgt, ast.Attribute) and tgt.attr == attr and isinstance(tgt.value, ast.Name)
                                and tgt.value.id == "self"):
                            continue
                        out = (self._annotation_class(module, sub.annotation) if isinstance(sub, ast.AnnAssign)
                               else None) or self._value_class(module, sub.value)
                        if out:
                            break
                    if out:
                        break
            if out:
                break
        self._memo[key] = out
        return out

    def return_type(self, func_path: str) -> Optional[str]:
        """The class a release function's return annotation names (dotted), or None."""
        key = ("ret", func_path)
        if key not in self._memo:
            d = self.definition(self.place(func_path)) if self.release is not None else None
            self._memo[key] = (self._annotation_class(d.module, d.node.returns)
                               if d is not None and isinstance(d.node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        return self._memo[key]

    def param_types(self, method_path: str) -> dict[str, str]:
        """Parameter name -> class (dotted) for the annotated parameters of a release function or method."""
        key = ("params", method_path)
        if key not in self._memo:
            out: dict[str, str] = {}
            d = self.definition(self.place(method_path)) if self.release is not None else None
            if d is not None and isinstance(d.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = d.node.args
                for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    t = self._annotation_class(d.module, p.annotation)
                    if t:
                        out[p.arg] = t
            self._memo[key] = out
        return self._memo[key]

    def writes(self, func_spec: str) -> list[str]:
        """The tables a registration function (or method) of the release writes to: module-level names or class
        attributes it stores into (`T[k] = v`, `T.append(v)`, `cls._registry[k] = v`, `self.models[k] = v`), its
        nested functions (a decorator it returns) included, as `module:Qualname`."""
        key = ("writes", func_spec)
        if key in self._memo:
            return self._memo[key]
        out: list[str] = []
        d = self.definition(func_spec) if self.release is not None else None
        if d is not None and isinstance(d.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            owner = d.qualname.rpartition(".")[0]
            local = {n.id for n in ast.walk(d.node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            local |= {a.arg for n in ast.walk(d.node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                      for a in [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs]}
            for n in ast.walk(d.node):
                table = None
                if isinstance(n, (ast.Assign, ast.AugAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        if isinstance(t, ast.Subscript):
                            table = t.value
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and n.func.attr in ("append", "add", "update", "setdefault", "insert", "extend")):
                    table = n.func.value
                spec = None
                if isinstance(table, ast.Name) and table.id not in local:
                    spec = f"{d.module}:{table.id}"
                elif (isinstance(table, ast.Attribute) and isinstance(table.value, ast.Name)
                      and table.value.id in ("cls", "self") and owner):
                    spec = f"{d.module}:{owner}.{table.attr}"
                if spec and spec not in out:
                    r = self.resolve(spec)
                    if isinstance(r, Definition) or (isinstance(r, Missing) and (r.inherited_from or
                                                                                 table.value.id == "self")):
                        out.append(r.where if isinstance(r, Definition) else spec)
        self._memo[key] = out
        return out

    def takes_config(self, method_spec: str) -> bool:
        """Whether vLLM hands the method its configuration: a parameter annotated with a `vllm.config` class."""
        types = self.param_types(method_spec.replace(":", "."))
        return any(t.startswith("vllm.config.") for t in types.values())

    def root_of(self, method_spec: str) -> Optional[str]:
        """`module:Class.m` -> where the base-most vLLM class of its MRO in the release defines `m` (the
        interface method vLLM calls), or None."""
        cls, _, name = method_spec.rpartition(".")
        if not cls or ":" not in cls:
            return None
        found = None
        for spec, node in self._mro_of(cls.replace(":", ".")):
            if spec.split(".")[0] == "vllm" and any(
                    isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name for s in node.body):
                found = f"{spec}.{name}"
        return found


# -- copies: copies.py (re-exported for the callers that read them here) --------------------------
def normalised_lines(fn: ast.AST) -> list[str]:
    return list(normalised(fn))


def is_function(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))


__all__ = ["SIMILARITY", "Upstream", "normalised_lines", "similarity"]

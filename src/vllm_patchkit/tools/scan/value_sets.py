"""Value sets: the several objects one expression can be, so that a loop is read once per value it walks.

A loop's iterable is followed when it is a tuple of classes or names, a table of rows (`for owner, name, wrapper
in TABLE`), a list the function fills (`mods.append(importlib.import_module(name))` over a constant tuple), or the
list a plugin function of any file returns (`returns()`, which `scanner.py` gathers before the files are walked).
Beyond that (names built by string operations, dicts of patches filled at run time) nothing is followed: the scan
is a reading aid for a reviewer, tuned for recall.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from vllm_patchkit.tools.scan.references import APPENDS, ASSIGNS, FORS, References

#: at most this many values are followed through one loop or one helper function (more: the loop is read once)
MAX_VALUES = 16


class ValueSets(References):
    """The value sets of one file's expressions, on top of its name resolution."""

    def __init__(self, module: str, plugin_tops: set[str], is_package: bool = False, release: Any = None,
                 plugin_returns: Optional[dict[str, list[tuple]]] = None):
        super().__init__(module, plugin_tops, is_package, release)
        # functions of the plugin (any file) that return vLLM objects: dotted name -> the objects (see returns())
        self.plugin_returns: dict[str, list[tuple]] = dict(plugin_returns or {})
        self._multi: set = set()  # guards of the value-set resolution (_values / _elems)

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


__all__ = ["MAX_VALUES", "ValueSets"]

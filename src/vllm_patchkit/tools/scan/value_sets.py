"""Value sets: the several objects one expression can be, so that a loop is read once per value it walks.

A loop's iterable is followed when it is a tuple of classes or names, a table of rows (`for owner, name, wrapper
in TABLE`), a list the function fills (`mods.append(importlib.import_module(name))` over a constant tuple), or the
list a plugin function of any file returns (`returns()`, which `scanner.py` gathers before the files are walked).
Beyond that (names built by string operations, dicts of patches filled at run time) nothing is followed: the scan
is a reading aid for a reviewer, tuned for recall.
"""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.references import APPENDS, ASSIGNS, FORS, References

#: at most this many values are followed through one loop or one helper function (more: the loop is read once)
MAX_VALUES = 16


class ValueSets:
    """The value sets of one file's expressions (`ctx`), read through its names (`refs`); `plugin_returns`: the
    functions of the plugin (any file) that return vLLM objects, dotted name -> the objects (see returns())."""

    def __init__(self, ctx: FileContext, refs: References, plugin_returns: Optional[dict[str, list[tuple]]] = None):
        self.ctx = ctx
        self.refs = refs
        self.plugin_returns: dict[str, list[tuple]] = dict(plugin_returns or {})
        self._multi: set = set()  # guards of the value-set resolution (values / elems)

    # -- value sets: what a loop walks (a tuple of vLLM objects or names, a list the function fills, the list a
    # plugin function returns); each answer a list of resolved references, None for an element not read
    def iter_values(self, it: ast.AST) -> tuple[list[tuple], bool]:
        """(the values a loop over `it` binds, whether that is all of them): vLLM objects and constants only."""
        try:
            found = self.elems(it, 0)
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

    def iter_rows(self, it: ast.AST, names: list[str]) -> list[dict[str, Optional[tuple]]]:
        """`for owner, name, wrapper in TABLE`: one binding per row of a literal table of tuples (or of a name
        bound to one), or per item of a literal dict's `.items()`; an element the scan cannot read is None."""
        node, depth = it, 0
        items = False
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "items"
                and not node.args):
            node, items = node.func.value, True
        while isinstance(node, ast.Name) and depth < 5:
            b, level = self.ctx.lookup(node.id)
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
                r = self.refs.resolve(x)
                if r is None:
                    vs = self.values(x, 0)
                    r = vs[0] if len(vs) == 1 else None
                vals[n] = r
            rows.append(vals)
        return rows

    def elems(self, e: ast.AST, depth: int) -> Optional[list]:
        if depth > 12:
            return None
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            out: list = []
            for elt in e.elts:
                if isinstance(elt, ast.Starred):
                    out += self.elems(elt.value, depth + 1) or [None]
                else:
                    out += self.values(elt, depth + 1) or [None]
            return out
        if (isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(e.generators) == 1
                and isinstance(e.elt, ast.Name) and isinstance(e.generators[0].target, ast.Name)
                and e.elt.id == e.generators[0].target.id):  # [m for m in xs if ...]: a filter of xs
            return self.elems(e.generators[0].iter, depth + 1)
        if isinstance(e, ast.Name):
            b, level = self.ctx.lookup(e.id)
            if b is None or b[0] not in ("expr", "annot") or (level, e.id) in self._multi:
                return None
            scope = self.ctx.scopes[level]
            self._multi.add((level, e.id))
            try:
                out, known = [], False
                for v in scope.get(ASSIGNS, {}).get(e.id, []):
                    if (isinstance(v, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(v.generators) == 1
                            and isinstance(v.generators[0].iter, ast.Name) and v.generators[0].iter.id == e.id):
                        continue  # xs = [x for x in xs if ...] keeps (some of) what xs had
                    sub = self.ctx.in_scope(level, lambda v=v: self.elems(v, depth + 1))
                    out += sub if sub is not None else [None]
                    known = known or sub is not None
                for kind, a in scope.get(APPENDS, {}).get(e.id, []):
                    if kind == "elems":
                        sub = self.ctx.in_scope(level, lambda a=a: self.elems(a, depth + 1))
                    else:
                        sub = self.ctx.in_scope(level, lambda a=a: self.values(a, depth + 1))
                    out += sub if sub else [None]
                    known = True
                return out if known else None
            finally:
                self._multi.discard((level, e.id))
        if isinstance(e, ast.Call):
            f = self.refs.resolve(e.func)
            if f is None:
                return None
            if f[0] == "ext" and f[1] in ("builtins.list", "builtins.tuple", "builtins.sorted", "builtins.set",
                                          "builtins.reversed", "builtins.frozenset") and e.args:
                return self.elems(e.args[0], depth + 1)
            key = f[1] if f[0] == "plugin" else (f[1].replace(":", ".") if f[0] == "func" else None)
            if key and key in self.plugin_returns:
                return list(self.plugin_returns[key])
        return None

    def values(self, e: ast.AST, depth: int) -> list:
        """The objects an expression can be (more than one through a loop it sits in); [] when unknown."""
        r = self.refs.resolve(e)
        if r is not None and r[0] in ("vllm", "inst", "lit", "plugin", "ext"):
            return [r]
        if depth > 12:
            return []
        if isinstance(e, ast.Name):
            b, level = self.ctx.lookup(e.id)
            if b is None:  # the variable of a loop of an enclosing scope: what that loop walks
                for i in range(len(self.ctx.scopes) - 1, -1, -1):
                    its = self.ctx.scopes[i].get(FORS, {}).get(e.id)
                    if its:
                        out = []
                        for it in its:
                            out += [x for x in (self.ctx.in_scope(i, lambda it=it: self.elems(it, depth + 1)) or [])
                                    if x is not None]
                        return out
                return []
            if b[0] == "expr" and id(b[1]) not in self._multi:
                self._multi.add(id(b[1]))
                try:
                    return self.ctx.in_scope(level, lambda: self.values(b[1], depth + 1))
                finally:
                    self._multi.discard(id(b[1]))
            return []
        if isinstance(e, ast.Attribute):
            out = []
            for v in self.values(e.value, depth + 1):
                m = self.refs.member(v, e.attr, depth)
                if m is not None:
                    out.append(m)
            return out
        if isinstance(e, ast.Call):
            f = self.refs.resolve(e.func)
            fname = f[1] if f is not None and f[0] in ("ext", "vllm", "plugin") else ""
            if fname.endswith(("importlib.import_module", "builtins.__import__")) and e.args:
                return [(self.ctx.kind_of(v[1]), v[1]) for v in self.values(e.args[0], depth + 1)
                        if v[0] == "lit" and isinstance(v[1], str)]
            if fname in ("builtins.getattr", "getattr") and len(e.args) >= 2:
                names = [v[1] for v in self.values(e.args[1], depth + 1) if v[0] == "lit" and isinstance(v[1], str)]
                out = []
                for o in self.values(e.args[0], depth + 1):
                    for n in names:
                        m = self.refs.member(o, n, depth)
                        if m is not None:
                            out.append(m)
                return out
            return []
        if isinstance(e, ast.Subscript):
            return [x for x in (self.elems(e.value, depth + 1) or []) if x is not None]
        return []

    def returns(self, tree: ast.Module) -> dict[str, list[tuple]]:
        """The file's top-level functions that return vLLM objects (a list or tuple of them, built in the function
        or a module constant): `module.function` -> the objects. A plugin helper `runner_classes()` returning the
        vLLM classes to patch is walked by the loops that call it, in any file (Scan passes these to every
        file's scanner)."""
        out: dict[str, list[tuple]] = {}
        saved = self.ctx.scopes
        try:
            self.ctx.scopes = [self.refs.collect(tree.body)]
            for fn in tree.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                self.ctx.scopes.append(self.refs.collect(fn.body, fn.args, fn))
                try:
                    found: list[tuple] = []
                    for ret in _own_returns(fn):
                        for v in self.elems(ret.value, 0) or []:
                            if v is not None and v[0] in ("vllm", "inst") and v not in found:
                                found.append(v)
                    if found:
                        out[f"{self.ctx.module}.{fn.name}"] = found
                finally:
                    self.ctx.scopes.pop()
        except RecursionError:
            pass
        finally:
            self.ctx.scopes = saved
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

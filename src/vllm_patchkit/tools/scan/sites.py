"""The walk: every place one plugin file changes vLLM, found by reading the source (never importing it).

`FileScanner` visits the file's statements with the scopes they bind, reading a function once per distinct call
and a loop once per value it walks, and hands each assignment, call and decorator to its recogniser. It composes
the passes, one object and one module each, sharing one per-file context (`context.py`): `references.py` (what a
name refers to), `value_sets.py` (what a loop walks), `call_hints.py` (how the file's functions are called: the
hint passes `run()` repeats), `assignments.py` and `calls.py` (the site recognisers). One statement the walk cannot follow costs that statement, not the file.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from vllm_patchkit.tools.scan.assignments import CONFIG_FIELDS, AssignmentSites
from vllm_patchkit.tools.scan.call_hints import CallHints
from vllm_patchkit.tools.scan.calls import CallSites
from vllm_patchkit.tools.scan.context import FileContext
from vllm_patchkit.tools.scan.model import Site
from vllm_patchkit.tools.scan.references import References
from vllm_patchkit.tools.scan.syntax import _calls_super, _const_str, is_vllm
from vllm_patchkit.tools.scan.value_sets import MAX_VALUES, ValueSets


class FileScanner(ast.NodeVisitor):
    """Sites of one file. `module` is the file's module name; `plugin_tops` the plugin's top-level packages. It
    makes the file's context and its passes, each given the context and the passes it asks, and walks."""

    def __init__(self, path: str, module: str, plugin_tops: set[str], is_package: bool = False,
                 release: Any = None, plugin_returns: Optional[dict[str, list[tuple]]] = None):
        self.ctx = FileContext(path, module, plugin_tops, is_package, release)
        self.refs = References(self.ctx)
        self.vsets = ValueSets(self.ctx, self.refs, plugin_returns)
        self.hints = CallHints(self.ctx, self.refs)
        self.assigns = AssignmentSites(self.ctx, self.refs, self.vsets, self.hints)
        self.calls = CallSites(self.ctx, self.refs, self.hints, self.assigns)

    HINT_PASSES = 4

    # what scanner.py reads of one file's scan
    @property
    def path(self) -> str:
        return self.ctx.path

    @property
    def sites(self) -> list[Site]:
        return self.ctx.sites

    @property
    def errors(self) -> list[tuple[int, str]]:
        return self.ctx.errors

    @property
    def facts_classes(self) -> list:
        return self.ctx.facts_classes

    def returns(self, tree: ast.Module) -> dict[str, list[tuple]]:
        return self.vsets.returns(tree)

    def run(self, tree: ast.Module) -> list[Site]:
        """Hint passes (how the file's functions are called, which are installed on vLLM classes; repeated
        while that grows, so a helper calling a helper is followed), then the pass that keeps the sites."""
        self.hints.reset()
        for _ in range(self.HINT_PASSES):
            self.hints.start_pass()
            self._pass(tree)
            if not self.hints.end_pass():
                break
        self.hints.stop()
        return self._pass(tree)

    def _pass(self, tree: ast.Module) -> list[Site]:
        ctx = self.ctx
        ctx.new_pass()
        ctx.scopes.append(self.refs.collect(tree.body))
        for stmt in tree.body:  # one statement the visitor cannot follow costs that statement, not the file
            depth, qual, loops = len(ctx.scopes), list(ctx.qual), list(ctx.loops)
            try:
                self.visit(stmt)
            except (Exception, RecursionError) as exc:
                ctx.errors.append((getattr(stmt, "lineno", 0), f"{type(exc).__name__}: {exc}"))
                del ctx.scopes[depth:]
                ctx.qual, ctx.loops = qual, loops
        return ctx.sites

    def _enter(self, body, args=None, name: Optional[str] = None):
        if name is not None:
            self.ctx.qual.append(name)
        self.ctx.scopes.append(self.refs.collect(body, args))

    def _leave(self, name: Optional[str] = None):
        self.ctx.scopes.pop()
        if name is not None:
            self.ctx.qual.pop()

    def visit_FunctionDef(self, node):
        for d in node.decorator_list:
            self.calls.decorator(d, node)
        for d in [*node.args.defaults, *node.args.kw_defaults, *node.decorator_list]:
            if d is not None:
                self.visit(d)
        self.ctx.qual.append(node.name)
        self.ctx.qual.append("<locals>")
        try:
            for hints in self.hints.hint_sets(node):  # once per distinct way the function is called
                self.ctx.scopes.append(self.refs.collect(node.body, node.args, node, hints))
                try:
                    for stmt in node.body:
                        self.visit(stmt)
                finally:
                    self.ctx.scopes.pop()
        finally:
            self.ctx.qual.pop()
            self.ctx.qual.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.ctx.scopes.append({a.arg: ("param",) for a in node.args.args})
        self.visit(node.body)
        self.ctx.scopes.pop()

    def visit_ClassDef(self, node):
        for d in node.decorator_list:
            self.calls.decorator(d, node)
            self.visit(d)
        for b in node.bases:
            self.visit(b)
        bases = []
        for b in node.bases:
            r = self.refs.resolve(b)
            if r is not None and r[0] == "vllm":
                bases.append(r[1])
            elif r is not None and r[0] == "class":  # a plugin base: its vLLM bases are followed later
                bases.append(f"plugin:{r[1]}")
        cls_qual = self.ctx.qualname(node.name)
        if any(is_vllm(b) for b in bases):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.ctx.add("subclass_override", stmt, None, f"{cls_qual}.{stmt.name}",
                             cls=cls_qual, cls_node=node, bases=[b for b in bases if is_vllm(b)], method=stmt.name,
                             fn=stmt, calls_super=_calls_super(stmt, node))
                    if self.ctx.release is not None:  # its parameters are what vLLM passes the method it overrides
                        for b in bases:
                            if is_vllm(b):
                                types = self.ctx.release_call("param_types", f"{b}.{stmt.name}") or {}
                                if types:
                                    self.hints.note_override(stmt, types)
                                    break
                elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                      and isinstance(stmt.value, ast.Name)):  # `schedule = schedule_v031`: a def of the file
                    r = self.refs.resolve(stmt.value)
                    fn = r[2] if r is not None and r[0] == "func" and len(r) > 2 else None
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.ctx.add("subclass_override", stmt, None, f"{cls_qual}.{stmt.targets[0].id} = {fn.name}",
                                 cls=cls_qual, cls_node=node, bases=[b for b in bases if is_vllm(b)],
                                 method=stmt.targets[0].id, fn=fn, calls_super=_calls_super(fn, node))
        self.ctx.facts_classes.append((cls_qual, node, bases))
        self._enter(node.body, None, node.name)
        for stmt in node.body:
            self.visit(stmt)
        self._leave(node.name)

    def visit_For(self, node):
        rows: list[dict[str, Optional[tuple]]] = []
        if isinstance(node.target, ast.Name):
            found, complete = self.vsets.iter_values(node.iter)
            rows = [{node.target.id: v} for v in [*found, *([None] if not complete else [])]] if found else []
        elif isinstance(node.target, ast.Tuple) and all(isinstance(x, ast.Name) for x in node.target.elts):
            rows = self.vsets.iter_rows(node.iter, [x.id for x in node.target.elts])
        if rows and len(rows) <= MAX_VALUES:  # the body read once per value (row) the loop walks
            self.visit(node.iter)
            scope = self.ctx.scopes[-1]
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
            self.ctx.loops.append({node.target.id: values})
            self.generic_visit(node)
            self.ctx.loops.pop()
        else:
            self.generic_visit(node)

    def visit_Assign(self, node):
        for t in node.targets:
            self.assigns.assign(t, node.value, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.assigns.assign(node.target, node.value, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.assigns.assign(node.target, node.value, node)
        self.generic_visit(node)

    def visit_Dict(self, node):
        for k, v in zip(node.keys, node.values):
            key = _const_str(k) if k is not None else None
            if key in CONFIG_FIELDS and v is not None:
                self.assigns.config_field(key, v, node if k is None else k)
        self.generic_visit(node)

    def visit_Call(self, node):
        try:
            self.calls.call(node)
        finally:
            self.generic_visit(node)


def _literal_strings(e: ast.AST) -> list[str]:
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        vals = [_const_str(x) for x in e.elts]
        return [v for v in vals if v] if all(vals) else []
    return []


def scan_tree(tree: ast.Module, path: str, module: str, plugin_tops: set[str], is_package: bool = False,
              release: Any = None) -> FileScanner:
    sc = FileScanner(path, module, plugin_tops, is_package, release)
    sc.run(tree)
    return sc


__all__ = ["FileScanner", "scan_tree"]

"""The calls vLLM makes to a place, read from a release's source: what a replacement (or an override) must take is
what those calls pass, not everything the definition would accept (issue 31: "a replacement is judged against the
calls vLLM makes to it, not against its own definition").

Read by name, conservatively: every call in the release whose callee is spelled with the place's name (`f(...)`,
`obj.f(...)`, `Cls.f(...)` — a same-named method of another class counts too, which can only add calls). The facts
are the most positional arguments any such call passes (a bound `self`/`cls` not counted for a method) and every
keyword any passes. They are not read — None, and every call the signature admits is judged — when a call spreads
`*args` or `**kwargs`, when the name is referenced other than as a call (passed as a value, stored, looked up with
`getattr` by its string: it may then be called under another name), or when no call is found at all.
"""

from __future__ import annotations

import ast
from typing import NamedTuple, Optional

from vllm_patchkit.declaration.names import Target


class CallFacts(NamedTuple):
    positional: int  # the most positional arguments a call passes (a bound self/cls not counted)
    keywords: tuple[str, ...]  # every keyword a call passes, sorted
    sites: int  # the calls found


class _Reader(ast.NodeVisitor):
    def __init__(self, name: str) -> None:
        self.name, self.positional, self.keywords, self.sites, self.escapes = name, 0, set(), 0, False
        self._callees: set[int] = set()

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Name) and f.id == self.name) or (isinstance(f, ast.Attribute) and f.attr == self.name):
            self._callees.add(id(f))
            self.sites += 1
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                self.escapes = True
            self.positional = max(self.positional, len(node.args))
            self.keywords |= {k.arg for k in node.keywords if k.arg is not None}
        elif (isinstance(f, ast.Name) and f.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == self.name):
            self.escapes = True  # looked up by its string: called as whatever it is bound to
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == self.name and isinstance(node.ctx, ast.Load) and id(node) not in self._callees:
            self.escapes = True

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == self.name and isinstance(node.ctx, ast.Load) and id(node) not in self._callees:
            self.escapes = True
        self.generic_visit(node)


def call_facts(release, spec: str) -> Optional[CallFacts]:
    """What vLLM's calls to `spec` pass, read from every module of the release that spells its name; None when
    that cannot be read (see the module docstring)."""
    memo = release.__dict__.setdefault("_patchkit_call_facts", {})  # one reading per release and place
    if spec not in memo:
        memo[spec] = _read(release, spec)
    return memo[spec]


def _files(release) -> list[list]:
    """[text, parsed tree or None] of every module of the release, read once per release and shared with the
    by-value copy search (`static_copies.ImportIndex`)."""
    files = release.__dict__.get("_patchkit_texts")
    if files is None:
        from vllm_patchkit.tools.static_copies import ImportIndex

        indexes = release.__dict__.setdefault("_import_indexes", {})
        index = indexes.get("vllm") or indexes.setdefault("vllm", ImportIndex(release, "vllm"))
        files = release.__dict__["_patchkit_texts"] = [[raw, None] for _, raw in index.texts()]
    return files


def _read(release, spec: str) -> Optional[CallFacts]:
    name = Target.parse(spec).attr
    needle = name.encode()
    reader = _Reader(name)
    for f in _files(release):
        if needle not in f[0]:
            continue
        if f[1] is None:
            try:
                f[1] = ast.parse(f[0])
            except SyntaxError:
                return None
        reader.visit(f[1])
        if reader.escapes:
            return None
    if reader.sites == 0:
        return None
    return CallFacts(reader.positional, tuple(sorted(reader.keywords)), reader.sites)

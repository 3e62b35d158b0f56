"""A registry entry (kind register): whether vLLM registers a key in a mapping itself, read from the release's
source or live, and what a difference from the pin means. One reading for `check`, `pin` and the loader, so they
judge an entry in the same words.

The static reading is deliberately narrow: the keys of the dict literal the mapping is assigned (`NAME = {...}`,
`dict(k=...)`), and module-level `NAME[key] = ...` / `NAME.update({...})` / `NAME.setdefault(key, ...)` in its
module. A key found there is present. "Absent" is said only when every way the module fills the mapping was read
(no `**spread`, no computed key, no other mutation of the name at module level); anything else is unread —
never absent — and is judged as such (`entry_unreadable`)."""

from __future__ import annotations

import ast
from typing import Optional, Union

from vllm_patchkit.upstream.findings import Breakage, BreakageKind

#: what a reading gives: True / False, or why it could not be read
Presence = Union[bool, str]


def literal_keys(node: ast.AST) -> tuple[set[str], bool]:
    """(string keys a dict expression spells, whether that is all of them)."""
    if isinstance(node, ast.Dict):
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        return keys, all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        keys = {kw.arg for kw in node.keywords if kw.arg is not None}
        return keys, all(kw.arg is not None for kw in node.keywords)
    return set(), False


def _mutations(tree: ast.Module, name: str) -> tuple[set[str], bool]:
    """Keys module-level statements add to `name` (a subscript assignment, update, setdefault), and whether every
    such statement was read."""
    keys, complete = set(), True
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name:
                    if isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                        keys.add(t.slice.value)
                    else:
                        complete = False
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == name:
                args = stmt.value.args
                if f.attr == "setdefault" and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                    keys.add(args[0].value)
                elif f.attr == "update" and len(args) == 1 and not stmt.value.keywords:
                    more, whole = literal_keys(args[0])
                    keys |= more
                    complete &= whole
                elif f.attr in ("update", "setdefault", "__setitem__", "clear", "pop", "popitem"):
                    complete = False
        elif isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)) and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt)):
            complete = False  # filled (or emptied) in a loop or a branch: not read
    return keys, complete


def static_presence(value: ast.AST, module_tree: Optional[ast.Module], name: Optional[str], key: str) -> Presence:
    """Whether the mapping assigned `value` (and, for a module-level `name`, filled by `module_tree`) has `key`."""
    keys, complete = literal_keys(value)
    if module_tree is not None and name is not None:
        more, whole = _mutations(module_tree, name)
        keys |= more
        complete &= whole
    if key in keys:
        return True
    if complete:
        return False
    what = "not a dict literal" if not isinstance(value, (ast.Dict, ast.Call)) else "a key it spells is computed"
    return f"the mapping is {what}, or the module fills it in a way not read statically"


def breakages(patch_key: str, spec: str, key: str, pinned: Optional[bool], found: Presence, adds: bool,
              release: str) -> list[Breakage]:
    """What a reading of `key` in the mapping at `spec` means for a register patch. `pinned`: the pin's
    `entry_present` (None: the release read first, judged by the declaration: `adds` wants it absent)."""
    want = (not adds) if pinned is None else pinned
    if isinstance(found, str):
        return [Breakage(BreakageKind.entry_unreadable, patch_key, spec, old=found, new=key, detail=release)]
    if found == want:
        return []
    if found:
        return [Breakage(BreakageKind.entry_collision, patch_key, spec, new=key, detail=release)]
    return [Breakage(BreakageKind.entry_gone, patch_key, spec, new=key, detail=release,
                     old="pinned" if pinned is not None else None)]

"""Mutation acceptance of `vllm-patchkit check` (issue 30, item 5): does check flag, before serving, the changes
of vLLM's tree that break the shipped patch set, and stay quiet on the ones that do not?

    python scripts/mutants.py --list                  # the mutants, without running them
    python scripts/mutants.py --jobs 2                # run them all: the table per mutation kind
    python scripts/mutants.py --sample 6 --seed 1     # N mutants spread over the kinds
    python scripts/mutants.py --only tuple-arity:     # the mutants whose name (KIND:PLACE) holds a substring
    python scripts/mutants.py --json

The base tree is a hard-link copy of the installed vLLM 0.31.0 package (the whole folder, compiled extensions
included, so it imports); each mutant is the base with one or a few files rewritten. Mutants are generated from
what the shipped set touches (manifests/vllm-0.31.0.yaml: each entry's targets and reach; patches/*.yaml:
copies, reimplements, uses), each located with `ast` by qualname and edited in place as text (the rest of the
file keeps its bytes). Each mutant has an aim (breaking or harmless); the aim never decides anything:

- the oracle: the project's own tests of every patch whose targets, copies or reach lie in a mutated module
  (`tests_of`), run with the mutant tree first on PYTHONPATH (`import vllm` is the mutant); breaking iff they fail;
- check's verdict: `vllm-patchkit check --source TREE --vllm 0.31.0 --format json` in a child; flagged iff one
  of those patches is broken or stale (exit 1: the tree says 0.31.0 and differs from that manifest's pins).

Goals (README, "Mutation acceptance"): >= 95 % of the breaking mutants flagged, <= 2 % of the harmless ones.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "0.31.0"
MANIFEST = ROOT / "manifests" / f"vllm-{RELEASE}.yaml"
TEST_DIRS = ("tests/patches", "tests/config_stage")  # the patches' own tests against vLLM's real classes
ORACLE_TIMEOUT = int(os.environ.get("PATCHKIT_MUTANT_TIMEOUT", "300"))  # seconds; a loaded machine needs more
CHECK_TIMEOUT = ORACLE_TIMEOUT
MARK = "mutant"  # every name a mutant introduces starts with it


# -- the shipped set, as the mutants read it ------------------------------------------------------------------
@dataclass
class Touch:
    """One patch of the shipped set, as far as the mutants need it: what it touches in vLLM."""

    key: str                    # id@version
    implementation: Optional[str]
    targets: dict[str, dict]    # module:Qualname -> its pin (kind, signature, source_digest)
    reach: dict[str, dict]      # module:Qualname.name -> its pin (kind, defined)
    copies: list[str]
    reimplements: list[str]
    uses: list[str]

    @property
    def id(self) -> str:
        return self.key.split("@")[0]

    def places(self) -> set[str]:
        return set(self.targets) | set(self.reach) | set(self.copies) | set(self.reimplements) | set(self.uses)

    def modules(self) -> set[str]:
        return {p.split(":")[0] for p in self.places()}


def shipped_set(manifest: Path = MANIFEST, patch_dir: Path = ROOT / "patches") -> list[Touch]:
    """The manifest's entries joined with their patch YAMLs (id@version)."""
    declared = {}
    for f in sorted(patch_dir.glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        declared[f"{doc['id']}@{doc['version']}"] = doc
    out = []
    for e in yaml.safe_load(manifest.read_text())["patches"]:
        doc = declared[e["patch"]]
        out.append(Touch(e["patch"], doc.get("implementation"), dict(e.get("targets") or {}), dict(e.get("reach") or {}),
                         list(doc.get("copies") or []), list(doc.get("reimplements") or []), list(doc.get("uses") or [])))
    return out


def tests_of(touch: Touch, root: Path = ROOT) -> list[str]:
    """The test files of a patch: those in TEST_DIRS that name its id (as a word: `image-publish` is not
    `image-publish-admit`) or import its implementation module; not those whose tests run another release's
    sources (they import tests/release_sources.py at module level: the tree on the path is not what they test)."""
    pats = [re.compile(rf"(?<![\w-]){re.escape(touch.id)}(?![\w-])")]
    if touch.implementation:
        mod = touch.implementation.split(":")[0].rsplit(".", 1)[-1]
        pats.append(re.compile(rf"\bpatches\.{re.escape(mod)}\b|\bpatches import [\w, ]*\b{re.escape(mod)}\b"))
    files = []
    for d in TEST_DIRS:
        for f in sorted((root / d).glob("test_*.py")):
            text = f.read_text()
            if any(p.search(text) for p in pats) and not _other_release(text):
                files.append(f.relative_to(root).as_posix())
    return files


def _other_release(text: str) -> bool:
    return any(isinstance(n, ast.ImportFrom) and ("release_sources" in (n.module or "")
                                                  or any(a.name == "release_sources" for a in n.names))
               for n in ast.parse(text).body)


# -- locating by qualname, editing as text ---------------------------------------------------------------------
def module_path(module: str) -> str:
    """`vllm.a.b` -> the file's path relative to the tree (a module or a package's __init__)."""
    return module.replace(".", "/") + ".py"


def split(place: str) -> tuple[str, list[str]]:
    module, qual = place.split(":")
    return module, qual.split(".")


def find(tree: ast.Module, qual: list[str]) -> Optional[ast.AST]:
    """The class or function `a.b.c` of a module (None: not defined there)."""
    body, node = tree.body, None
    for name in qual:
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == name), None)
        if node is None:
            return None
        body = node.body
    return node


class Source:
    """One file's text with byte offsets for ast positions (ast counts columns in UTF-8 bytes)."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.tree = ast.parse(text)

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def seg(self, a: int, b: int) -> str:
        return self.data[a:b].decode()

    def edited(self, edits: list[tuple[int, int, str]]) -> str:
        """The text with each (start, end, new) byte range replaced; ranges must not overlap."""
        data = self.data
        for a, b, new in sorted(edits, key=lambda e: e[0], reverse=True):
            data = data[:a] + new.encode() + data[b:]
        text = data.decode()
        ast.parse(text)  # a mutant is always valid Python
        return text

    def line_start(self, line: int) -> int:
        return self.starts[line - 1]

    def indent_of(self, node) -> str:
        line = self.data[self.starts[node.lineno - 1]:self.starts[node.lineno]].decode()
        return line[:len(line) - len(line.lstrip())]


def name_edit(src: Source, node, new: str) -> tuple[int, int, str]:
    """Rename a def/class: the name after `def `/`class ` on its first line."""
    a = src.at(node.lineno, node.col_offset)
    line_end = src.starts[node.lineno]
    m = re.compile(rb"(?:async\s+)?(?:def|class)\s+(" + re.escape(node.name.encode()) + rb")\b").search(src.data, a, line_end)
    assert m, node.name
    return m.start(1), m.end(1), new


def attr_edit(src: Source, node: ast.Attribute, new: str) -> tuple[int, int, str]:
    """Rename `x.attr`: the attribute's name is the last thing of the node's span."""
    a, b = src.span(node)
    n = len(node.attr.encode())
    assert src.data[b - n:b].decode() == node.attr
    return b - n, b, new


def is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def functions(node) -> Iterator[ast.FunctionDef]:
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n


def own_nodes(fn) -> Iterator[ast.AST]:
    """The nodes of a function's body, not of functions or classes defined inside it."""
    stack = list(fn.body)
    while stack:
        n = stack.pop()
        yield n
        for c in ast.iter_child_nodes(n):
            if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(c)


# -- the mutants -----------------------------------------------------------------------------------------------
@dataclass
class Mutant:
    kind: str
    aim: str                    # "breaking" | "harmless": what the mutant was made for; the oracle decides
    place: str                  # what it changes (module:Qualname[.name])
    description: str
    edits: dict[str, str] = field(repr=False, default_factory=dict)  # tree-relative path -> new text

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.place}"

    def modules(self) -> set[str]:
        return {p[:-len(".py")].replace("/", ".").removesuffix(".__init__") for p in self.edits}


class Tree:
    """The base tree's sources, read once (texts and parses on demand)."""

    def __init__(self, root: Path):
        self.root = root
        self._src: dict[str, Source] = {}
        self._all: Optional[dict[str, str]] = None

    def source(self, rel: str) -> Source:
        if rel not in self._src:
            self._src[rel] = Source((self.root / rel).read_text())
        return self._src[rel]

    def all_texts(self) -> dict[str, str]:
        if self._all is None:
            self._all = {f.relative_to(self.root).as_posix(): f.read_text()
                         for f in sorted((self.root / "vllm").rglob("*.py"))}
        return self._all


def _locate(tree: Tree, place: str):
    """(file, its source, the def or class node: None where the module defines no such def, e.g. a name it
    imports: a copy held by value)."""
    module, qual = split(place)
    rel = module_path(module)
    if not (tree.root / rel).exists():
        rel = module.replace(".", "/") + "/__init__.py"
    src = tree.source(rel)
    return rel, src, find(src.tree, qual)


def _defs(tree: Tree, places: list[str]) -> Iterator[tuple[str, str, Source, ast.AST]]:
    """(place, file, source, node) of each place the tree defines as a def or class (copies by value skipped)."""
    for place in places:
        rel, src, node = _locate(tree, place)
        if node is not None:
            yield place, rel, src, node


# Each generator yields the mutants of one kind from the set's places, deterministically (sorted places).
def _attribute_places(touches: list[Touch]) -> list[tuple[str, str]]:
    """(place, how it is defined) of every attribute the set reads: the reach's attributes, and the fields of
    a class it pins (kind class / uses) that its implementation reads as `.field`."""
    out = {}
    for t in touches:
        for k, pin in t.reach.items():
            if pin.get("kind") == "attribute":
                out[k] = pin.get("defined", "")
    return sorted(out.items())


def _class_field_places(tree: Tree, touches: list[Touch]) -> list[tuple[str, str]]:
    out = {}
    for t in touches:
        impl = t.implementation and (ROOT / "patches" / (t.implementation.split(":")[0].rsplit(".", 1)[-1] + ".py"))
        read = set(re.findall(r"\.(\w+)\b", impl.read_text())) if impl and impl.exists() else set()
        for k, pin in t.targets.items():
            if pin.get("kind") != "class":
                continue
            rel, src, node = _locate(tree, k)
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in read:
                    out[f"{k}.{stmt.target.id}"] = "field"
    return sorted(out.items())


def _definition_edits(src: Source, cls: ast.ClassDef, name: str, defined: str, new: str) -> list:
    """Rename the definition of `name` in the class only: `self.name = ...` stores, a class-level assignment,
    a property's def (and its setter's decorator)."""
    edits = []
    for stmt in cls.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and t.id == name:
                a, b = src.span(t)
                edits.append((a, b, new))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            edits.append(name_edit(src, stmt, new))
            for d in stmt.decorator_list:
                if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == name:
                    a, b = src.span(d.value)
                    edits.append((a, b, new))
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and n.attr == name and is_self(n.value) and isinstance(n.ctx, ast.Store):
            edits.append(attr_edit(src, n, new))
    return edits


def _readers(tree: Tree, cls_name: str, name: str, new: str, skip: set[str]) -> dict[str, str]:
    """`obj.name` renamed wherever vLLM reads it, approximated by name: in every file that mentions the class,
    each attribute access `x.name` (x not `self`), and `name=` keywords of calls to the class."""
    out = {}
    word = re.compile(rf"\b{re.escape(cls_name)}\b")
    for rel, text in tree.all_texts().items():
        if rel in skip or f".{name}" not in text and f"{name}=" not in text or not word.search(text):
            continue
        src = tree.source(rel)
        edits = [attr_edit(src, n, new) for n in ast.walk(src.tree)
                 if isinstance(n, ast.Attribute) and n.attr == name and not is_self(n.value)]
        for n in ast.walk(src.tree):
            if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == cls_name:
                for kw in n.keywords:
                    if kw.arg == name:
                        a = src.at(kw.lineno, kw.col_offset)
                        edits.append((a, a + len(name), new))
        if edits:
            out[rel] = src.edited(edits)
    return out


def gen_remove_attribute(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, defined in _attribute_places(touches) + _class_field_places(tree, touches):
        cls_place, name = place.rsplit(".", 1)
        rel, src, cls = _locate(tree, cls_place)
        cls = _defining_class(src, cls, name)
        edits = _definition_edits(src, cls, name, defined, f"{name}_{MARK}_removed") if cls else []
        if edits:
            yield Mutant("remove-attribute", "breaking", place,
                         f"{place}: its definition in the class renamed ({defined}), readers untouched",
                         {rel: src.edited(edits)})


def gen_rename_attribute(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, defined in _attribute_places(touches):
        cls_place, name = place.rsplit(".", 1)
        rel, src, cls = _locate(tree, cls_place)
        new = f"{name}_{MARK}_renamed"
        home = _defining_class(src, cls, name)
        if home is None:
            continue
        edits = _definition_edits(src, home, name, defined, new)
        for c in _subclasses(src, home):
            edits += [attr_edit(src, n, new) for n in ast.walk(c) if isinstance(n, ast.Attribute) and n.attr == name
                      and is_self(n.value) and isinstance(n.ctx, ast.Load)]
        files = _readers(tree, cls.name, name, new, skip={rel})
        own = {rel: src.edited(_dedup(edits + _outside_class(src, home, name, new)))}
        yield Mutant("rename-attribute", "breaking", place,
                     f"{place} renamed to {new}: its definition and vLLM's readers ({len(files) + 1} files)",
                     {**own, **files})


def _classes(src: Source) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in src.tree.body if isinstance(n, ast.ClassDef)}


def _bases(src: Source, cls: ast.ClassDef) -> Iterator[ast.ClassDef]:
    """The class and its bases defined in the same module, nearest first."""
    known, seen, todo = _classes(src), set(), [cls]
    while todo:
        c = todo.pop(0)
        if c.name in seen:
            continue
        seen.add(c.name)
        yield c
        todo += [known[b.id] for b in c.bases if isinstance(b, ast.Name) and b.id in known]


def _defining_class(src: Source, cls: ast.ClassDef, name: str) -> Optional[ast.ClassDef]:
    """Where `name` is defined for `cls`: the class itself or a base of the same module (inherited)."""
    for c in _bases(src, cls):
        if _definition_edits(src, c, name, "", "x"):
            return c
    return None


def _subclasses(src: Source, home: ast.ClassDef) -> list[ast.ClassDef]:
    """The class and every class of its module that derives from it."""
    return [c for c in _classes(src).values() if any(b is home for b in _bases(src, c))]


def _outside_class(src: Source, cls, name: str, new: str) -> list:
    """In the class's own module, the readers outside the class (`x.name`, x not self)."""
    inside = set(map(id, ast.walk(cls)))
    return [attr_edit(src, n, new) for n in ast.walk(src.tree)
            if id(n) not in inside and isinstance(n, ast.Attribute) and n.attr == name and not is_self(n.value)]


def _dedup(edits):
    return sorted(set(edits))


def _method_places(touches: list[Touch]) -> list[str]:
    """Methods the set calls (reach methods) and the methods it patches (targets of kind method)."""
    out = set()
    for t in touches:
        out |= {k for k, p in t.reach.items() if p.get("kind") == "method"}
        out |= {k for k, p in t.targets.items() if p.get("kind") == "method"}
    return sorted(out)


def gen_remove_method(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place in sorted({k for t in touches for k, p in t.reach.items() if p.get("kind") == "method"}):
        rel, src, fn = _locate(tree, place)
        yield Mutant("remove-method", "breaking", place, f"{place}: the def renamed, its callers untouched",
                     {rel: src.edited([name_edit(src, fn, f"{fn.name}_{MARK}_removed")])})


def gen_rename_method(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, rel, src, fn in _defs(tree, _method_places(touches)):
        cls_name = place.split(":")[1].split(".")[-2]
        new = f"{fn.name}_{MARK}_renamed"
        edits = [name_edit(src, fn, new)] + [attr_edit(src, n, new) for n in ast.walk(src.tree)
                                             if isinstance(n, ast.Attribute) and n.attr == fn.name]
        files = {rel: src.edited(_dedup(edits))}
        for r, text in _method_callers(tree, cls_name, fn.name, new, skip={rel}).items():
            files[r] = text
        yield Mutant("rename-method", "breaking", place,
                     f"{place} renamed to {new}, with vLLM's callers ({len(files)} files)", files)


def _method_callers(tree: Tree, cls_name: str, name: str, new: str, skip: set[str]) -> dict[str, str]:
    out = {}
    word = re.compile(rf"\b{re.escape(cls_name)}\b")
    for rel, text in tree.all_texts().items():
        if rel in skip or f".{name}" not in text or not word.search(text):
            continue
        src = tree.source(rel)
        edits = [attr_edit(src, n, new) for n in ast.walk(src.tree) if isinstance(n, ast.Attribute) and n.attr == name]
        if edits:
            out[rel] = src.edited(edits)
    return out


def _callables(touches: list[Touch]) -> list[str]:
    """Every function or method target of the set (targets include the `uses` the manifest pins)."""
    return sorted({k for t in touches for k, p in t.targets.items() if p.get("kind") in ("function", "method")})


def _positional(fn) -> list[ast.arg]:
    return fn.args.posonlyargs + fn.args.args


def _defaults(fn) -> dict[int, ast.AST]:
    pos = _positional(fn)
    return {len(pos) - len(fn.args.defaults) + i: d for i, d in enumerate(fn.args.defaults)}


def _trailing(src: Source, fn, param: str) -> tuple[int, int, str]:
    """The edit adding `param` as the last parameter: keyword-only when the function has `*args`, keyword-only
    parameters or `**kwargs` (or `param` has no default and would follow one), else the last positional one."""
    args = fn.args
    if args.kwonlyargs:
        d = args.kw_defaults[-1]
        at = src.span(d if d is not None else args.kwonlyargs[-1])[1]
        return at, at, f", {param}"
    if args.vararg:
        at = src.span(args.vararg)[1]
        return at, at, f", {param}"
    if args.kwarg:
        at = src.span(args.kwarg)[0] - 2  # before the `**`
        return at, at, f"*, {param}, "
    pos, defaults = _positional(fn), _defaults(fn)
    at = src.span(defaults.get(len(pos) - 1, pos[-1]))[1]
    return at, at, f", {param}" if "=" in param or not defaults else f", *, {param}"


def _calls(tree: Tree, place: str) -> dict[str, tuple[Source, list[ast.Call], int]]:
    """vLLM's calls of a target, by name, in the files that mention its class (a method) or its name (a function):
    file -> (source, calls, how many leading parameters the call does not pass: 1 for `obj.method(...)`)."""
    module, qual = split(place)
    name, owner_name = qual[-1], qual[-2] if len(qual) > 1 else qual[-1]
    word = re.compile(rf"\b{re.escape(owner_name)}\b")
    out = {}
    for rel, text in tree.all_texts().items():
        if f"{name}(" not in text or not word.search(text):
            continue
        src = tree.source(rel)
        calls = [n for n in ast.walk(src.tree) if isinstance(n, ast.Call) and
                 (isinstance(n.func, ast.Attribute) and n.func.attr == name or
                  len(qual) == 1 and isinstance(n.func, ast.Name) and n.func.id == name)]
        if calls:
            out[rel] = (src, calls, 1 if len(qual) > 1 else 0)
    return out


def _with_callers(tree: Tree, rel: str, src: Source, own: list, place: str, edit_call) -> dict[str, str]:
    """The target's file with its own edits, and every file calling it with `edit_call(src, call, skipped)`'s."""
    edits = {rel: (src, list(own))}
    for r, (s, calls, skipped) in _calls(tree, place).items():
        edits.setdefault(r, (s, []))[1].extend(e for c in calls for e in edit_call(s, c, skipped))
    return {r: s.edited(e) for r, (s, e) in edits.items() if e}


def _pass_keyword(src: Source, call: ast.Call, skipped: int) -> list:
    a, b = src.span(call)
    parts = [*call.args, *call.keywords]
    if parts:
        at = max(src.span(p)[1] for p in parts)
        return [(at, at, f", {MARK}_required=None")]
    return [(b - 1, b - 1, f"{MARK}_required=None")]


def gen_add_required_param(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """A required (keyword-only) parameter, and vLLM's callers passing it, as a release that adds one does."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        files = _with_callers(tree, rel, src, [_trailing(src, fn, f"{MARK}_required")], place, _pass_keyword)
        yield Mutant("add-required-param", "breaking", place,
                     f"{place}: a required parameter {MARK}_required, vLLM's callers pass it ({len(files)} files)",
                     files)


def gen_reorder_params(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """Two adjacent parameters swapped, and vLLM's positional callers swapping their arguments with them."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        pos, defaults = _positional(fn), _defaults(fn)
        start = 1 if pos and pos[0].arg in ("self", "cls") else 0
        for i in range(start, len(pos) - 1):
            if (i in defaults) == (i + 1 in defaults):
                a0, a1 = src.span(pos[i])[0], src.span(defaults[i] if i in defaults else pos[i])[1]
                b0, b1 = src.span(pos[i + 1])[0], src.span(defaults[i + 1] if i + 1 in defaults else pos[i + 1])[1]

                def swap(s: Source, call: ast.Call, skipped: int, i=i) -> list:
                    j = i - skipped
                    args = call.args
                    if j < 0 or len(args) <= j + 1 or any(isinstance(x, ast.Starred) for x in args[:j + 2]):
                        return []
                    x, y = s.span(args[j]), s.span(args[j + 1])
                    return [(*x, s.seg(*y)), (*y, s.seg(*x))]

                own = [(a0, a1, src.seg(b0, b1)), (b0, b1, src.seg(a0, a1))]
                files = _with_callers(tree, rel, src, own, place, swap)
                yield Mutant("reorder-params", "breaking", place,
                             f"{place}: parameters {pos[i].arg} and {pos[i + 1].arg} swapped, vLLM's positional "
                             f"callers with them ({len(files)} files)", files)
                break


def _changed_default(node) -> Optional[str]:
    if not isinstance(node, ast.Constant):
        return None
    v = node.value
    if isinstance(v, bool):
        return repr(not v)
    if isinstance(v, int):
        return repr(v + 1)
    if v is None:
        return "0"
    return None


def gen_change_default(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """One mutant per target: its first parameter whose default is a literal (bool flipped, int + 1, None -> 0)."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        pos = _positional(fn)
        cands = [(pos[i].arg, d) for i, d in sorted(_defaults(fn).items())]
        cands += [(a.arg, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None]
        for arg, d in cands:
            new = _changed_default(d)
            if new is not None:
                a, b = src.span(d)
                yield Mutant("change-default", "breaking", place,
                             f"{place}: default of {arg} {src.seg(a, b)} -> {new}", {rel: src.edited([(a, b, new)])})
                break


def gen_tuple_arity(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        rets = [n for n in own_nodes(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
                and len(n.value.elts) >= 2]
        if rets:
            edits = [(src.span(r.value.elts[-1])[1], src.span(r.value.elts[-1])[1], ", None") for r in rets]
            yield Mutant("tuple-arity", "breaking", place,
                         f"{place}: every returned tuple gains an element ({len(rets)} returns)",
                         {rel: src.edited(edits)})


def _module_functions(touches: list[Touch]) -> list[str]:
    return sorted({k for t in touches for k, p in t.targets.items() if p.get("kind") == "function"
                   and len(k.split(":")[1].split(".")) == 1})


def _moved(tree: Tree, place: str, reexport: bool) -> Optional[dict[str, str]]:
    """The function moved to `<module>_moved.py` (with the module's names it uses imported from its old home).
    Re-exported: the old module imports it back by name at its end. Not re-exported: the old module reaches it
    as `_moved.<name>`, and every `from <module> import <name>` in vLLM is rewritten to the new module."""
    module, (name,) = split(place)
    rel, src, fn = _locate(tree, place)
    new_mod = f"{module}_{MARK}_moved"
    new_rel = module_path(new_mod)
    top = _top_names(src.tree) - {name}
    used = sorted({n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} & top)
    a = src.line_start(fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno)
    b = src.starts[fn.end_lineno]
    body = src.seg(a, b)
    header = "from __future__ import annotations\n\n"  # annotations stay text, as names imported for typing only
    imports = f"from {module} import (  # noqa\n" + "".join(f"    {u},\n" for u in used) + ")\n\n" if used else ""
    files = {new_rel: header + imports + "\n" + body}
    edits = [(a, b, "")]
    if reexport:
        tail = f"\nfrom {new_mod} import {name}  # noqa: E402  (moved; re-exported)\n"
    else:
        tail = f"\nimport {new_mod} as _{MARK}_moved  # noqa: E402\n"
        fn_nodes = set(map(id, ast.walk(fn)))
        edits += [(*src.span(n), f"_{MARK}_moved.{name}") for n in ast.walk(src.tree)
                  if isinstance(n, ast.Name) and n.id == name and id(n) not in fn_nodes]
    edits.append((len(src.data), len(src.data), tail))
    files[rel] = src.edited(edits)
    if not reexport:
        pat = re.compile(rf"\bfrom {re.escape(module)} import\b")
        for r, text in tree.all_texts().items():
            if r == rel or not pat.search(text):
                continue
            s = tree.source(r)
            ed = _import_edits(s, module, name, new_mod)
            if ed:
                files[r] = s.edited(ed)
    return files


def _top_names(tree: ast.Module) -> set[str]:
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names if a.name != "*"}
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test):
            continue  # names for typing only: not importable from the module at run time
        elif isinstance(n, (ast.If, ast.Try)):
            out |= _top_names(ast.Module([*n.body, *getattr(n, "orelse", []), *getattr(n, "finalbody", []),
                                          *[s for h in getattr(n, "handlers", []) for s in h.body]], []))
    return out


def _import_edits(src: Source, module: str, name: str, new_mod: str) -> list:
    """`from module import a, name, b` -> the same without name, plus `from new_mod import name` after it."""
    edits = []
    for n in ast.walk(src.tree):
        if isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names):
            keep = [a for a in n.names if a.name != name]
            moved = [a for a in n.names if a.name == name]
            indent = src.indent_of(n)
            alias = lambda a: a.name + (f" as {a.asname}" if a.asname else "")  # noqa: E731
            lines = []
            if keep:
                lines.append(f"from {module} import ({', '.join(map(alias, keep))})")
            lines.append(f"from {new_mod} import {', '.join(map(alias, moved))}")
            edits.append((*src.span(n), f"\n{indent}".join(lines)))
    return edits


def gen_move_function(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, *_ in _defs(tree, _module_functions(touches)):
        files = _moved(tree, place, reexport=False)
        yield Mutant("move-function", "breaking", place,
                     f"{place} moved to {place.split(':')[0]}_{MARK}_moved, vLLM's importers updated, no re-export "
                     f"({len(files)} files)", files)


def gen_moved_reexported(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, *_ in _defs(tree, _module_functions(touches)):
        files = _moved(tree, place, reexport=True)
        yield Mutant("moved-reexported", "harmless", place,
                     f"{place} moved to {place.split(':')[0]}_{MARK}_moved and imported back by name", files)


_FLIP = {ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<", ast.Eq: "!=", ast.NotEq: "==",
         ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}


def _flip_edits(src: Source, cmp: ast.Compare) -> Optional[tuple[int, int, str]]:
    """The first operator of a comparison, flipped (text between the left operand and the next one)."""
    op = cmp.ops[0]
    if type(op) not in _FLIP:
        return None
    a, b = src.span(cmp.left)[1], src.span(cmp.comparators[0])[0]
    between = src.seg(a, b)
    lead = between[:len(between) - len(between.lstrip())]
    trail = between[len(between.rstrip()):]
    return a, b, f"{lead}{_FLIP[type(op)]}{trail}"


def gen_edit_copied_body(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """Each comparison of a body the set copies (a pinned source digest, or `reimplements`), flipped."""
    places = sorted({k for t in touches for k, p in t.targets.items() if p.get("source_digest")}
                    | {k for t in touches for k in t.reimplements})
    for place in places:
        rel, src, fn = _locate(tree, place)
        cmps = sorted((n for n in own_nodes(fn) if isinstance(n, ast.Compare)), key=lambda n: (n.lineno, n.col_offset))
        for i, c in enumerate(cmps):
            e = _flip_edits(src, c)
            if e:
                yield Mutant("edit-copied-body", "breaking", f"{place}#{i}",
                             f"{place}: comparison at line {c.lineno} `{src.seg(*src.span(c))}` flipped",
                             {rel: src.edited([e])})


def gen_optional_param(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        new = f"{MARK}_optional=None"
        yield Mutant("optional-param", "harmless", place, f"{place}: a trailing optional parameter {new}",
                     {rel: src.edited([_trailing(src, fn, new)])})


def gen_reformat(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """A comment line and a blank line in the body of every function the set touches (targets, uses)."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        first = fn.body[1] if _docstring(fn) and len(fn.body) > 1 else fn.body[0]
        at = src.line_start(first.lineno)
        ind = src.indent_of(first)
        yield Mutant("reformat", "harmless", place, f"{place}: a comment and a blank line in its body",
                     {rel: src.edited([(at, at, f"{ind}# {MARK}: a comment that changes nothing\n\n")])})


def _docstring(fn) -> bool:
    return isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant) \
        and isinstance(fn.body[0].value.value, str)


def gen_new_method(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    classes = sorted({k.rsplit(".", 1)[0] for k in _callables(touches) if len(k.split(":")[1].split(".")) == 2}
                     | {k for t in touches for k, p in t.targets.items() if p.get("kind") == "class"})
    for place in classes:
        rel, src, cls = _locate(tree, place)
        last = cls.body[-1]
        at = src.starts[last.end_lineno]
        ind = src.indent_of(cls.body[0])
        text = f"\n{ind}def {MARK}_new_method(self):\n{ind}    return None\n"
        yield Mutant("new-method", "harmless", place, f"{place}: a new method {MARK}_new_method",
                     {rel: src.edited([(at, at, text)])})


def gen_unrelated_change(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """In every module the set touches: a message string in a function no patch names or calls, changed."""
    named = {p for t in touches for p in t.places()}
    for module in sorted({p.split(":")[0] for t in touches for p in t.places()}):
        rel, src, _ = _locate(tree, f"{module}:x")
        touched_names = {p.split(":")[1].split(".")[-1] for p in named if p.startswith(module + ":")}
        for fn in sorted(functions(src.tree), key=lambda f: f.lineno, reverse=True):
            if fn.name in touched_names or fn.name.startswith("__"):
                continue
            s = _message(fn)
            if s is not None:
                a, b = src.span(s)
                yield Mutant("unrelated-change", "harmless", f"{module}:{fn.name}",
                             f"{module}: a message in {fn.name} (line {s.lineno}), which no patch names, changed",
                             {rel: src.edited([(b - 1, b - 1, f" [{MARK}]")])})
                break



def gen_docstring_edit(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """The docstring of every function the set touches (targets, uses, copied bodies), reworded: what an upstream
    documentation commit does. A body pinned by its digest is read without its docstring."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        if not _docstring(fn):
            continue
        a, b = src.span(fn.body[0].value)
        quote = 3 if src.seg(b - 3, b) in ('"""', "\'\'\'") else 1
        yield Mutant("docstring-edit", "harmless", place, f"{place}: its docstring reworded",
                     {rel: src.edited([(b - quote, b - quote, f" [{MARK}]")])})


def gen_annotation_change(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """An annotated parameter of every function the set touches written as a string (`x: T` -> `x: "T"`): what
    an upstream typing commit does; the signature binds as before."""
    for place, rel, src, fn in _defs(tree, _callables(touches)):
        ann = next((a.annotation for a in _positional(fn) + fn.args.kwonlyargs
                    if a.annotation is not None and not isinstance(a.annotation, ast.Constant)
                    and a.annotation.lineno == a.annotation.end_lineno), None)
        if ann is None:
            continue
        a, b = src.span(ann)
        text = src.seg(a, b)
        if '"' in text:
            continue
        yield Mutant("annotation-change", "harmless", place, f"{place}: the annotation `{text}` written as a string",
                     {rel: src.edited([(a, b, f'"{text}"')])})


def gen_new_function(tree: Tree, touches: list[Touch]) -> Iterator[Mutant]:
    """A new module-level function at the end of every module the set touches."""
    for module in sorted({p.split(":")[0] for t in touches for p in t.places()}):
        rel, src, _ = _locate(tree, f"{module}:x")
        if src is None:
            continue
        end = len(src.data)
        sep = "" if src.text.endswith("\n") else "\n"
        yield Mutant("new-function", "harmless", f"{module}:{MARK}_new_function",
                     f"{module}: a new function {MARK}_new_function",
                     {rel: src.edited([(end, end, f"{sep}\n\ndef {MARK}_new_function():\n    return None\n")])})

def _message(fn) -> Optional[ast.Constant]:
    """A plain string argument of a raise or a logger call in the function's own body."""
    for n in own_nodes(fn):
        calls = []
        if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call):
            calls.append(n.exc)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and getattr(n.value.func.value, "id", "") in ("logger", "log") and n.value.func.attr in ("info", "warning", "debug", "error"):
            calls.append(n.value)
        for c in calls:
            for a in c.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value and \
                        a.end_lineno == a.lineno:
                    return a
    return None


GENERATORS: list[Callable[[Tree, list[Touch]], Iterator[Mutant]]] = [
    gen_remove_attribute, gen_rename_attribute, gen_remove_method, gen_rename_method, gen_add_required_param,
    gen_reorder_params, gen_change_default, gen_tuple_arity, gen_move_function, gen_edit_copied_body,
    gen_optional_param, gen_reformat, gen_new_method, gen_unrelated_change, gen_moved_reexported,
    gen_docstring_edit, gen_annotation_change, gen_new_function,
]


#: kinds of which every place is its own case (one body, one move, one pinned signature that must stay
#: compatible): elsewhere one mutant per kind and owner
EACH_PLACE = {"edit-copied-body", "move-function", "moved-reexported", "optional-param"}


def owner(m: Mutant) -> str:
    """What a mutant's kind of change is judged on: the class of a method or attribute, the module of a
    function. The same change on a second name of the same class asks check the same question."""
    if m.kind in EACH_PLACE:
        return m.place
    module, qual = m.place.split("#")[0].split(":")
    parts = qual.split(".")
    return f"{module}:{parts[0]}" if len(parts) > 1 or m.kind == "new-method" else module


def kind_of(g: Callable) -> str:
    return g.__name__.removeprefix("gen_").replace("_", "-")


def generate(tree_root: Path, touches: Optional[list[Touch]] = None, kinds: Optional[set[str]] = None) -> list[Mutant]:
    """The mutants (of the given kinds; default all), in a deterministic order (kind, then place): the first of
    each kind per owner."""
    touches = touches or shipped_set()
    tree = Tree(tree_root)
    seen, out = set(), []
    for g in GENERATORS:
        if kinds is not None and kind_of(g) not in kinds:
            continue
        for m in g(tree, touches):
            if (m.kind, owner(m)) not in seen:
                seen.add((m.kind, owner(m)))
                out.append(m)
    return out


def only(mutants: list[Mutant], substrings: Optional[list[str]]) -> list[Mutant]:
    """The mutants whose name (`kind:place`) holds one of the substrings (all of them when none is given)."""
    if not substrings:
        return mutants
    return [m for m in mutants if any(s in m.name for s in substrings)]


def sample(mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """N mutants spread over the kinds: one per kind in turn (kinds in a seeded order), each kind's drawn at
    random."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_kind.setdefault(m.kind, []).append(m)
    for v in by_kind.values():
        rng.shuffle(v)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    out = []
    while len(out) < n and any(by_kind.values()):
        for k in kinds:
            if by_kind[k] and len(out) < n:
                out.append(by_kind[k].pop())
    return out


# -- trees -----------------------------------------------------------------------------------------------------
def installed_vllm() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return Path(spec.origin).parent


def base_tree(dest: Path) -> Path:
    """A hard-link copy of the installed vLLM package (compiled extensions and bytecode included) in dest/vllm."""
    shutil.copytree(installed_vllm(), dest / "vllm", copy_function=os.link)
    return dest


def mutant_tree(base: Path, dest: Path, m: Mutant) -> Path:
    """The base hard-linked into dest, the mutant's files written anew (unlinked first: the base is untouched)."""
    shutil.copytree(base, dest, copy_function=os.link)
    for rel, text in m.edits.items():
        p = dest / rel
        if p.exists():
            p.unlink()
        p.write_text(text)
    return dest


# -- the two verdicts ------------------------------------------------------------------------------------------
def affected(m: Mutant, touches: list[Touch]) -> list[Touch]:
    """The patches whose targets, copies or reach lie in a module the mutant rewrote."""
    mods = m.modules()
    return [t for t in touches if t.modules() & mods]


def child_env(tree: Optional[Path]) -> dict:
    env = dict(os.environ)
    env["VLLM_PATCHKIT_CACHE_DIR"] = "off"  # nothing of one tree's reading may serve another's
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


@dataclass
class Oracle:
    breaking: Optional[bool]    # None: could not tell (timeout)
    tests: list[str]
    summary: str
    seconds: float


def oracle(tree: Path, tests: list[str], timeout: int = ORACLE_TIMEOUT) -> Oracle:
    """The patches' own tests on the tree (first on the path): breaking iff they fail."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                           cwd=ROOT, env=child_env(tree), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Oracle(None, tests, f"timed out after {timeout} s", time.monotonic() - t0)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    failed = next((ln for ln in lines if ln.startswith(("FAILED", "ERROR"))), "")
    summary = (failed + " | " if failed else "") + (lines[-1] if lines else p.stderr.strip()[-300:])
    return Oracle(p.returncode != 0, tests, summary[:400], time.monotonic() - t0)


@dataclass
class Verdict:
    flagged: bool
    exit_code: int
    lines: list[str]            # why the affected patches are flagged, as check prints it
    other: list[str]            # what else check said (findings on other patches, compatible changes)
    seconds: float
    statuses: dict = field(default_factory=dict)  # affected patch -> check's status


def check_verdict(tree: Path, patch_keys: set[str], timeout: int = CHECK_TIMEOUT) -> Verdict:
    """`vllm-patchkit check --source TREE --vllm 0.31.0 --format json` in a child: flagged iff one of the affected
    patches is broken (a breaking finding) or stale (pins of the release's own manifest that differ from it:
    check exits 1 and the loader refuses such a pin at start-up)."""
    t0 = time.monotonic()
    code = "import sys; from vllm_patchkit.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, "check", "--source", str(tree), "--vllm", RELEASE, "--format", "json"],
                       cwd=ROOT, env=child_env(None), capture_output=True, text=True, timeout=timeout)
    if p.returncode == 2 or not p.stdout.strip():
        return Verdict(True, p.returncode, [f"check could not run: {p.stderr.strip()[-300:]}"], [],
                       time.monotonic() - t0)
    doc = json.loads(p.stdout)
    statuses = {r["patch"]: r["status"] for r in doc["patches"] if r["patch"] in patch_keys}
    stale = {k for k, st in statuses.items() if st == "stale"}
    mine, other = [], []
    for b in doc["breakages"]:
        line = f"[{b['kind']}] {b['explain']}"
        patches = set(b.get("patches") or [b.get("patch")])
        if b["breaking"] and patches & patch_keys:
            mine.append(line)
        elif patches & stale:
            mine.append(f"(stale: {', '.join(sorted(patches & stale))}) {line}")
        else:
            other.append(line if b["breaking"] else f"(compatible) {line}")
    other += [f"{r['patch']}: {r['status']}" for r in doc["patches"] if r["status"] not in ("ok", "not_applicable")
              and r["patch"] not in patch_keys]
    flagged = any(st in ("broken", "stale") for st in statuses.values())
    return Verdict(flagged, p.returncode, mine, other, time.monotonic() - t0, statuses)


@dataclass
class Outcome:
    mutant: dict
    patches: list[str]
    oracle: dict
    check: dict

    @property
    def breaking(self) -> Optional[bool]:
        return self.oracle["breaking"]

    @property
    def flagged(self) -> bool:
        return self.check["flagged"]


def run_one(base: Path, work: Path, m: Mutant, touches: list[Touch], i: int) -> Outcome:
    dest = work / f"m{i:03d}"
    try:
        tree = mutant_tree(base, dest, m)
        aff = affected(m, touches)
        tests = sorted({f for t in aff for f in tests_of(t)})
        v = check_verdict(tree, {t.key for t in aff})
        o = oracle(tree, tests) if tests else Oracle(None, [], "no test of an affected patch", 0.0)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    md = {k: v for k, v in asdict(m).items() if k != "edits"} | {"files": sorted(m.edits)}
    return Outcome(md, [t.key for t in aff], asdict(o), asdict(v))


def verify_base(base: Path, touches: list[Touch]) -> None:
    """The unmutated tree must pass every test the oracle may run, and check must say nothing breaks."""
    tests = sorted({f for t in touches for f in tests_of(t)})
    o = oracle(base, tests, timeout=ORACLE_TIMEOUT * 4)
    if o.breaking is not False:
        sys.exit(f"mutants: the unmutated tree does not pass the oracle's tests ({o.summary}); nothing measured")
    v = check_verdict(base, {t.key for t in touches})
    if v.flagged or v.exit_code != 0:
        sys.exit(f"mutants: check flags the unmutated tree ({v.lines or v.other}); nothing measured")


# -- the table -------------------------------------------------------------------------------------------------
def table(outcomes: list[Outcome]) -> dict:
    kinds: dict[str, dict] = {}
    for o in outcomes:
        k = kinds.setdefault(o.mutant["kind"], {"aim": o.mutant["aim"], "breaking": 0, "breaking_flagged": 0,
                                                "harmless": 0, "harmless_flagged": 0, "unjudged": 0,
                                                "disagree": 0})
        if o.breaking is None:
            k["unjudged"] += 1
            continue
        side = "breaking" if o.breaking else "harmless"
        k[side] += 1
        k[f"{side}_flagged"] += o.flagged
        k["disagree"] += (o.mutant["aim"] == "breaking") != o.breaking
    tot = {f: sum(k[f] for k in kinds.values()) for f in ("breaking", "breaking_flagged", "harmless",
                                                          "harmless_flagged", "unjudged", "disagree")}
    return {"kinds": kinds, "totals": tot,
            "breaking_flagged_ratio": tot["breaking_flagged"] / tot["breaking"] if tot["breaking"] else None,
            "harmless_flagged_ratio": tot["harmless_flagged"] / tot["harmless"] if tot["harmless"] else None}


def render(outcomes: list[Outcome]) -> str:
    t = table(outcomes)
    out = [f"Mutants of vLLM {RELEASE}'s tree: check's verdict against the patches' own tests (the oracle)", "",
           "| kind | aim | breaking flagged / all | harmless flagged / all | aim != oracle | unjudged |",
           "|---|---|---|---|---|---|"]
    for kind, k in t["kinds"].items():
        out.append(f"| {kind} | {k['aim']} | {k['breaking_flagged']} / {k['breaking']} | "
                   f"{k['harmless_flagged']} / {k['harmless']} | {k['disagree']} | {k['unjudged']} |")
    tot = t["totals"]
    out.append(f"| **total** | | **{tot['breaking_flagged']} / {tot['breaking']}** | "
               f"**{tot['harmless_flagged']} / {tot['harmless']}** | {tot['disagree']} | {tot['unjudged']} |")
    br, hr = t["breaking_flagged_ratio"], t["harmless_flagged_ratio"]
    out += ["", f"breaking flagged: {_pct(br)} (goal >= 95 %: {_met(br is not None and br >= 0.95)}); "
                f"harmless flagged: {_pct(hr)} (goal <= 2 %: {_met(hr is not None and hr <= 0.02)})"]
    misses = [o for o in outcomes if o.breaking and not o.flagged]
    alarms = [o for o in outcomes if o.breaking is False and o.flagged]
    unjudged = [o for o in outcomes if o.breaking is None]
    for title, group in (("misses (breaking, not flagged)", misses), ("false alarms (harmless, flagged)", alarms),
                         ("unjudged", unjudged)):
        if group:
            out += ["", f"{title}:"]
            for o in group:
                out.append(f"  - {o.mutant['kind']} {o.mutant['place']}: {o.mutant['description']}")
                out.append(f"      oracle: {o.oracle['summary']}")
                said = o.check["lines"] or o.check["other"] or [f"exit {o.check['exit_code']}, no finding"]
                out.append(f"      check: {said[0]}")
    return "\n".join(out) + "\n"


def _pct(r):
    return "n/a" if r is None else f"{r:.1%}"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# -- the command -----------------------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants without running them")
    ap.add_argument("--sample", type=int, metavar="N", help="only N mutants, spread over the kinds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", metavar="SUBSTRING",
                    help="only the mutants whose name (KIND:PLACE, as --list and the progress lines show it) holds "
                         "SUBSTRING; repeatable (any of them)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1: the machine is shared)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", type=Path, help="also write every outcome (JSON) here")
    ap.add_argument("--from-results", type=Path, help="print the table of an earlier run's --results file")
    ap.add_argument("--resume", action="store_true",
                    help="with --results: keep the outcomes already in that file and run only the other mutants")
    args = ap.parse_args(argv)
    if args.resume and not args.results:
        sys.exit("mutants: --resume needs --results FILE (the outcomes to keep)")
    if args.from_results:
        outcomes = [Outcome(**d) for d in json.loads(args.from_results.read_text())["outcomes"]]
        print(json.dumps(table(outcomes), indent=2) if args.json else render(outcomes), end="")
        return 0
    import vllm

    if vllm.__version__ != RELEASE:
        sys.exit(f"mutants: the installed vLLM is {vllm.__version__}; the mutants are of {RELEASE}")
    touches = shipped_set()
    with tempfile.TemporaryDirectory(prefix="patchkit-mutants-") as work:
        work = Path(work)
        mutants = only(generate(installed_vllm().parent, touches), args.only)  # read only: edits are tree paths
        if args.only and not mutants:
            sys.exit(f"mutants: no mutant's name holds any of {args.only} (see --list)")
        if args.sample:
            mutants = sample(mutants, args.sample, args.seed)
        if args.list:
            for m in mutants:
                print(f"{m.aim:<9} {m.kind:<19} {m.place}\n          {m.description}")
            aims = [m.aim for m in mutants]
            print(f"{len(mutants)} mutants: {aims.count('breaking')} breaking-aimed, "
                  f"{aims.count('harmless')} harmless-aimed")
            return 0
        base = base_tree(work / "base")
        # the base is verified on what the mutants run will ask of it: with --only, the patches they affect
        verify_base(base, sorted({t.key: t for m in mutants for t in affected(m, touches)}.values(),
                                 key=lambda t: t.key) if args.only else touches)
        mutants = sample(mutants, len(mutants), args.seed)  # kinds interleaved: a run cut short still covers each
        finished: list[Outcome] = kept_outcomes(args.results, mutants) if args.resume else []
        ran = {f"{o.mutant['kind']}:{o.mutant['place']}" for o in finished}
        mutants = [m for m in mutants if m.name not in ran]
        done = [len(finished)]

        lock = threading.Lock()

        def one(im):
            i, m = im
            o = run_one(base, work, m, touches, i)
            with lock:
                done[0] += 1
                finished.append(o)
                if args.results:  # after every mutant: a long run interrupted still has its table
                    _write(args.results, finished)
            print(f"[{done[0]}/{len(mutants)}] {m.name}: oracle {o.oracle['breaking']}, flagged {o.flagged} "
                  f"({o.oracle['seconds']:.0f}+{o.check['seconds']:.0f} s)", file=sys.stderr, flush=True)
            return o

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(one, enumerate(mutants)))
        outcomes = finished
    doc = _write(args.results, outcomes) if args.results else _doc(outcomes)
    print(json.dumps(doc, indent=2) if args.json else render(outcomes), end="")
    return 0


def kept_outcomes(path: Path, mutants: list) -> list[Outcome]:
    """The outcomes of an earlier run (its --results file) of mutants still generated: a mutant whose name no
    longer exists (the set or the tree changed) is dropped, so a resumed table never mixes in a stale one; one whose
    oracle timed out is run again."""
    if not path.is_file():
        return []
    names = {m.name for m in mutants}
    kept = [Outcome(**d) for d in json.loads(path.read_text())["outcomes"]]
    timed_out = lambda o: o.oracle["breaking"] is None and o.oracle["tests"]  # noqa: E731 (run again)
    return [o for o in kept if f"{o.mutant['kind']}:{o.mutant['place']}" in names and not timed_out(o)]


def _doc(outcomes: list[Outcome]) -> dict:
    return {"release": RELEASE, "table": table(outcomes), "outcomes": [asdict(o) for o in outcomes]}


def _write(path: Path, outcomes: list[Outcome]) -> dict:
    doc = _doc(list(outcomes))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return doc


if __name__ == "__main__":
    sys.exit(main())

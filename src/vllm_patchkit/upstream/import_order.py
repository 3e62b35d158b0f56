"""Which of a release's modules may run before the plugins load: the only holders a by-value copy can go stale in.

An import-stage patch is installed the moment its target module finishes executing (`runtime/lazy.py`), or at
plugin load when the module is already imported. A module that does `from m import f` *after* that binds the
patched `f`: its copy is the patch, not a bypass. Only a module imported before the plugins load in some process
holds the original. vLLM loads the general plugins early in each process (`load_general_plugins()`: the front end
while it builds its argument parser and engine arguments, EngineCore in its constructor, a worker in
`init_worker` before it resolves its worker class); what runs before is, at most, the module-level import closure
of the modules that process starts from. Model modules are imported later and lazily, by name, through the model
registry, so they are not in it.

The closure is read statically and errs on the side of "before": every module-level import statement (inside
`if`/`try`/`with` blocks too, except under `if TYPE_CHECKING:`), each imported module's parent packages, and a
name imported from a package that is its submodule. The roots are the modules each role starts from, and whole
packages whose code runs at start-up in every role (the command line, the executors, the platforms: a platform
is resolved on first use, often before the plugins load). A root a release lacks is skipped.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

#: Modules (or whole packages, ending in ".*") that run before `load_general_plugins()` in some role.
ROOTS = (
    "vllm",
    "vllm.plugins",
    "vllm.entrypoints.cli.*",  # `vllm serve`: the sub-commands are imported by the dispatcher before parsing
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.*",
    "vllm.v1.worker.worker_base",
    "vllm.platforms.*",
)


class ImportOrder:
    """The set of a release's modules that may execute before the plugins load (computed once per release)."""

    def __init__(self, source) -> None:
        self.source = source
        self._before: Optional[frozenset[str]] = None
        self._read = False
        self._inside: dict[tuple[str, str], list[str]] = {}

    def before_plugins(self) -> Optional[frozenset[str]]:
        """The modules, or None when the release has none of the roots (not a vLLM tree this reading knows:
        then nothing is known to run after the plugins)."""
        if not self._read:
            self._read = True
            closure = self._closure()
            self._before = frozenset(closure) if closure else None
        return self._before

    def may_run_before_plugins(self, module: str) -> bool:
        before = self.before_plugins()
        return before is None or module in before

    # -- reading -----------------------------------------------------------------------------------------------
    def _file(self, module: str) -> Optional[tuple[str, bool]]:
        """(relative path, is a package) of a module of the release, or None."""
        base = module.replace(".", "/")
        for rel, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if self.source.read(rel) is not None:
                return rel, package
        return None

    def _roots(self) -> Iterator[str]:
        files = None
        for root in ROOTS:
            if not root.endswith(".*"):
                yield root
                continue
            if files is None:
                from vllm_patchkit.upstream.static_source import module_name

                files = [module_name(rel) for rel in self.source.python_files("vllm")]
            package = root[:-2]
            yield from (m for m in files if m == package or m.startswith(package + "."))

    def _closure(self) -> set[str]:
        seen: set[str] = set()
        todo = list(self._roots())
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            found = self._file(module)
            if found is None:
                continue
            seen.add(module)
            parts = module.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
            rel, package = found
            todo.extend(self._imports(rel, module if package else module.rpartition(".")[0]))
        return seen

    def _imports(self, rel: str, package: str) -> Iterator[str]:
        raw = self.source.read(rel) or b""
        try:
            tree = ast.parse(_without_functions(raw))
        except (SyntaxError, ValueError):
            try:
                tree = ast.parse(raw)  # the cut text did not parse (a column-0 line inside a string): read it whole
            except (SyntaxError, ValueError):
                return
        module = rel[:-len("/__init__.py")] if rel.endswith("/__init__.py") else rel[:-3]
        module = module.replace("/", ".")
        bound: dict[str, str] = {}  # a name imported `from m import f`: the module it comes from
        statements = list(_module_level(tree.body))
        for node in statements:
            yield from _imported(node, package, self._file, bound)
        # a function called while the module executes (`pynvml = import_pynvml()`) runs its imports then too
        for name in sorted(_called(statements)):
            home = bound.get(name, module)
            yield from self._imports_inside(home, name, package if home == module else None)

    def _imports_inside(self, module: str, function: str, package: Optional[str]) -> list[str]:
        """The imports anywhere in the body of `module`'s top-level function `function` (one call deep)."""
        key = (module, function)
        if key not in self._inside:
            self._inside[key] = []
            found = self._file(module)
            raw = self.source.read(found[0]) if found is not None else None
            if raw is not None and re.search(rb"^(?:async[ \t]+)?def[ \t]+" + re.escape(function.encode()) + rb"\b",
                                             raw, re.MULTILINE):
                here = package or (module if found[1] else module.rpartition(".")[0])
                try:
                    tree = ast.parse(raw)
                except (SyntaxError, ValueError):
                    tree = ast.Module([], [])
                for node in tree.body:
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
                        self._inside[key] = [m for inner in ast.walk(node)
                                             for m in _imported(inner, here, self._file, {})]
        return self._inside[key]


def _imported(node: ast.AST, package: str, exists, bound: dict[str, str]) -> Iterator[str]:
    """The vLLM modules one import statement imports (`bound` learns the names it binds from where)."""
    from vllm_patchkit.upstream.static_tables import absolute

    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("vllm"):
                yield alias.name
    elif isinstance(node, ast.ImportFrom):
        frm = absolute(node.module, node.level, package)
        if not frm.startswith("vllm"):
            return
        yield frm
        for alias in node.names:  # `from pkg import sub`: a submodule is imported too
            if alias.name == "*":
                continue
            bound[alias.asname or alias.name] = frm
            if exists(f"{frm}.{alias.name}") is not None:
                yield f"{frm}.{alias.name}"


def _called(statements: list) -> set[str]:
    """Names called as plain functions by statements that run at import (not inside a def or lambda)."""
    names: set[str] = set()
    todo = [n for n in statements if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names.add(node.func.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


_DEF = re.compile(rb"^([ \t]*)(?:async[ \t]+def|def)[ \t]", re.MULTILINE)


def _without_functions(raw: bytes) -> bytes:
    """The module's text with every function body cut to `pass` (a function's imports run when it is called, not
    at import): parsing the rest is what the closure costs. Cut lines become blank, so line numbers stay."""
    lines = raw.split(b"\n")
    out, i, n = [], 0, len(lines)
    while i < n:
        line = lines[i]
        m = _DEF.match(line)
        if m is None:
            out.append(line)
            i += 1
            continue
        indent = len(m.group(1).expandtabs())
        j = i + 1
        while j < n:  # the header's continuation lines (a multi-line signature), then the body
            nxt = lines[j]
            body = nxt.strip()
            if body and len(nxt) - len(nxt.lstrip()) <= indent and not body[:1] in (b")", b"]", b"}"):
                break
            j += 1
        out.append(m.group(0)[:-1] + b" _f(): pass")
        out.extend(b"" for _ in range(i + 1, j))
        i = j
    return b"\n".join(out)


def _module_level(body: list) -> Iterator[ast.stmt]:
    """Statements that run when the module executes: into `if` / `try` / `with` blocks, not into functions,
    classes' methods, or `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield from _module_level(node.body)
            for handler in node.handlers:
                yield from _module_level(handler.body)
            yield from _module_level(node.orelse)
            yield from _module_level(node.finalbody)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _module_level(node.body)  # a class body runs at import
        else:
            yield node


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def order_of(release) -> ImportOrder:
    """The release's ImportOrder, kept on it (one closure per release and process)."""
    held = release.__dict__.get("_import_order")
    if held is None:
        held = release.__dict__["_import_order"] = ImportOrder(release.source)
    return held

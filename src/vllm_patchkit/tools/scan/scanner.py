"""The scan: read the plugin's files, find the sites of each, place them at the release, detect copied bodies,
classify. `scan()` never raises: input it cannot read is a finding in `ScanResult.errors`."""

from __future__ import annotations

import ast
import warnings
from pathlib import PurePosixPath
from typing import Optional, Union

from vllm_patchkit.tools.scan import declarable
from vllm_patchkit.tools.scan.classify import classify
from vllm_patchkit.tools.scan.model import ScanResult, Site, placed
from vllm_patchkit.tools.scan.sites import FileScanner
from vllm_patchkit.tools.scan.syntax import _calls_super, is_vllm
from vllm_patchkit.tools.scan.sources import PluginSource, open_plugin
from vllm_patchkit.tools.scan.copies import (FUNC, MIN_LINES, BodyIndex, best, imported_vllm_modules, normalised,
                                              plugin_functions)
from vllm_patchkit.tools.scan.upstream import Upstream
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import Definition


def _plugin_defs(tree: ast.Module, module: str) -> dict[str, ast.AST]:
    """`module:fn` / `module:Cls` / `module:Cls.meth` -> node, for the file's top-level defs."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"{module}:{node.name}"] = node
        elif isinstance(node, ast.ClassDef):
            out[f"{module}:{node.name}"] = node
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{module}:{node.name}.{sub.name}"] = sub
    return out


def _dotted_to_spec(dotted: str, modules: set[str]) -> Optional[str]:
    """A plugin dotted path `pkg.mod.Cls` -> `pkg.mod:Cls`, by the longest prefix that is a plugin module."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i]) + ":" + ".".join(parts[i:])
    return None


def _ref_spec(ref, modules: set[str]) -> Optional[str]:
    """An importable `module:Qualname` for a resolved plugin reference (a nested function has none)."""
    if ref is None:
        return None
    if ref[0] in ("func", "class"):
        return None if "<locals>" in ref[1] or "<lambda>" in ref[1] else ref[1]
    if ref[0] == "plugin":
        return _dotted_to_spec(ref[1], modules)
    if ref[0] == "plugin_attr":
        return ref[1] if "<locals>" not in ref[1] else None
    return None


class Scan:
    """One scan run over a plugin source against one release."""

    def __init__(self, upstream: Upstream):
        self.up = upstream
        self.defs: dict[str, ast.AST] = {}
        self.modules: set[str] = set()
        self.class_bases: dict[str, list[str]] = {}  # plugin class spec -> vLLM bases as dotted paths

    def run(self, src: PluginSource) -> ScanResult:
        result = ScanResult(src.label, self.up.label, len(src.files), errors=list(src.errors))
        trees: list[tuple] = []
        tops = src.top_packages
        for pf in src.files:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(pf.data, filename=pf.path)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                msg = f"{type(exc).__name__}: {exc}"
                result.errors.append((pf.path, msg))
                result.sites.append(Site("parse_error", pf.path, getattr(exc, "lineno", 0) or 0, what=msg,
                                         facts={"error": f"does not parse: {msg}"}))
                continue
            self.modules.add(pf.module)
            trees.append((pf, tree))
            try:
                self.defs.update(_plugin_defs(tree, pf.module))
            except RecursionError:
                pass
        release = self.up if self.up.release is not None else None
        returns: dict[str, list[tuple]] = {}  # plugin functions returning vLLM objects, for loops in any file
        for pf, tree in trees:
            try:
                returns.update(FileScanner(pf.path, pf.module, tops, False, release).returns(tree))
            except (Exception, RecursionError):
                pass
        scanners = []
        for pf, tree in trees:
            is_pkg = PurePosixPath(pf.path).name == "__init__.py"
            sc = FileScanner(pf.path, pf.module, tops, is_pkg, release, returns)
            try:
                sc.run(tree)
            except (Exception, RecursionError) as exc:  # a scanner bug on odd input: a finding, never a crash
                result.errors.append((pf.path, f"scan error: {type(exc).__name__}: {exc}"))
            scanners.append(sc)
            result.errors += [(f"{pf.path}:{line}", f"scan error: {err}") for line, err in sc.errors]
            for qual, _node, bases in sc.facts_classes:
                self.class_bases[qual] = [b for b in bases if is_vllm(b)]
            result.sites.extend(sc.sites)
        for qual, bases in list(self.class_bases.items()):  # a plugin class whose base is a plugin subclass
            if not bases:
                for sc in scanners:
                    for q, _n, bs in sc.facts_classes:
                        if q == qual:
                            for b in bs:
                                if b.startswith("plugin:"):
                                    bases += self.class_bases.get(b[len("plugin:"):], [])
        result.sites += self._mixin_overrides(scanners)
        sites = []
        for site in result.sites:
            try:
                if self._place(site):
                    sites.append(site)
            except (Exception, RecursionError) as exc:
                site.notes.append(f"could not be placed at the release: {type(exc).__name__}: {exc}")
                sites.append(site)
        sites += self._copies(sites, trees)
        sites += self._refusals(sites, trees)
        selected = {s.facts["plugin_class"]: s.facts["config_field"] for s in sites
                    if s.mechanism == "config_field" and s.facts.get("plugin_class")}
        for site in sites:
            try:
                classify(site, selected)
            except Exception as exc:
                site.reason = f"could not classify: {type(exc).__name__}: {exc}"
        sites.sort(key=lambda s: (s.file, s.line, s.mechanism))
        result.sites = sites
        return result

    def _mixin_overrides(self, scanners) -> list[Site]:
        """Methods a plugin class gets from a mixin of its own (a base with no vLLM base) when the class also
        derives from a vLLM class: in the MRO the mixin's methods come first, so each one that the vLLM base
        has overrides it (`class S(_FixMixin, Scheduler)`), reported at the mixin's method."""
        classes: dict[str, tuple] = {}
        for sc in scanners:
            for qual, node, bases in sc.facts_classes:
                classes.setdefault(qual, (sc.path, node, bases))
        out: list[Site] = []
        seen: set[tuple] = set()
        for qual, (_path, node, bases) in classes.items():
            vbases = self.class_bases.get(qual) or []
            if not vbases:
                continue
            for b in bases:
                mixin = b[len("plugin:"):] if b.startswith("plugin:") else None
                if mixin is None or mixin not in classes or self.class_bases.get(mixin):
                    continue
                mpath, mnode, _ = classes[mixin]
                for stmt in mnode.body:
                    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) or (mixin, stmt.name) in seen:
                        continue
                    seen.add((mixin, stmt.name))
                    out.append(Site("subclass_override", mpath, stmt.lineno, None,
                                    f"{qual}.{stmt.name} (from the mixin {placed(mixin).qualname})",
                                    facts={"cls": qual, "cls_node": node, "bases": vbases, "method": stmt.name,
                                           "fn": stmt, "calls_super": _calls_super(stmt, mnode), "mixin": mixin}))
        return out

    def _refusals(self, sites: list[Site], trees) -> list[Site]:
        """Where the plugin refuses a configuration: a `raise` (not NotImplementedError, not a re-raise in an
        `except`) in a method overriding a vLLM hook that vLLM hands its configuration (a parameter the release
        annotates with a `vllm.config` class: `check_and_update_config(vllm_config)`, a scheduler's or a
        connector's `__init__`), or in a function of the same file that method calls (three calls deep).
        Reported on the hook vLLM calls: the base-most vLLM definition of the overridden method (a platform's
        `check_and_update_config` refuses for `Platform.check_and_update_config`, whatever platform it extends)."""
        if self.up.release is None:
            return []
        funcs: dict[str, dict[str, ast.AST]] = {}
        for pf, tree in trees:
            funcs[pf.path] = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        out: list[Site] = []
        seen: set[tuple] = set()
        for site in sites:
            if site.mechanism != "subclass_override" or not site.target or site.facts.get("fn") is None:
                continue
            if not self.up.takes_config(site.defined_at or site.target):
                continue
            hook = self.up.root_of(site.target) or site.target
            stack, visited = [(site.facts["fn"], 0)], set()
            while stack:
                fn, depth = stack.pop()
                if id(fn) in visited:
                    continue
                visited.add(id(fn))
                for node in _own_nodes(fn):
                    if isinstance(node, ast.Raise):
                        exc = _raised(node)
                        if exc is None or (site.file, node.lineno, hook) in seen:
                            continue
                        seen.add((site.file, node.lineno, hook))
                        arg = node.exc.args[0] if isinstance(node.exc, ast.Call) and node.exc.args else None
                        if isinstance(arg, ast.Name):  # raise ValueError(msg): the message the function built
                            bound = [n for n in _own_nodes(fn) if isinstance(n, ast.Assign) and n.lineno < node.lineno
                                     and any(isinstance(x, ast.Name) and x.id == arg.id for x in n.targets)]
                            arg = max(bound, key=lambda n: n.lineno).value if bound else arg
                        msg = _short_expr(arg) if arg is not None else ""
                        via = "" if fn is site.facts["fn"] else f" (in {getattr(fn, 'name', '?')}, called from it)"
                        out.append(Site("refuse", site.file, node.lineno, None, hook,
                                        what=f"raise {exc}{': ' + msg if msg else ''}{via}",
                                        facts={"override": site.target, "exception": exc, "message": msg}))
                    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and depth < 3
                          and node.func.id in funcs.get(site.file, {})):
                        stack.append((funcs[site.file][node.func.id], depth + 1))
        return out

    # -- placing at the release
    def _place(self, site: Site) -> bool:
        f = site.facts
        impl = f.get("impl")
        if impl is not None:
            f["impl_spec"] = _ref_spec(impl, self.modules)
        if f.get("value_path"):
            f["value_spec"] = self.up.place(f["value_path"])
        if site.mechanism == "subclass_override":
            return self._place_override(site)
        if site.mechanism == "config_field":
            cls = f.get("cls")
            spec = _dotted_to_spec(cls, self.modules) if cls and ":" not in cls else cls
            if spec and spec in self.class_bases and self.class_bases[spec]:
                f["plugin_class"] = spec
                f["vllm_base"] = self.class_bases[spec][0]
                site.target = self.up.place(self.class_bases[spec][0])
                site.defined_at = self._defined_at(site.target)
            return True
        if site.dotted and site.mechanism != "sys_modules" and not site.dotted.endswith("<dynamic>"):
            site.target = self.up.place(site.dotted)
            site.defined_at = self._defined_at(site.target)
            declarable.at_release(self.up, site)
        elif site.dotted:
            site.target = site.dotted
        if site.mechanism == "env":
            site.target = None
        if site.target and site.mechanism not in ("sys_modules", "registry"):
            declarable.missing(self.up, site)
        declarable.registry_entry(self.up, site)
        if site.mechanism == "registry" and site.target:  # the tables the registration stores into
            for spec in (site.target, site.defined_at):
                if spec:
                    site.writes = [w for w in self.up.writes(spec) if w not in site.writes] + site.writes
            if site.writes:
                site.notes.append(f"stores into {', '.join(site.writes)}")
        return True

    def _defined_at(self, spec: str) -> Optional[str]:
        d = self.up.resolve(spec)
        if isinstance(d, Definition):
            return d.where if d.where != spec else None
        if isinstance(d, Missing):
            if d.inherited_from:
                return d.inherited_from
        return None

    def _place_override(self, site: Site) -> bool:
        f = site.facts
        method = f["method"]
        if self.up.release is None:
            base = f["bases"][0]
            site.target = self.up.place(f"{base}.{method}")
            f["base_name"] = base
            return True
        for base in f["bases"]:
            spec = self.up.place(f"{base}.{method}")
            d = self.up.resolve(spec)
            if isinstance(d, Definition) or (isinstance(d, Missing) and d.inherited_from):
                site.target = spec
                site.defined_at = self._defined_at(spec)
                f["base_name"] = base
                return True
            if isinstance(d, Missing) and d.unreadable:  # a base defined outside the release: keep, unplaced
                site.target = spec
                f["base_name"] = base
                return True
        return False  # a method the base does not have: new, not an override

    # -- copied bodies (copies.py): every plugin function against the upstream bodies its code reaches
    def _copies(self, sites: list[Site], trees) -> list[Site]:
        if self.up.release is None:
            return []
        index = BodyIndex(self.up)
        out: list[Site] = []
        installers: dict[int, list[Site]] = {}  # id(plugin def) -> the sites installing it
        reached: dict[int, list[str]] = {}  # id(plugin def) -> its sites' targets (compared at MIN_LINES)
        classes: list[str] = []  # the vLLM classes the sites patch or subclass: their methods are candidates
        nodes: dict[int, ast.AST] = {}  # closures and nested defs too, not only the file's top-level ones
        for site in sites:
            f = site.facts
            node = None
            if site.mechanism in ("replace", "wrap", "instance_attr", "wrapt") and site.target:
                impl = f.get("impl")
                node = impl[2] if impl is not None and impl[0] == "func" and len(impl) > 2 else None
                if node is None and f.get("impl_spec"):
                    node = self.defs.get(f["impl_spec"])
            elif site.mechanism == "subclass_override" and site.target:
                node = f.get("fn")
            if site.target_class is not None and site.target_class not in classes:
                classes.append(site.target_class)
            if isinstance(node, FUNC):
                installers.setdefault(id(node), []).append(site)
                reached.setdefault(id(node), []).append(site.target)
                nodes[id(node)] = node

        def record(node, qual: str, where: str, score: float, path: str) -> None:
            by = installers.get(id(node), [])
            copy = Site("copy_body", path, node.lineno, site_dotted(where), where,
                        what=f"{qual} copies {where} (similarity {score:.2f})",
                        facts={"similarity": score, "installed_by": by[0].where if by else None})
            copy.notes.append(f"similarity {score:.2f}")
            out.append(copy)
            for site in by:
                if where not in site.hints.get("reimplements", []):
                    site.hints.setdefault("reimplements", []).append(where)
                    site.facts.setdefault("reimplements_scores", {})[where] = score
                    site.notes.append(f"copies {where} (similarity {score:.2f})")

        for pf, tree in trees:
            try:
                modules = imported_vllm_modules(tree, self.up.is_module)
                funcs = plugin_functions(tree)
            except (Exception, RecursionError):
                continue
            extra = [(getattr(n, "name", "?"), n) for n in nodes.values() if any(s.file == pf.path for s in installers[id(n)])]
            seen: set[int] = set()
            for qual, node in funcs + extra:
                if id(node) in seen:
                    continue
                seen.add(id(node))
                lines = normalised(node)
                found = None
                for target in reached.get(id(node), []):  # the place its site patches: the shorter bound
                    d = self.up.definition(target)
                    if d is not None and isinstance(d.node, FUNC):
                        hit = best(lines, [(d.where, normalised(d.node))], MIN_LINES)
                        if hit and (found is None or hit[1] > found[1]):
                            found = hit
                if found is None:
                    cands = [c for cls in classes for c in index.class_bodies(cls)]
                    cands += [c for m in modules for c in index.module_bodies(m)]
                    found = best(lines, cands)
                if found is not None:
                    record(node, qual, found[0], found[1], pf.path)
        return out


def _own_nodes(fn: ast.AST):
    """The nodes of a function's own body: not those of the functions and classes it defines, nor of its
    `except` handlers (a raise there re-raises or translates a failure, it is no refusal)."""
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ExceptHandler)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _raised(node: ast.Raise) -> Optional[str]:
    """The exception class a `raise` names, unless it is no refusal (a bare re-raise, NotImplementedError)."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    name = exc.attr if isinstance(exc, ast.Attribute) else exc.id if isinstance(exc, ast.Name) else None
    if name is None or name in ("NotImplementedError", "StopIteration", "StopAsyncIteration"):
        return None
    return name


def _short_expr(e: ast.AST, n: int = 80) -> str:
    try:
        text = " ".join(ast.unparse(e).split())
    except Exception:
        return "?"
    return text if len(text) <= n else text[: n - 1] + "…"


def site_dotted(spec: str) -> str:
    return spec.replace(":", ".")


def scan(spec: Union[str, "PluginSource"], vllm_source: Optional[str] = None, include_tests: bool = False,
         upstream: Optional[Upstream] = None) -> ScanResult:
    """Scan a plugin (a path or an installed distribution's name) against a release. Never raises."""
    try:
        src = spec if isinstance(spec, PluginSource) else open_plugin(str(spec), include_tests)
        up = upstream if upstream is not None else Upstream.open(vllm_source)
        return Scan(up).run(src)
    except (Exception, RecursionError) as exc:  # the contract: no input makes the scan raise
        return ScanResult(str(spec), None, 0, errors=[(str(spec), f"scan failed: {type(exc).__name__}: {exc}")])


__all__ = ["Scan", "scan"]

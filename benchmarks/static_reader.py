"""The static reader (`vllm_patchkit.tools.static`) against a reader built on griffe, on one vLLM release.

    python benchmarks/static_reader.py --vllm 0.33.0          # the wheel from $VLLM_PATCHKIT_WHEEL_CACHE
    python benchmarks/static_reader.py --wheel PATH [--no-sweep]

Issue 12 item 5 asked whether the static reader should be rebuilt on griffe's loader. This script is
the measurement behind the answer written at the top of `src/vllm_patchkit/tools/static.py`. griffe is not
a dependency of this project; install it to run this (`pip install griffe`).

Each reader runs in its own child process (so the peak RSS printed is that reader's alone) and looks
up the same places: every target, copy and use of the shipped patch sets plus every target pinned in
a shipped manifest, and (unless `--no-sweep`) every function, class and method of their modules,
all with source digests. Printed side by side:

- `prepare`: what the reader needs before the first lookup. `static.py` opens the wheel in place;
  griffe cannot read a zip (its finder and loader take file-system paths), so the wheel's `vllm/*.py`
  are extracted to a temporary folder first;
- `load`: griffe loads the whole `vllm` package (`GriffeLoader.load("vllm")`: it has no public way to
  load only the modules a lookup passes through) and resolves its aliases; `static.py` has no such step;
- `lookups`: the fingerprints (griffe: navigate its object tree, then the project's rules on the
  reparsed definition, exactly as `static.py` applies them);
- `peak RSS`: the child's maximum resident set size;
- then every place where the two readers disagree. `GriffeReader` is a prototype: griffe navigates
  and resolves, this project's rules (`static_decorators.py`, `fingerprint.from_def`) judge; it does
  not redo what griffe models differently from the interpreter (a try/except's handler winning over
  its body, `x = y` as an attribute), listed in `static.py`'s "Why not griffe".
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
import msgspec
from vllm_patchkit.tools.manifest_files import dump_fingerprint
from typing import Any, Optional

_MB = 1024  # ru_maxrss is in KiB on Linux


def _specs() -> list[str]:
    import yaml

    from vllm_patchkit.tools.examine import target_specs
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
    from vllm_patchkit.declaration.patchsets import installed_sets

    ps = load_patch_set(installed_sources())
    specs = {s for p in ps.patches.values() for s in target_specs(p)}
    for pset in installed_sets():
        for f in sorted(Path(pset.manifests).glob("vllm-*.yaml")) if pset.manifests else []:
            for entry in (yaml.safe_load(f.read_text()) or {}).get("patches") or []:
                specs.update((entry.get("targets") or {}).keys())
    return sorted(specs)


def _dump(f: Any) -> Any:
    from vllm_patchkit.upstream.missing import Missing

    if isinstance(f, Missing):
        return {"missing": True, "moved_to": list(f.moved_to), "unreadable": f.unreadable,
                "inherited_from": f.inherited_from, "reason": f.reason}
    return dump_fingerprint(f)


# -- static.py ----------------------------------------------------------------------------------
def run_static(wheel: Path, specs: list[str]) -> dict:
    from vllm_patchkit.tools.static import StaticRelease

    t0 = time.perf_counter()
    rel = StaticRelease.open(wheel)
    t1 = time.perf_counter()
    out = {s: _dump(rel.lookup(s, with_digest=True)) for s in specs}
    t2 = time.perf_counter()
    return {"prepare": t1 - t0, "load": 0.0, "lookups": t2 - t1, "results": out,
            "note": f"{len([m for m in rel._modules.values() if m])} modules parsed"}


# -- griffe -------------------------------------------------------------------------------------
class GriffeReader:
    """A loaded griffe package seen through `StaticRelease.lookup`'s rules (a prototype, for measuring)."""

    def __init__(self, loader: Any):
        import griffe

        self.griffe = griffe
        self.loader = loader
        self.mods = loader.modules_collection

    def _node(self, obj: Any) -> Optional[ast.AST]:
        """The definition's AST, reparsed from the lines griffe kept (decorators included)."""
        lines = obj.lines_collection[obj.filepath][obj.lineno - 1: obj.endlineno]
        src = "\n".join(lines) + "\n"
        indented = src[:1] in (" ", "\t")
        tree = ast.parse("if 1:\n" + src if indented else src)
        body = tree.body[0].body if indented else tree.body
        return body[0] if body else None

    def _get(self, path: str) -> Any:
        try:
            obj = self.mods.get_member(path)
        except (KeyError, ValueError):
            return None
        try:
            return obj.final_target if obj.is_alias else obj
        except (self.griffe.AliasResolutionError, self.griffe.CyclicAliasError):
            return ("external", obj.target_path)

    def lookup(self, spec: str, with_digest: bool = False) -> Any:
        from vllm_patchkit.upstream import source_fingerprint as fp
        from vllm_patchkit.declaration.pins import Fingerprint
        from vllm_patchkit.upstream.missing import Missing
        from vllm_patchkit.tools.static import literal_digest
        from vllm_patchkit.upstream.static_decorators import kind_of, returned_nested_def, sets_wrapped

        module, _, qualname = spec.partition(":")
        obj = self._get(module)
        if obj is None or isinstance(obj, tuple):
            return Missing(spec, f"module {module!r} is not in this release", tuple(self.find_moved(spec)))
        parts = qualname.split(".")
        owner_is_class = False
        for i, part in enumerate(parts):
            owner_is_class = obj.is_class
            member = obj.members.get(part)
            if member is not None and not member.runtime:  # under `if TYPE_CHECKING:`
                member = None
            if member is None:
                if obj.is_class and i == len(parts) - 1:
                    inh = obj.inherited_members.get(part)
                    if inh is not None:
                        base = inh.final_target.parent
                        where = f"{base.module.path}:{base.path[len(base.module.path) + 1:]}.{part}"
                        return Missing(spec, "inherited", (where,), inherited_from=where)
                return Missing(spec, f"no attribute {part!r}", tuple(self.find_moved(spec)))
            try:
                obj = member.final_target if member.is_alias else member
            except (self.griffe.AliasResolutionError, self.griffe.CyclicAliasError):
                return Missing(spec, f"defined outside the release ({member.target_path})", unreadable=True)
            if obj.is_module and i < len(parts) - 1:
                continue
        if obj.is_module:
            return Missing(spec, f"{spec} is a module, not an attribute")
        if obj.is_attribute:
            node = self._node(obj)
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Lambda):
                kind = "method" if owner_is_class else "function"
                return Fingerprint(kind=kind, signature=fp.render_arguments(value.args))
            return Fingerprint(kind="attribute", value_digest=literal_digest(value) if value is not None else None)
        node = self._node(obj)
        kind = kind_of(node, owner_is_class)
        bottom, layers = node, []
        if obj.is_function:
            own = f"{obj.module.path}.{obj.path[len(obj.module.path) + 1:]}"
            bottom_name = own
            for dec in reversed(obj.decorators):
                how = self._decorator(dec, sets_wrapped, returned_nested_def)
                if how[0] == "layer":
                    layers.insert(0, how[1] or bottom_name)
                elif how[0] == "replace":
                    bottom, bottom_name, layers = how[2], how[1], []
        f = fp.from_def(bottom, kind, with_digest)
        return msgspec.structs.replace(f, wrappers=layers) if layers else f

    def _decorator(self, dec: Any, sets_wrapped, returned_nested_def) -> tuple:
        from vllm_patchkit.upstream.static_decorators import KNOWN_DECORATORS, NOT_WRAPPING, OBJECT_LAYERS

        try:
            path = dec.callable_path
        except Exception:  # noqa: BLE001
            return ("layer", None)
        last = path.rpartition(".")[2]
        if last in NOT_WRAPPING:
            return ("none",)
        if last in OBJECT_LAYERS:
            return ("layer", OBJECT_LAYERS[last])
        target = self._get(path)
        if target is None or isinstance(target, tuple) or not (target.is_function or target.is_class):
            return ("layer", None)
        mod = target.module.path
        where = f"{mod}:{target.path[len(mod) + 1:]}"
        if where in KNOWN_DECORATORS:
            return ("layer", None) if KNOWN_DECORATORS[where] else ("none",)
        fn = self._node(target)
        if target.is_class:
            return ("layer", target.path) if sets_wrapped(fn) else ("layer", None)
        if sets_wrapped(fn):
            return ("layer", None)
        if not isinstance(dec.value, self.griffe.ExprCall):
            nested = returned_nested_def(fn)
            if nested is not None:
                return ("replace", f"{target.path}.<locals>.{nested.name}", nested)
        return ("none",)

    def find_moved(self, spec: str, limit: int = 5) -> list[str]:
        """The same name defined elsewhere: nearest package first (as `StaticRelease.find_moved`)."""
        module, _, qualname = spec.partition(":")
        parts = qualname.split(".")
        leaf, cls = parts[-1], (parts[-2] if len(parts) > 1 else None)
        package = module.split(".")
        for depth in range(len(package) - 1, 0, -1):
            top = self._get(".".join(package[:depth]))
            if top is None or isinstance(top, tuple):
                continue
            found = []
            stack = [top]
            while stack:
                m = stack.pop()
                for name, mem in m.members.items():
                    if mem.is_alias:
                        continue
                    if mem.is_module:
                        stack.append(mem)
                    elif cls is None and name == leaf and (mem.is_function or mem.is_class):
                        found.append(f"{m.path}:{leaf}")
                    elif cls is not None and name == cls and mem.is_class and leaf in mem.members \
                            and not mem.members[leaf].is_alias:
                        found.append(f"{m.path}:{cls}.{leaf}")
            found = sorted(f for f in set(found) if f != spec)
            if found:
                return found[:limit]
        return []


def run_griffe(wheel: Path, specs: list[str]) -> dict:
    import griffe

    with tempfile.TemporaryDirectory(prefix="griffe-vllm-") as tmp:
        t0 = time.perf_counter()
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
        t1 = time.perf_counter()
        loader = griffe.GriffeLoader(search_paths=[tmp], allow_inspection=False, store_source=True)
        loader.load("vllm")
        unresolved, _ = loader.resolve_aliases(implicit=False, external=False)
        t2 = time.perf_counter()
        reader = GriffeReader(loader)
        out = {}
        for s in specs:
            try:
                out[s] = _dump(reader.lookup(s, with_digest=True))
            except Exception as exc:  # noqa: BLE001
                out[s] = {"error": f"{type(exc).__name__}: {exc}"}
        t3 = time.perf_counter()
    stats = loader.stats()
    return {"prepare": t1 - t0, "load": t2 - t1, "lookups": t3 - t2, "results": out,
            "note": f"{stats.by_kind[griffe.Kind.MODULE]} modules loaded, {len(unresolved)} aliases unresolved"}


def _module_defs(wheel: Path, modules: list[str]) -> list[str]:
    """Every function, class and method each module defines (read by `static.py`'s module tables)."""
    from vllm_patchkit.tools.static import StaticRelease
    from vllm_patchkit.upstream.static_tables import FUNCS

    rel, out = StaticRelease.open(wheel), []
    for name in modules:
        mod = rel.module(name)
        for n, b in (mod.scope.names.items() if mod else ()):
            if isinstance(b, (*FUNCS, ast.ClassDef)):
                out.append(f"{name}:{n}")
            if isinstance(b, ast.ClassDef):
                out += [f"{name}:{n}.{m}" for m, mb in rel._class_scope(b, mod.package).names.items()
                        if isinstance(mb, FUNCS)]
    return out


def child(reader: str, wheel: Path, specs_file: Path) -> None:
    specs = json.loads(specs_file.read_text())
    r = (run_static if reader == "static" else run_griffe)(wheel, specs)
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _MB
    print(json.dumps(r))


def _same(a: dict, b: dict) -> bool:
    if a.get("missing") and b.get("missing"):
        return all(a.get(k) == b.get(k) for k in ("moved_to", "unreadable", "inherited_from"))
    return a == b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path)
    ap.add_argument("--vllm", help="take vllm-VERSION-*.whl from $VLLM_PATCHKIT_WHEEL_CACHE")
    ap.add_argument("--no-sweep", action="store_true", help="only the pinned places, not every def of their modules")
    ap.add_argument("--child", choices=["static", "griffe"], help=argparse.SUPPRESS)
    ap.add_argument("--specs", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.wheel, args.specs)
        return 0
    from vllm_patchkit.tools.releases import cached_wheel

    if importlib.util.find_spec("griffe") is None:
        print("griffe is not installed (it is not a dependency of vllm-patchkit): pip install griffe")
        return 2

    wheel = args.wheel or (cached_wheel(args.vllm) if args.vllm else None)
    if wheel is None or not Path(wheel).is_file():
        ap.error("give --wheel PATH, or --vllm VERSION with the wheel in $VLLM_PATCHKIT_WHEEL_CACHE")
    pinned = _specs()
    modules = sorted({s.partition(":")[0] for s in pinned})
    specs = pinned if args.no_sweep else sorted({*pinned, *_module_defs(wheel, modules)})
    runs = {}
    specs_file = Path(tempfile.mkstemp(suffix=".json")[1])
    specs_file.write_text(json.dumps(specs))
    for reader in ("static", "griffe"):
        cmd = [sys.executable, __file__, "--child", reader, "--wheel", str(wheel), "--specs", str(specs_file)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{reader}: failed\n{p.stderr[-2000:]}")
            return 1
        runs[reader] = json.loads(p.stdout.strip().splitlines()[-1])
    specs_file.unlink()
    s, g = runs["static"], runs["griffe"]
    print(f"wheel     {Path(wheel).name}; {len(specs)} places looked up with source digests "
          f"({len(pinned)} pinned{'' if args.no_sweep else ', and every def of their modules'})")
    print(f"{'':10}{'static.py':>14}{'griffe':>14}")
    for key, label in (("prepare", "prepare"), ("load", "load"), ("lookups", "lookups")):
        print(f"{label:10}{s[key]:>12.2f} s{g[key]:>12.2f} s")
    ts, tg = sum(s[k] for k in ("prepare", "load", "lookups")), sum(g[k] for k in ("prepare", "load", "lookups"))
    print(f"{'total':10}{ts:>12.2f} s{tg:>12.2f} s   (griffe / static.py: {tg / ts:,.0f}x)")
    print(f"{'peak RSS':10}{s['peak_rss_mb']:>11.0f} MB{g['peak_rss_mb']:>11.0f} MB")
    print(f"static.py: {s['note']}; griffe: {g['note']}")
    differ = [x for x in specs if not _same(s["results"][x], g["results"].get(x, {}))]
    print(f"agree on {len(specs) - len(differ)} of {len(specs)} places "
          f"({len([x for x in pinned if x in differ])} of the {len(pinned)} pinned ones differ)")
    for x in differ:
        print(f"  {x}\n    static.py: {s['results'][x]}\n    griffe:    {g['results'].get(x)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

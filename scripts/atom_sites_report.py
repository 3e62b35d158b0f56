"""How much of a real plugin's vLLM patching the patch schema expresses: AMD ATOM, against vLLM 0.31.0.

    python scripts/atom_sites_report.py           # the table of figures
    python scripts/atom_sites_report.py --list    # and every place that is not declared, pinned and checked
    python scripts/atom_sites_report.py --json    # the figures as JSON

Reads tests/data/atom_patch_sites.yaml (one entry per place ATOM patches; its header says how it was
made) and works each place out again against the installed vLLM 0.31.0, **read statically**
(`vllm_patchkit.tools.static.StaticRelease` over the installed source tree, found without importing it):

- exists: the static reader finds the target's definition (`StaticRelease.resolve`);
- declared: a minimal patch document for the place validates with `vllm_patchkit.declaration.schema.Patch`
  (a by-value copy is declared as a `copies` entry of the target it copies);
- pinned: declared, exists, and every place the declaration pins (`Patch.pinned_specs`) has a static
  fingerprint, as `vllm-patchkit pin --source` records it (with the upstream decorator layers);
- checked: the static counterpart of what `vllm_patchkit.runtime.verify.verify` refuses at start-up, rule by rule:
  a wrap/replace target that is a function or method (not a class or a value), defined where it is named
  (a name imported by value from elsewhere is what verify refuses as "replaced by another object"), every
  declared copy holding the target's definition, `uses` / `value_from` / a replace's implementation found
  (a replace's implementation with the target's signature), and for kind subclass the implementation
  (our stand-in, tests/corpus/atom/standins.py, read statically too) defining every override with the
  pinned signature, itself or through a base outside vLLM.

Why static: two targets live in `vllm.platforms.rocm`, and importing another platform's module kills
the process on the CPU build (it imports `vllm._C`: an illegal instruction on an AVX2-only CPU, a
`TORCH_LIBRARY` abort on an AVX-512 one that already loaded the CPU ops), with no exception to catch.
Nothing here imports vLLM at all (tests/contracts/test_platform_isolation.py runs this script under an
import guard that aborts on any such import). Loads no model; exit code 0 (1 when the data file does not
validate).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import yaml
from vllm_patchkit.declaration.validation import validate

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "atom_patch_sites.yaml"
ATOM_PINS = "0.31.0"  # the vLLM release the ATOM plugin (and so this list) is written against
CALLABLE_KINDS = {"function", "method", "staticmethod", "classmethod"}


def load(path: Path = DATA) -> tuple[dict, list[dict]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc["summary"], doc["sites"]


def _doc(pid: str, entry: dict, copies: list[str]) -> dict:
    """A minimal patch document for the place (the shape tests/contracts/helpers.patch_doc builds)."""
    kind = entry["mechanism"]
    doc = {"id": pid, "version": 1, "summary": f"ATOM: {entry['atom_function']}", "why": entry["note"],
           "upstream": "none: measurement of ROCm/ATOM", "retire_when": {"manual": "measurement only"},
           "kind": kind, "target": entry["target"], "processes": ["engine_core"], "required": False}
    extra = dict(entry.get("declare") or {})
    extra.pop("copies", None)
    doc.update(extra)
    if copies:
        doc["copies"] = copies
    if kind == "refuse":
        doc.setdefault("message", entry["note"])
    return doc


def installed_release():
    """The installed vLLM's source tree, read statically (None when vLLM is not installed)."""
    from vllm_patchkit.tools.releases import installed_root
    from vllm_patchkit.tools.static import StaticRelease
    from vllm_patchkit.upstream.static_source import DirSource

    root = installed_root()
    return None if root is None else StaticRelease(DirSource(root))


def _static_check(release, ours, patch) -> Optional[str]:
    """Why the loader would refuse the patch, judged from the source (None: nothing found)."""
    from vllm_patchkit.declaration.kinds import traits
    from vllm_patchkit.declaration.vocabulary import Kind
    from vllm_patchkit.upstream.missing import Missing

    target = release.resolve(patch.target)
    if isinstance(target, Missing):
        return f"target: {target.reason}"
    if patch.kind in (Kind.wrap, Kind.replace):
        getter = target.kind == "attribute" and isinstance(target.node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if target.kind not in CALLABLE_KINDS and not getter:
            return f"kind: {patch.target} is a {target.kind}; `{patch.kind.value}` supports functions and methods only"
        if target.where != patch.target:
            return (f"conflict: {patch.target} holds {target.where} by value (defined elsewhere): the loader "
                    "refuses it as replaced by another object; declare the definer as target, this name as a copy")
    for spec in patch.copies:
        held = release.resolve(spec)
        if isinstance(held, Missing):
            return f"copy: declared copy {spec} is gone: {held.reason}"
        if held.where != target.where:
            return f"copy: declared copy {spec} holds {held.where}, not {target.where}"
    for spec in list(patch.uses) + ([patch.value_from] if patch.value_from else []):
        where = release if spec.startswith("vllm") else ours  # a value_from of our own (a stand-in) is ours
        if isinstance(where.resolve(spec), Missing):
            return f"uses: {spec} is not found"
    if patch.kind is Kind.replace:
        impl = release.resolve(patch.implementation)
        if isinstance(impl, Missing) or impl.kind not in CALLABLE_KINDS:
            return f"implementation: {patch.implementation} is not a function here"
        if impl.fingerprint().signature != target.fingerprint().signature:
            return f"convention: {patch.implementation} does not take the target's signature"
    if traits(patch).judges_overrides:  # subclass and hook: each override against the base's
        impl = ours.resolve(patch.implementation)
        if isinstance(impl, Missing) or impl.kind != "class":
            return f"implementation: {patch.implementation} is not a class in this repository"
        for method in patch.overrides:
            spec = f"{patch.implementation}.{method}"
            mine = ours.resolve(spec)
            if isinstance(mine, Missing) and mine.inherited_from and not mine.inherited_from.startswith("vllm."):
                mine = ours.resolve(mine.inherited_from)  # a mixin's override counts as the class's own
            if isinstance(mine, Missing):
                return f"override: {spec} is not defined by the implementation ({mine.reason})"
            base = release.resolve(f"{patch.target}.{method}")
            if isinstance(base, Missing):
                return f"override: {patch.target}.{method} is not in this release"
            if mine.fingerprint().signature != base.fingerprint().signature:
                return (f"override: {spec}{mine.fingerprint().signature} does not take "
                        f"{patch.target}.{method}{base.fingerprint().signature}")
    return None


def evaluate(sites: list[dict], release=None) -> list[dict]:
    """Per place: exists / declared / pinned / checked, each worked out from the source, and why not."""
    from vllm_patchkit.declaration.schema import Patch
    from vllm_patchkit.declaration.vocabulary import Kind
    from vllm_patchkit.upstream.missing import Missing
    from vllm_patchkit.tools.static import StaticRelease
    from vllm_patchkit.upstream.static_source import DirSource

    release = release if release is not None else installed_release()
    if release is None:
        raise SystemExit("vLLM is not installed: nothing to read")
    ours = StaticRelease(DirSource(REPO))  # the stand-in implementations, read the same way

    primaries = {(e["atom_file"], e["atom_function"], e["target"]): i
                 for i, e in enumerate(sites) if e["mechanism"] != "copy"}
    members_of: dict[int, list[int]] = {}
    for j, e in enumerate(sites):
        if e["mechanism"] == "copy":
            members_of.setdefault(primaries[(e["atom_file"], e["atom_function"], e["copy_of"])], []).append(j)

    results: list[dict] = [{} for _ in sites]
    for e, r in zip(sites, results):
        d = release.resolve(e["target"])
        r["exists"] = not isinstance(d, Missing)
        if not r["exists"]:
            r["why"] = d.reason
    for i, e in enumerate(sites):
        r = results[i]
        if not e["declarable"] or e["mechanism"] == "copy":
            continue
        members = [i] + members_of.get(i, [])
        try:
            patch = validate(Patch, _doc(f"atom-site-{i:03d}", e, [sites[j]["target"] for j in members[1:]]))
        except Exception as exc:  # a validation error is the finding
            for j in members:
                results[j]["declared"], results[j]["why"] = False, f"schema: {exc}"
            continue
        for j in members:
            results[j]["declared"] = True
            results[j]["pinned"] = results[j]["exists"]
        if not r["pinned"]:
            continue
        pins: dict[str, Any] = {}  # every place the declaration pins (a subclass: its base and each override)
        for spec in patch.pinned_specs:
            got = release.lookup(spec, patch.kind is Kind.replace)
            if not isinstance(got, Missing):
                pins[spec] = got
        why = None if patch.target in pins else f"fingerprint: {patch.target} has none"
        why = why or _static_check(release, ours, patch)
        for j in members:
            if results[j]["pinned"]:
                results[j]["checked"] = why is None
                if why:
                    results[j]["why"] = why
    return results


def figures(sites: list[dict], results: list[dict]) -> dict:
    missing = Counter(e["missing_kind"] for e in sites if e["missing_kind"])
    return {
        "places": len(sites),
        "distinct_targets": len({e["target"] for e in sites}),
        "exists": sum(bool(r.get("exists")) for r in results),
        "declarable": sum(bool(r.get("declared")) for r in results),
        "pinnable": sum(bool(r.get("pinned")) for r in results),
        "checked": sum(bool(r.get("checked")) for r in results),
        "missing_kinds": dict(sorted(missing.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def render(fig: dict) -> str:
    n = fig["places"]

    def row(label: str, value: int, base: int = n) -> str:
        return f"| {label:<44} | {value:>5} | {100 * value / base:>5.1f} % |" if base else f"| {label:<44} | {value:>5} |"

    lines = [f"| {'ROCm/ATOM atom/plugin/vllm on vLLM 0.31.0':<44} | {'count':>5} | {'share':>7} |",
             f"|{'-' * 46}|{'-' * 7}|{'-' * 9}|",
             row("places ATOM patches", n),
             row("  distinct vLLM targets among them", fig["distinct_targets"]),
             row("exist in the installed vLLM 0.31.0", fig["exists"]),
             row("declarable with the schema", fig["declarable"]),
             row("pinned (declarable and existing)", fig["pinnable"]),
             row("checked (loader's rules, read statically)", fig["checked"]),
             row("not declarable: a kind is missing", n - fig["declarable"])]
    for kind, count in fig["missing_kinds"].items():
        lines.append(row(f"  missing kind {kind}", count))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--list", action="store_true", help="also list every place not declared, pinned and checked")
    args = ap.parse_args(argv)
    summary, sites = load(args.data)
    release = installed_release()
    if release is None or (release.version() or "").split("+")[0] != ATOM_PINS:
        found = "none" if release is None else release.version()
        print(f"ATOM patches vLLM {ATOM_PINS}; the figures are measured on that release (installed: {found})",
              file=sys.stderr)
        return 2
    results = evaluate(sites, release)
    fig = figures(sites, results)
    if args.json:
        print(json.dumps(fig, indent=2))
    else:
        print(render(fig))
        stated = {k: summary.get(k) for k in fig}
        if stated != fig:
            print(f"\nnote: the summary block of {args.data.name} differs: {stated}")
    if args.list:
        print()
        for e, r in zip(sites, results):
            if not r.get("checked"):
                state = "missing " + e["missing_kind"] if e["missing_kind"] else r.get("why", "not checked")
                print(f"- {e['target']}  [{e['mechanism']}, {e['atom_file'].rsplit('/', 1)[-1]}]: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

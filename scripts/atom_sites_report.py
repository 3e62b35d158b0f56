"""How much of a real plugin's vLLM patching the patch schema expresses: AMD ATOM, against vLLM 0.31.0.

    python scripts/atom_sites_report.py           # the table of figures
    python scripts/atom_sites_report.py --list    # and every place that is not declared, pinned and checked
    python scripts/atom_sites_report.py --json    # the figures as JSON

Reads tests/data/atom_patch_sites.yaml (one entry per place ATOM patches; its header says how it was
made) and works each place out again against the installed vLLM:

- exists: `vllm_patchkit.targets.resolve` finds the target;
- declared: a minimal patch document for the place validates with `vllm_patchkit.schema.Patch`
  (a by-value copy is declared as a `copies` entry of the target it copies);
- pinned: declared, exists, and `vllm_patchkit.fingerprint.live` gives its fingerprint, as
  `vllm-patchkit pin` records it (with the upstream decorator layers);
- checked: `vllm_patchkit.verify.verify` accepts the patch against a manifest entry holding those pins
  (what the loader does at start-up before it installs anything).

Imports vLLM modules, loads no model; exit code 0 (1 when the data file does not validate).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import yaml

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "atom_patch_sites.yaml"


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


def evaluate(sites: list[dict]) -> list[dict]:
    """Per place: exists / declared / pinned / checked, each worked out live, and why not."""
    from vllm_patchkit import fingerprint as fp
    from vllm_patchkit.schema import ManifestEntry, Patch
    from vllm_patchkit.targets import TargetError, resolve
    from vllm_patchkit.verify import Finding, verify

    primaries = {(e["atom_file"], e["atom_function"], e["target"]): i
                 for i, e in enumerate(sites) if e["mechanism"] != "copy"}
    copies_of: dict[int, list[str]] = {}
    for e in sites:
        if e["mechanism"] == "copy":
            i = primaries[(e["atom_file"], e["atom_function"], e["copy_of"])]
            copies_of.setdefault(i, []).append(e["target"])

    def pin(spec: str, kind: str):
        place = resolve(spec)
        raw = place.get_raw()
        f = fp.live(raw, place.owner_is_class, with_digest=kind == "replace", with_value=True)
        layers = fp.wrapper_layers(raw)
        return f.model_copy(update={"wrappers": layers}) if layers else f

    results: list[dict] = [{} for _ in sites]
    for e, r in zip(sites, results):
        try:
            resolve(e["target"])
            r["exists"] = True
        except TargetError as exc:
            r["exists"], r["why"] = False, str(exc)
    for i, e in enumerate(sites):
        r = results[i]
        if not e["declarable"] or e["mechanism"] == "copy":
            continue
        patch: Optional[Patch] = None
        try:
            patch = Patch.model_validate(_doc(f"atom-site-{i:03d}", e, copies_of.get(i, [])))
            r["declared"] = True
        except Exception as exc:  # a validation error is the finding
            r["declared"], r["why"] = False, f"schema: {exc}"
        members = [i] + [j for j, c in enumerate(sites)
                         if c["mechanism"] == "copy" and c.get("copy_of") == e["target"]
                         and (c["atom_file"], c["atom_function"]) == (e["atom_file"], e["atom_function"])]
        for j in members[1:]:
            results[j]["declared"] = r["declared"]
        if patch is None:
            continue
        pins: dict[str, Any] = {}
        for j in members:
            if not results[j].get("exists"):
                continue
            try:
                pins[sites[j]["target"]] = pin(sites[j]["target"], e["mechanism"])
                results[j]["pinned"] = True
            except Exception as exc:
                results[j]["pinned"], results[j]["why"] = False, f"fingerprint: {exc}"
        if not r.get("pinned"):
            continue
        found = verify(patch, ManifestEntry(patch=patch.key, targets=pins))
        ok = not isinstance(found, Finding)
        for j in members:
            if results[j].get("pinned"):
                results[j]["checked"] = ok
                if not ok:
                    results[j]["why"] = f"verify: {found.code}: {found.reason}"
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
             row("checked (verify accepts the pins)", fig["checked"]),
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
    results = evaluate(sites)
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

"""Write manifests/vllm-<installed version>.yaml from the installed vLLM (by import).

Usage: python scripts/pin_manifest.py [--out DIR]

A stop-gap until `vllm-patchkit pin` exists: it pins, for the newest version of
every patch in the shipped set, the live fingerprint of its target and copies.
Review the diff before committing; a changed pin means upstream changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from vllm_patchkit import fingerprint as fp
from vllm_patchkit.declare import builtin_patch_dirs, load_patch_set
from vllm_patchkit.loader import installed_vllm_version
from vllm_patchkit.schema import Kind
from vllm_patchkit.targets import resolve


def pin_entries(patch_dirs) -> list[dict]:
    ps = load_patch_set(patch_dirs)
    newest = {}
    for p in ps.patches.values():
        if p.id not in newest or p.version > newest[p.id].version:
            newest[p.id] = p
    entries = []
    for pid in sorted(newest):
        p = newest[pid]
        targets = {}
        for spec in ([p.target] if p.target else []) + list(p.copies):
            place = resolve(spec)
            raw = place.get_raw()
            f = fp.live(raw, place.owner_is_class, with_digest=p.kind is Kind.replace)
            f = f.model_copy(update={"wrappers": fp.wrapper_layers(raw)})
            targets[spec] = f.model_dump(exclude_none=True, exclude_defaults=False)
            if not targets[spec]["wrappers"]:
                del targets[spec]["wrappers"]
        entries.append({"patch": p.key, "targets": targets})
    return entries


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "manifests")
    args = ap.parse_args(argv)
    version = installed_vllm_version()
    doc = {
        "vllm": version,
        "generated_by": "python scripts/pin_manifest.py (from the installed vLLM, by import)",
        "patches": pin_entries(builtin_patch_dirs()),
    }
    out = args.out / f"vllm-{version}.yaml"
    header = "# yaml-language-server: $schema=../src/vllm_patchkit/schema/manifest.schema.json\n"
    out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write one corpus plugin's declarations as a patch set on disk, pinned on vLLM 0.31.0, so the ordinary
`vllm-patchkit check` (one release or several) runs on a real third-party plugin's places:

    python scripts/corpus_set.py flash_head OUT
    vllm-patchkit check --vllm 0.31.0,0.32.0,0.33.0 --patch-dir OUT/patches --manifest-dir OUT/manifests

OUT/patches holds one YAML per declared place (tests/corpus/catalogue.py builds the Patch, format:
tests/corpus/README.md), OUT/manifests the manifest `pin` writes for the installed 0.31.0 (the release every
catalogue names its places at). The implementations are the corpus's stand-ins (`tests.corpus.<plugin>.standins`),
read from source by check; run it from the repository's root.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.catalogue import load, plugins  # noqa: E402
from vllm_patchkit.declaration.declare import load_patch_set  # noqa: E402
from vllm_patchkit.tools.manifest_files import write  # noqa: E402
from vllm_patchkit.tools.pin import pin_release  # noqa: E402
from vllm_patchkit.tools.releases import open_release  # noqa: E402

PINNED_ON = "0.31.0"


def _pruned(value):
    """The declaration without its unset fields (None, empty), as a person would write the YAML."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [], {})}
    return value


def write_set(plugin: str, out: Path) -> tuple[Path, Path]:
    """OUT/patches (one YAML per declared place) and OUT/manifests (pinned on the installed 0.31.0)."""
    cat = load(plugin)
    patches, manifests = out / "patches", out / "manifests"
    patches.mkdir(parents=True, exist_ok=True)
    manifests.mkdir(parents=True, exist_ok=True)
    for patch in cat.patches():
        doc = _pruned(msgspec.to_builtins(patch))
        (patches / f"{patch.id}-{patch.version}.yaml").write_text(
            f"# {cat.plugin} {cat.version}: by scripts/corpus_set.py from tests/corpus/{plugin}/catalogue.yaml\n"
            + yaml.safe_dump(doc, sort_keys=False, width=120))
    ps = load_patch_set([patches])
    pinned = pin_release(open_release(PINNED_ON), ps, {}, generated_by="scripts/corpus_set.py")
    write(pinned.manifest, manifests)
    return patches, manifests


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plugin", choices=plugins())
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    patches, manifests = write_set(args.plugin, args.out)
    print(f"wrote {patches} and {manifests}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

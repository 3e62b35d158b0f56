"""Recall of `vllm-patchkit scan` against the corpus catalogues (tests/corpus/*/catalogue.yaml).

    .venv/bin/python scripts/scan_recall.py [--vllm-source WHEEL_OR_DIR]

Prints per plugin: catalogued places, places the scan found, recall (found / places), and each missed place.
Registry plugins are downloaded once into ~/.cache/vllm-patchkit/plugins ($VLLM_PATCHKIT_PLUGIN_CACHE); ATOM is
read from $PATCHKIT_ATOM_SRC when set (else skipped): a folder holding atom/plugin/vllm/, e.g. the files assembled at
the versions tests/data/atom_scan_recall.yaml lists (path, version, sha256), on which the recorded figure (97 of
the 107 places whose file versions it holds) was measured. tests/scan/test_recall.py uses the same function.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_patchkit.tools.scan.recall import corpus_recall, render

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT / "tests" / "corpus"))
    ap.add_argument("--vllm-source", help="vLLM wheel or folder (default: the installed vLLM, read statically)")
    args = ap.parse_args()
    print(render(corpus_recall(Path(args.corpus), args.vllm_source)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

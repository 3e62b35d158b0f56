"""Shim: `python scripts/pin_manifest.py [--out DIR]` is `vllm-patchkit pin` for the installed vLLM.

Kept so older instructions keep working; the logic lives in `vllm_patchkit.tools.pin`
(which also pins from a wheel or source tree: `vllm-patchkit pin --vllm X --source WHEEL`).
"""

from __future__ import annotations

import sys

from vllm_patchkit.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["pin", *sys.argv[1:]]))

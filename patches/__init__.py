"""This repository's DeepSeek-V4 patch set: one YAML (the declaration) beside one small module (the implementation).

Installed as its own top-level package, `patchkit_deepseek_v4` (with `.adapters` and `.manifests`), beside the
framework, and registered through the `vllm_patchkit.patch_sets` entry point (pyproject.toml) exactly as a third
party's set would be: the framework never names it, and it imports nothing of the framework but the public API
`vllm_patchkit` (tests/house/test_public_api.py).
"""

from importlib import resources
from pathlib import Path

from vllm_patchkit import PatchSetSource

#: The set's manifests, one per vLLM release.
MANIFESTS = Path(str(resources.files("patchkit_deepseek_v4.manifests")))


def patch_set() -> PatchSetSource:
    return PatchSetSource(name="deepseek-v4", patches=Path(__file__).resolve().parent, manifests=MANIFESTS)

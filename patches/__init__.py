"""This repository's DeepSeek-V4 patch set: one YAML (the declaration) beside one small module (the implementation).

Registered through the `vllm_patchkit.patch_sets` entry point (pyproject.toml), exactly as a
third party's set would be; the framework itself never names it.
"""

from importlib import resources
from pathlib import Path

from vllm_patchkit.declaration.patchsets import PatchSetSource


def patch_set() -> PatchSetSource:
    return PatchSetSource(
        name="deepseek-v4",
        patches=Path(__file__).resolve().parent,
        manifests=Path(str(resources.files("vllm_patchkit.manifests"))),
    )

"""A third party's patch set, independent of this repository's: found only through the entry point.

Installed by the end-to-end test into a folder of its own (`pip install --target`) and put on
the server's PYTHONPATH, so it is a real distribution for `importlib.metadata` without being
installed into the project's virtualenv (where every other test would load it too).
"""

from pathlib import Path

from vllm_patchkit import PatchSetSource

HERE = Path(__file__).resolve().parent


def patch_set() -> PatchSetSource:
    return PatchSetSource(name="other", patches=HERE / "patches", manifests=HERE / "manifests")

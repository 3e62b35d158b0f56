"""The lifecycle harness takes the version of a patch a loader on the installed vLLM would use (regression:
it took the newest version even where that version's `when.vllm` excludes the installed release)."""

from __future__ import annotations

from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools.testing.lifecycle import newest
from vllm_patchkit.declaration.validation import validate

from tests.contracts.helpers import patch_doc


def _set(*docs) -> PatchSet:
    ps = PatchSet()
    for d in docs:
        p = validate(Patch, d)
        ps.patches[p.key] = p
    return ps


def test_the_version_admitted_by_the_installed_release_is_taken():
    ps = _set(patch_doc("p", "toy.mod:f", when={"vllm": "<0.33"}),
              patch_doc("p", "toy.mod:g", version=2, when={"vllm": ">=0.33"}))
    assert newest(ps, "p", "0.31.0").key == "p@1"
    assert newest(ps, "p", "0.32.0").key == "p@1"
    assert newest(ps, "p", "0.33.0").key == "p@2"


def test_without_ranges_the_newest_is_taken():
    ps = _set(patch_doc("p", "toy.mod:f"), patch_doc("p", "toy.mod:f", version=2))
    assert newest(ps, "p", "0.31.0").key == "p@2"

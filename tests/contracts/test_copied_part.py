"""A copied body judged on the part the plugin copied (issue 31, false-alarm class 4), on vLLM's real bodies.

ATOM replaces `Sampler.greedy_sample` with its own GPU argmax; 0.32.0 added a CPU-only branch in front of the same
`return logits.argmax(dim=-1).view(-1)`. fp4local-abliterated re-does `_prepare_weights`' folder resolution; 0.32.0
changed only the duplicate filtering (now under `if allow_patterns_overrides is None:`), which its copy never
takes. Before, both were `source_changed ... must be re-synced (breaking)`, the corpus's false alarms.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import ReleaseError, installed_version, open_release
from vllm_patchkit.upstream.findings import BreakageKind

from .helpers import patch_doc

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="bodies read against vLLM 0.31.0")
GREEDY = "vllm.v1.sample.sampler:Sampler.greedy_sample"
PREPARE = "vllm.model_executor.model_loader.default_loader:DefaultModelLoader._prepare_weights"


@pytest.fixture(scope="module")
def releases():
    try:
        return open_release("0.31.0"), open_release("0.32.0")
    except ReleaseError as exc:
        pytest.skip(str(exc))


def greedy_sample(logits):
    """The stand-in replacement (read from source by check: the signature is what matters)."""
    return logits.argmax(dim=-1).view(-1)


def prepare_weights(self, model_name_or_path, subfolder, revision, fall_back_to_pt, allow_patterns_overrides):
    """The stand-in replacement of `_prepare_weights`."""
    raise NotImplementedError


IMPL = {GREEDY: f"{__name__}:greedy_sample", PREPARE: f"{__name__}:prepare_weights"}


def _replace(target: str, part=None) -> Patch:
    extra = {"copied_part": {target: part}} if part is not None else {}
    return validate(Patch, patch_doc("p", target, kind="replace", implementation=IMPL[target],
                                     reimplements=[target], **extra))


def _source_changed(releases, patch):
    old, new = releases
    found, said = examine(old, patch, None)
    assert said == [], [b.explain() for b in said]
    _, judged = examine(new, patch, found, old)
    return found, [b for b in judged if b.kind is BreakageKind.source_changed]


def test_a_change_outside_the_copied_part_is_compatible(releases):
    found, [b] = _source_changed(releases, _replace(GREEDY, ["return logits.argmax(dim=-1).view(-1)"]))
    assert found[GREEDY].part_digest is not None  # pinned beside the body's digest
    assert not b.breaking
    assert b.compat.startswith("the body changed outside the part the implementation copies (1 statement from "
                               "'return logits.argmax(dim=-1).view(-1)', `copied_part`)")


def test_without_a_part_the_whole_body_is_the_copy(releases):
    _, [b] = _source_changed(releases, _replace(GREEDY))
    assert b.breaking


def test_a_copied_statement_upstream_put_under_a_new_condition_has_changed(releases):
    """The statement text is the same on 0.32.0; what encloses it is not: the copy no longer does what vLLM does."""
    line = "hf_weights_files = filter_duplicate_safetensors_files(hf_weights_files, hf_folder, index_file)"
    _, [b] = _source_changed(releases, _replace(PREPARE, ["if not is_local:", line]))
    assert b.breaking


def test_the_folder_resolution_fp4local_copies_is_unchanged(releases):
    part = ["model_name_or_path = maybe_download_from_modelscope(model_name_or_path, revision) or model_name_or_path",
            "if not is_local:", "if subfolder is not None:"]
    _, [b] = _source_changed(releases, _replace(PREPARE, part))
    assert not b.breaking


def test_an_anchor_that_names_no_single_statement_is_refused_at_pin(releases):
    old, _ = releases
    for anchor, what in (("return None", "matches no statement"), ("if not is_local:", None)):
        _, said = examine(old, _replace(PREPARE, [anchor]), None)
        if what is None:
            assert said == []
            continue
        [b] = said
        assert b.kind is BreakageKind.misdeclared and what in b.detail and b.breaking


def test_a_part_is_of_a_body_the_implementation_copies():
    with pytest.raises(ValueError, match="'copied_part' names .* not in 'reimplements'"):
        validate(Patch, patch_doc("p", GREEDY, kind="replace", implementation="toy_impl:replacement",
                                  reimplements=[], copied_part={GREEDY: ["return x"]}))

"""A "moved to X" claim is checked against the function's identity (tools/moved_identity.py), never its name:
a same-name definition that already existed at the pin, or whose body is another, is not the target's new home.
Real releases from the wheel cache (skipped without them) and toy trees for the rule itself."""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.moved_identity import SIMILARITY, confirm_moves, similarity
from vllm_patchkit.tools.releases import ReleaseError, open_release
from vllm_patchkit.upstream.findings import BreakageKind as K
from vllm_patchkit.upstream.missing import Missing

from tests.contracts.helpers import patch_doc, release, write_tree

V1 = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def _open(v):
    try:
        return open_release(v)
    except ReleaseError as exc:
        pytest.skip(f"vLLM {v} cannot be read here ({exc})")


def _checked(before, after, target, pinned_on="same", with_digest=False):
    patch = validate(Patch, patch_doc("p", target), strict=False)
    pins = {target: before.lookup(target, with_digest)}
    return examine(after, patch, pins, before if pinned_on == "same" else pinned_on)[1]


@pytest.mark.parametrize("name", ["get_kv_cache_configs", "get_kv_cache_groups", "_pool_bytes_per_block"])
def test_the_real_moves_of_0_33_are_still_found(name):
    """0.33.0 moved the KV planning functions from kv_cache_utils to kv_cache_planning (bodies and signatures
    changed on the way: _pool_bytes_per_block gained a leading vllm_config)."""
    found = _checked(_open("0.31.0"), _open("0.33.0"), f"vllm.v1.core.kv_cache_utils:{name}")
    moved = [b for b in found if b.kind is K.target_moved]
    assert [b.new for b in moved] == [f"vllm.v1.core.kv_cache_planning:{name}"], [b.explain() for b in found]


@pytest.mark.parametrize("method", ["_dummy_run", "execute_model", "load_model", "profile_cudagraph_memory"])
def test_a_v1_runner_method_is_not_moved_to_the_v2_method_of_the_same_name(method):
    """0.34.0 deleted the V1 runner; the V2 runner's same-name methods were already there at 0.31.0."""
    found = _checked(_open("0.31.0"), _open("0.34.0"), f"{V1}.{method}")
    assert not [b for b in found if b.kind is K.target_moved], [b.explain() for b in found]
    [gone] = [b for b in found if b.kind is K.target_removed]
    assert gone.breaking
    assert f"not moved to the same-name vllm.v1.worker.gpu.model_runner:GPUModelRunner.{method} " \
           "(it already existed at vLLM 0.31.0)" in gone.explain()


def test_without_the_pinned_source_a_digest_decides():
    """The pinned release's source not at hand: (b) alone. The V2 profile_cudagraph_memory has the V1 signature,
    but a pinned source digest tells the bodies apart."""
    found = _checked(_open("0.31.0"), _open("0.34.0"), f"{V1}.profile_cudagraph_memory", pinned_on=None,
                     with_digest=True)
    assert not [b for b in found if b.kind is K.target_moved], [b.explain() for b in found]
    assert "its source digest differs from the pinned one" in found[0].explain()


BODY = "    total = 0\n    for s in specs:\n        total += s.size * s.count\n    return total\n"


@pytest.mark.parametrize("after, moved", [
    ({"toy/core/planning.py": "def sizes(cfg, specs, groups):\n" + BODY}, True),   # moved, a parameter gained
    ({"toy/core/planning.py": "def sizes(specs):\n" + BODY}, False),              # a pinned parameter lost
    ({"toy/core/planning.py": "def sizes(cfg, specs):\n    return cfg.launch(specs, now=True)\n"}, False),  # another body
])
def test_the_rule(tmp_path, after, moved):
    before = release(write_tree(tmp_path / "b", {"toy/core/utils.py": "def sizes(cfg, specs):\n" + BODY,
                                                 "toy/core/planning.py": "X = 1\n"}), "1.0.0")
    now = release(write_tree(tmp_path / "a", {"toy/core/utils.py": "X = 1\n", **after}), "2.0.0")
    found = _checked(before, now, "toy.core.utils:sizes")
    assert [b.kind for b in found][:1] == [K.target_moved if moved else K.target_removed], [b.explain() for b in found]


def test_a_same_name_that_existed_at_the_pin_is_not_a_home(tmp_path):
    same = "class Runner:\n    def step(self, batch):\n        return batch\n"
    before = release(write_tree(tmp_path / "b", {"toy/runner.py": same, "toy/v2/runner.py": same}), "1.0.0")
    now = release(write_tree(tmp_path / "a", {"toy/v2/runner.py": same, "toy/other.py": "X = 1\n"}), "2.0.0")
    got = now.lookup("toy.runner:Runner.step")
    assert isinstance(got, Missing) and got.moved_to == ("toy.v2.runner:Runner.step",)  # the name search
    confirmed = confirm_moves(now, before, "toy.runner:Runner.step", before.lookup("toy.runner:Runner.step"), got)
    assert confirmed.moved_to == () and "it already existed at vLLM 1.0.0" in confirmed.reason
    # the same pin without the old release's source: identical body cannot be compared, the signature decides
    # and the claim says so
    weak = confirm_moves(now, None, "toy.runner:Runner.step", before.lookup("toy.runner:Runner.step"), got)
    assert weak.moved_to == ("toy.v2.runner:Runner.step",) and "identity by signature alone" in weak.reason


def test_similarity_is_a_ratio_of_the_bodies(tmp_path):
    import ast
    a, b = (ast.parse(f"def f(x):\n{body}").body[0] for body in (BODY, BODY.replace("count", "n")))
    assert similarity(a, a) == 1.0 and SIMILARITY < similarity(a, b) < 1.0

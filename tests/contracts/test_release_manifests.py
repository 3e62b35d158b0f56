"""The shipped manifests for 0.32.0 and 0.33.0, and the static check of the real wheels.

The manifest rules need no wheel. The wheel tests read vLLM's real wheels and
skip unless they are in $VLLM_PATCHKIT_WHEEL_CACHE (scripts/fetch_wheels.sh).
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.manifest_files import read_manifests
from vllm_patchkit.upstream.sigdiff import diff_signatures
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set, manifest_dirs
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease

from .helpers import cached_wheel_or_skip

PATCH_SET = load_patch_set(installed_sources())
MANIFESTS, PATHS = read_manifests(manifest_dirs(installed_sources()), PATCH_SET)  # every set's, merged


def test_there_are_manifests_for_the_three_releases():
    assert {"0.31.0", "0.32.0", "0.33.0"} <= set(MANIFESTS)


@pytest.mark.parametrize("version", sorted(MANIFESTS, key=Version))
def test_every_patch_is_listed_or_not_applicable(version):
    m = MANIFESTS[version]
    listed = [e.patch.split("@")[0] for e in m.patches]
    na = [n.patch for n in m.not_applicable]
    assert not set(listed) & set(na)
    assert sorted(listed + na) == sorted({p.id for p in PATCH_SET.patches.values()})


@pytest.mark.parametrize("version", [v for v in sorted(MANIFESTS, key=Version) if v != "0.31.0"])
def test_a_version_listed_again_differs_only_compatibly(version):
    """A patch version is listed again on a later release only when every difference from its earlier pins
    is compatible for that patch (what `pin` carries forward), never a breaking one."""
    from vllm_patchkit.upstream.compat import judge_all
    from vllm_patchkit.upstream.sigdiff import compare

    older = [v for v in MANIFESTS if Version(v) < Version(version)]
    for entry in MANIFESTS[version].patches:
        patch = PATCH_SET.patches[entry.patch]
        for v in older:
            prev = next((e for e in MANIFESTS[v].patches if e.patch == entry.patch), None)
            if prev is None:
                continue
            assert set(prev.targets) == set(entry.targets), (entry.patch, v, version)
            found = [b for spec, pin in prev.targets.items()
                     for b in compare(patch.key, spec, pin, entry.targets[spec])]
            breaking = [f"{b.explain()} ({b.verdict()})" for b in judge_all(patch, found) if b.breaking]
            assert not breaking, (entry.patch, v, version, breaking)


@pytest.mark.parametrize("version", sorted(MANIFESTS, key=Version))
def test_nothing_required_is_left_not_applicable(version):
    """Issue 13: every release the seed pins serves every required patch it needs (a version per release)."""
    required = {p.id for p in PATCH_SET.patches.values() if p.required}
    left = [n for n in MANIFESTS[version].not_applicable if n.patch in required
            and not _runner_gone(n.patch, version)]
    assert not left, left


def _runner_gone(patch_id: str, version: str) -> bool:
    """A required patch may be not applicable only where its `runner` precondition cannot hold: a `runner: v1`
    patch on a release that ships no V1 GPU runner (0.34.0 deleted it), with a required `runner: v2` form of
    the same architectures in the set (the V2 runner's patch) — read from the release's wheel, not assumed."""
    import zipfile

    from tests.contracts.helpers import cached_wheel_or_skip

    patch = next((p for p in PATCH_SET.patches.values() if p.id == patch_id and p.when.runner == "v1"), None)
    if patch is None:
        return False
    names = set(zipfile.ZipFile(cached_wheel_or_skip(version)).namelist())
    if "vllm/v1/worker/gpu_model_runner.py" in names or "vllm/v1/worker/gpu/model_runner.py" not in names:
        return False
    return any(p.required and p.when.runner == "v2" and p.when.architectures == patch.when.architectures
               and p.target and p.target.startswith("vllm.v1.worker.gpu.model_runner:")
               and p.id.startswith(patch_id) for p in PATCH_SET.patches.values())


# -- the real wheels -----------------------------------------------------------------------------
PIN_031 = {  # vLLM 0.31.0's signatures, as pinned from the installed release
    "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block": "(kv_cache_groups)",
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.postprocess_sampled":
        "(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None)",
    "vllm.v1.core.kv_cache_utils:get_kv_cache_configs": "(vllm_config, kv_cache_specs, available_memory)",
}


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_check_of_the_wheel_against_its_own_manifest(version, monkeypatch, capsys):
    """Every pin of the shipped manifest was read from the real release (and still reads the same):
    0 breakages, 0 required patches not applicable, exit 0."""
    import json

    wheel = cached_wheel_or_skip(version)
    monkeypatch.setenv("VLLM_PATCHKIT_WHEEL_CACHE", str(wheel.parent))
    code = main(["check", "--vllm", version, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    # the installed release is read statically from its folder (its own wheel is the same code); any other from
    # its wheel
    assert (f"vLLM {version} (static, {wheel}" in doc["release"]
            or doc["release"].startswith(f"installed vLLM {version} (static"))
    found = {(b["kind"], b["patch"]) for p in doc["patches"] for b in p["breakages"]}
    assert found == set()
    assert doc["counts"]["broken"] == doc["counts"]["not_applicable"] == doc["counts"]["stale"] == 0
    assert code == 0


def test_wheel_032_pool_bytes_per_block_gained_a_parameter():
    rel = StaticRelease.open(cached_wheel_or_skip("0.32.0"))
    spec = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"
    got = rel.lookup(spec)
    assert got == Fingerprint(kind="function", signature="(vllm_config, kv_cache_groups)")
    shift, added = diff_signatures("p@1", spec, PIN_031[spec], got.signature)
    assert shift.explain().endswith("parameter 'vllm_config' inserted at position 0 before 'kv_cache_groups': "
                                    "callers passing it positionally bind it to the wrong parameter")
    assert added.explain().endswith("required parameter 'vllm_config' added (positional-or-keyword, position 0): "
                                    "a call that does not pass it raises TypeError")


def test_wheel_033_kv_cache_sizing_moved_and_engine_core_follows():
    rel = StaticRelease.open(cached_wheel_or_skip("0.33.0"))
    for name in ("get_kv_cache_configs", "_pool_bytes_per_block"):
        got = rel.lookup(f"vllm.v1.core.kv_cache_utils:{name}")
        assert isinstance(got, Missing) and got.moved_to == (f"vllm.v1.core.kv_cache_planning:{name}",)
    assert rel.resolve("vllm.v1.engine.core:get_kv_cache_configs").where == \
        "vllm.v1.core.kv_cache_planning:get_kv_cache_configs"
    sig = rel.lookup("vllm.v1.engine.core:get_kv_cache_configs").signature
    assert [b.parameter for b in diff_signatures("p@1", "x:y", PIN_031["vllm.v1.core.kv_cache_utils:get_kv_cache_configs"], sig)] \
        == ["global_kv_cache_groups"]
    spec = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.postprocess_sampled"
    [b] = diff_signatures("p@1", spec, PIN_031[spec], rel.lookup(spec).signature)
    assert b.kind.value == "optional_parameter_added" and b.parameter == "draft_tokens"


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_pin_from_scratch_regenerates_the_shipped_manifests(version):
    """A new release costs one `pin` run: with the release's own manifests deleted, pinning it from its wheel
    gives back every committed manifest for it byte for byte (the `generated_by` line aside: it names how
    the committed one was read)."""
    from vllm_patchkit.tools.releases import StaticView
    from vllm_patchkit.tools.manifest_files import render, split_by_set
    from vllm_patchkit.tools.pin import pin_release
    from vllm_patchkit.tools.static import StaticRelease as Static

    release = StaticView(Static.open(cached_wheel_or_skip(version)))
    others = {v: m for v, m in MANIFESTS.items() if v != version}
    pinned = pin_release(release, PATCH_SET, others, generated_by="x")
    by_set = split_by_set(pinned.manifest, PATCH_SET)
    folders = {s.name: s.manifests for s in installed_sources()}
    compared = 0
    for name, part in by_set.items():
        path = folders[name] / f"vllm-{version}.yaml"
        want = [line for line in path.read_text().splitlines() if not line.startswith(("generated_by", "  the wheel"))]
        got = [line for line in render(part).splitlines() if not line.startswith("generated_by")]
        assert got[1:] == want[1:], (name, version)  # line 0: the schema path, relative to the folder
        compared += 1
    assert compared == 2  # the framework's `core` set and the seed's `deepseek-v4` set

"""Compatibility is judged per patch: the same upstream change breaks one patch and not another.

Real signatures: vLLM 0.31.0's pins against 0.32.0 and 0.33.0 read from their wheels
(`_determine_batch_execution_and_padding` gained a default for `use_cascade_attn`;
`_pool_bytes_per_block` gained a required first parameter; `postprocess_sampled` gained
`draft_tokens`).
"""

from __future__ import annotations

import pytest
import msgspec


from vllm_patchkit.upstream.findings import Breakage, BreakageKind as K
from vllm_patchkit.upstream.compat import judge
from vllm_patchkit.tools.releases import open_release
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set, manifest_dirs
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.vocabulary import Kind

from .helpers import cached_wheel_or_skip

DISPATCH = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"


@pytest.fixture(scope="module")
def seed():
    sources = installed_sources()
    ps = load_patch_set(sources)
    pins = {v: loaded.manifest for v, loaded in load_manifests(manifest_dirs(sources), ps).items()}
    return ps, pins


def _entry(manifest, pid):
    return next(e for e in manifest.patches if e.patch.split("@")[0] == pid)


def _release(version):
    return open_release(version, str(cached_wheel_or_skip(version)))


def test_dispatch_override_survives_a_new_default(seed):
    ps, pins = seed
    patch = ps.patches["batch-dispatch-override@1"]
    _, found = examine(_release("0.32.0"), patch, dict(_entry(pins["0.31.0"], "batch-dispatch-override").targets))
    assert [b.kind for b in found] == [K.parameter_now_optional]
    assert found[0].parameter == "use_cascade_attn" and found[0].breaking is False
    assert "reads only" in found[0].compat and "force_uniform_decode" in found[0].compat


def test_the_same_change_breaks_a_patch_that_reads_the_parameter(seed):
    ps, pins = seed
    patch = ps.patches["batch-dispatch-override@1"]
    reads_it = msgspec.structs.replace(patch, params=[*patch.params, "use_cascade_attn"])
    _, found = examine(_release("0.32.0"), reads_it, dict(_entry(pins["0.31.0"], "batch-dispatch-override").targets))
    assert [(b.kind, b.breaking) for b in found] == [(K.parameter_now_optional, True)]
    assert "'use_cascade_attn'" in found[0].compat


def test_a_replace_does_not_survive_it(seed):
    ps, _ = seed
    patch = msgspec.structs.replace(ps.patches["batch-dispatch-override@1"], kind=Kind.replace, params=[],
                                    implementation="x.y:z")
    b = Breakage(K.parameter_now_optional, patch.key, DISPATCH, parameter="use_cascade_attn", new="False")
    assert judge(patch, b).breaking is True


def test_passthrough_survives_an_added_required_parameter(seed):
    ps, pins = seed
    patch = ps.patches["pool-bytes-passthrough@1"]
    _, found = examine(_release("0.32.0"), patch, dict(_entry(pins["0.31.0"], "pool-bytes-passthrough").targets))
    assert {b.kind for b in found} == {K.required_parameter_added, K.positional_shift}
    assert all(not b.breaking and "verbatim passthrough" in b.compat for b in found)


def test_a_moved_target_breaks_every_patch(seed):
    ps, pins = seed
    patch = ps.patches["pool-bytes-passthrough@1"]
    _, found = examine(_release("0.33.0"), patch, dict(_entry(pins["0.31.0"], "pool-bytes-passthrough").targets))
    moved = [b for b in found if b.kind is K.target_moved]
    assert moved and all(b.breaking for b in moved)


def test_a_used_callable_that_changed_breaks_the_patch(seed):
    ps, _ = seed
    patch = ps.patches["kv-config-hook@1"]
    used = patch.uses[0]
    b = Breakage(K.positional_shift, patch.key, used, parameter="builder", old=("vllm_config",), new=("builder",))
    assert judge(patch, b).breaking is True and "calls this upstream callable" in judge(patch, b).compat


def test_a_used_callable_gaining_a_trailing_optional_parameter_keeps_its_callers(seed):
    """Regression (vLLM 0.34.0, `_auto_fit_max_model_len` gained `after_warmup=False` at the end): a caller that
    does not pass a new defaulted parameter is unaffected; only a required one, or one inserted in front
    (reported as positional_shift), breaks it."""
    ps, _ = seed
    patch = ps.patches["kv-config-hook@2"]
    used = next(u for u in patch.uses if u.endswith("_auto_fit_max_model_len"))
    added = Breakage(K.optional_parameter_added, patch.key, used, parameter="after_warmup", new="after_warmup=False")
    assert judge(patch, added).breaking is False and "shifts no positional argument" in judge(patch, added).compat
    required = Breakage(K.required_parameter_added, patch.key, used, parameter="after_warmup", new="after_warmup")
    assert judge(patch, required).breaking is True


def test_kv_config_hook_on_vllm_034_is_compatible_with_after_warmup(seed):
    ps, pins = seed
    patch = ps.patches["kv-config-hook@2"]
    _, found = examine(_release("0.34.0"), patch, dict(_entry(pins["0.33.0"], "kv-config-hook").targets))
    added = [b for b in found if b.kind is K.optional_parameter_added and b.parameter == "after_warmup"]
    assert added and not added[0].breaking


def test_check_reports_compatible_drift_as_carry_with_exit_zero(seed):
    from vllm_patchkit.tools.check import check

    ps, pins = seed
    only = type(ps)({k: v for k, v in ps.patches.items() if k == "batch-dispatch-override@1"},
                    {k: v for k, v in ps.files.items() if k == "batch-dispatch-override@1"})
    report = check(_release("0.32.0"), only, {"0.31.0": pins["0.31.0"]})
    assert [r.status for r in report.results] == ["compatible"] and report.exit_code() == 0
    # the same drift against the release's own (stale) manifest fails: the loader compares pins exactly
    stale = msgspec.structs.replace(pins["0.31.0"], vllm="0.32.0")
    report = check(_release("0.32.0"), only, {"0.32.0": stale})
    assert [r.status for r in report.results] == ["stale"] and report.exit_code() == 1


def test_a_proxy_replace_is_judged_by_its_own_signature(seed, tmp_path, monkeypatch):
    """A replace whose implementation forwards what it does not name (a proxy) takes an added optional parameter
    through **kwargs (before: breaking, "a replace ... must take the new signature"); read from its source,
    never imported (the module aborts on import)."""
    (tmp_path / "proxy_impl.py").write_text("import os\nos.abort()\n\n"
                                            "def proxy(self, batch, **kwargs):\n    ...\n\n"
                                            "def strict(self, batch, num_tokens=None):\n    ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ps, _ = seed
    base = ps.patches["batch-dispatch-override@1"]
    b = Breakage(K.optional_parameter_added, base.key, DISPATCH, parameter="use_cascade_attn", new="keyword-only")
    proxy = msgspec.structs.replace(base, kind=Kind.replace, params=[], implementation="proxy_impl:proxy")
    j = judge(proxy, b)
    assert j.breaking is False and "takes **kwargs" in j.compat and "proxy_impl:proxy(self, batch, **kwargs)" in j.compat
    strict = msgspec.structs.replace(base, kind=Kind.replace, params=[], implementation="proxy_impl:strict")
    assert judge(strict, b).breaking is True
    moved = Breakage(K.default_changed, base.key, DISPATCH, parameter="batch", old="1", new="2")
    assert judge(proxy, moved).breaking is True and "names 'batch'" in judge(proxy, moved).compat

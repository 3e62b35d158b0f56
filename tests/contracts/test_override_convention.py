"""A subclass override that does not accept a parameter vLLM passes to the base method: `check` says so on the
release it reads, in the loader's words (one verdict). The real case: value-steer's V1 runner overrides
`GPUModelRunner.initialize_kv_cache(self, kv_cache_config)`; vLLM 0.31.0 calls
`self.initialize_kv_cache(minimal_config, is_profiling=True)` (its profiling run), which raises TypeError there.
Before, the loader refused it and `check` said nothing (tests/contracts/test_one_verdict.py failed on it)."""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import installed_static, installed_version
from vllm_patchkit.upstream.findings import BreakageKind
from vllm_patchkit.upstream.missing import Missing

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="read against vLLM 0.31.0")


def test_an_override_rejecting_a_base_parameter_is_a_convention_mismatch_for_check_and_loader():
    pytest.importorskip("vllm")
    from tests.corpus.catalogue import load
    from vllm_patchkit.runtime import subclass
    from vllm_patchkit.upstream.targets import resolve

    cat = load("value_steer")
    patch = cat.patch(next(p for p in cat.places if p.id == "vfd-runner"))
    found, said = examine(installed_static(), patch, None)
    [b] = [b for b in said if b.kind is BreakageKind.convention_mismatch]
    assert b.target.endswith("GPUModelRunner.initialize_kv_cache") and b.breaking
    assert "does not accept parameter 'is_profiling'" in b.detail
    entry = ManifestEntry(patch=patch.key, targets={k: v for k, v in found.items() if not isinstance(v, Missing)})
    _, bad = subclass.check(patch, entry, resolve(patch.target))
    assert bad.code == "convention" and bad.reason == b.detail

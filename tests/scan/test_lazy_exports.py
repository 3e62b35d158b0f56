"""`scan` on a plugin that patches vLLM through its lazy top-level exports (`vllm.LLM`, `vllm.SamplingParams`,
served by vllm/__init__.py's `__getattr__`): the sites are placed, not "missing", and every drafted target resolves
on the installed vLLM 0.31.0 both statically (what pin and check read) and live (what the loader reads)."""

from __future__ import annotations

import pytest
import yaml

from vllm_patchkit.tools.releases import installed_version
from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import write
from vllm_patchkit.tools.static import Definition
from vllm_patchkit.upstream.targets import resolve

from .conftest import write_plugin

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="written against the installed vLLM 0.31.0")

PLUGIN = {
    "lazyuser/__init__.py": """\
        import vllm
        from vllm import LLM

        _generate = LLM.generate


        def _counted_generate(self, *args, **kwargs):
            return _generate(self, *args, **kwargs)


        def _clone(self):
            return self


        def register():
            LLM.generate = _counted_generate
            vllm.SamplingParams.clone = _clone
        """,
}
DEFINED = {"vllm:LLM.generate": "vllm.entrypoints.llm:LLM.generate",
           "vllm:SamplingParams.clone": "vllm.sampling_params:SamplingParams.clone"}


def test_sites_through_lazy_exports_are_placed_and_their_drafts_resolve(tmp_path, upstream):
    result = scan(str(write_plugin(tmp_path / "src", PLUGIN)), upstream=upstream)
    sites = {s.target: s for s in result.sites}
    assert set(sites) == set(DEFINED), sites
    for target, defined in DEFINED.items():
        assert sites[target].defined_at == defined
        assert "missing" not in sites[target].facts, sites[target].facts  # was: module 'vllm' has no attribute
    folder, written, rejected = write(result, tmp_path / "drafts")
    assert not rejected
    drafted = [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]
    assert {d["target"] for d in drafted} == set(DEFINED)
    import vllm.entrypoints.llm
    import vllm.sampling_params

    owners = {"vllm:LLM.generate": vllm.entrypoints.llm.LLM, "vllm:SamplingParams.clone": vllm.sampling_params.SamplingParams}
    for d in drafted:
        static = upstream.resolve(d["target"])
        assert isinstance(static, Definition) and static.where == DEFINED[d["target"]], static
        assert resolve(d["target"]).owner is owners[d["target"]]

"""The seed set's retirement probes read the real release's source: not retirable on it, retirable on an
edited copy that contains the upstream fix, and an error (never "not retirable") when the code is gone."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import vllm

from patchkit_deepseek_v4 import retirement as r
from tests.contracts.helpers import cached_wheel_or_skip

ROOT = Path(vllm.__file__).resolve().parent.parent


def _copy(tmp_path: Path, rel: str, edit) -> Path:
    dest = tmp_path / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(edit((ROOT / rel).read_text(encoding="utf-8")), encoding="utf-8")
    return tmp_path


def test_not_retirable_on_the_installed_release():
    assert r.uniform_decode_checks_prompts(ROOT) is None
    kept = r.breakable_cudagraph_not_auto_enabled(ROOT)
    assert kept.retirable is False and "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES lists 'DeepseekV4ForCausalLM'" \
        in kept.evidence


def test_uniform_decode_fixed_upstream_is_seen(tmp_path):
    def fix(src: str) -> str:
        head = "    def _is_uniform_decode(\n"
        assert head in src
        return src.replace('        """Checks if it\'s a decode batch', "        num_prompt_tokens = None\n"
                           '        """Checks if it\'s a decode batch', 1)

    root = _copy(tmp_path, r.RUNNER, fix)
    assert "num_prompt_tokens" in r.uniform_decode_checks_prompts(root)


def test_auto_enable_dropped_for_v4_upstream_is_seen(tmp_path):
    """The fix upstream: vLLM's default-architecture set no longer lists the plugin's architectures."""
    def drop(src: str) -> str:
        for arch in r.PLUGIN_ARCHS:
            assert f'"{arch}",' in src
            src = src.replace(f'"{arch}",', "")
        return src

    root = _copy(tmp_path, r.CONFIG, drop)
    answer = r.breakable_cudagraph_not_auto_enabled(root)
    assert answer.retirable is True and "no longer auto-enables" in answer.evidence


def test_the_environ_write_gone_is_no_evidence(tmp_path):
    """Regression (vLLM 0.34.0): the decision moved from `os.environ[...] = "1"` into
    `compilation_config.use_breakable_cudagraph`; the probe said "retirable" because the write was gone."""
    def drop(src: str) -> str:
        line = 'os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"'
        assert line in src
        return src.replace(line, "self.compilation_config.use_breakable_cudagraph = True")

    root = _copy(tmp_path, r.CONFIG, drop)
    assert r.breakable_cudagraph_not_auto_enabled(root).retirable is False


def test_decision_not_found_is_an_error(tmp_path):
    def drop(src: str) -> str:
        assert "self._uses_breakable_cudagraph_by_default()" in src
        return src.replace("self._uses_breakable_cudagraph_by_default()", "False")

    root = _copy(tmp_path, r.CONFIG, drop)
    with pytest.raises(LookupError, match="probe must be updated"):
        r.breakable_cudagraph_not_auto_enabled(root)


def test_vllm_034_still_auto_enables_v4():
    root = zipfile.Path(cached_wheel_or_skip("0.34.0"))
    kept = r.breakable_cudagraph_not_auto_enabled(root)
    assert kept.retirable is False
    assert kept.evidence.startswith("vllm/config/vllm.py:105: DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES lists")


def test_code_gone_is_an_error_not_a_silent_no(tmp_path):
    (tmp_path / "vllm/v1/worker").mkdir(parents=True)
    (tmp_path / r.RUNNER).write_text("class GPUModelRunner:\n    pass\n")
    with pytest.raises(LookupError, match="_is_uniform_decode not found"):
        r.uniform_decode_checks_prompts(tmp_path)


def test_reads_a_wheel_without_installing_it():
    root = zipfile.Path(cached_wheel_or_skip("0.33.0"))
    assert r.uniform_decode_checks_prompts(root) is None
    assert r.breakable_cudagraph_not_auto_enabled(root).retirable is False

"""A key a plugin sets on one of vLLM's mappings is drafted `kind: register` (issue 31, item 4), and the reviewed
draft pins as written. The construct is ROCm/ATOM's (its GLM-5 convertor registered in
MODEL_ARCH_CONFIG_CONVERTORS), written here in our own words against the installed vLLM read statically: `adds:
true` where the release does not register the key, nothing where it does (the plugin then replaces vLLM's entry).
"""

from __future__ import annotations

import yaml

from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import write

from .conftest import review_and_pin, write_plugin

REGISTRY = "vllm.transformers_utils.model_arch_config_convertor:MODEL_ARCH_CONFIG_CONVERTORS"
PLUGIN = '''
from vllm.transformers_utils.model_arch_config_convertor import (
    MODEL_ARCH_CONFIG_CONVERTORS, ModelArchConfigConvertorBase)


class Glm5Convertor(ModelArchConfigConvertorBase):
    pass


def register():
    MODEL_ARCH_CONFIG_CONVERTORS["myplug_glm5"] = Glm5Convertor
    MODEL_ARCH_CONFIG_CONVERTORS["deepseek_v4"] = Glm5Convertor
'''


def _drafts(tmp_path, upstream):
    write_plugin(tmp_path / "src", {"myplug/__init__.py": PLUGIN})
    folder, _, rejected = write(scan(str(tmp_path / "src"), upstream=upstream), tmp_path / "out")
    assert not rejected
    return folder, {d["entry"]: d for d in (yaml.safe_load(y.read_text()) for y in folder.glob("*.yaml"))}


def test_a_key_set_on_a_vllm_mapping_is_drafted_register(tmp_path, upstream):
    _, docs = _drafts(tmp_path, upstream)
    assert set(docs) == {"myplug_glm5", "deepseek_v4"}
    new, replaced = docs["myplug_glm5"], docs["deepseek_v4"]
    for d in (new, replaced):
        assert d["kind"] == "register" and d["target"] == REGISTRY
        assert d["value_from"] == "myplug:Glm5Convertor"
    assert new["adds"] is True  # no release registers it
    assert "adds" not in replaced  # vLLM registers deepseek_v4 itself: the plugin replaces its entry


def test_reviewed_register_drafts_pin_as_written(tmp_path, upstream):
    folder, _ = _drafts(tmp_path, upstream)
    out = review_and_pin(folder, tmp_path / "out")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 patch(es) listed, 0 not applicable" in out.stdout
    [manifest] = (folder / "manifests").glob("*.yaml")
    entries = {e["patch"].split("@")[0]: e for e in yaml.safe_load(manifest.read_text())["patches"]}
    present = sorted(e["targets"][REGISTRY]["entry_present"] for e in entries.values())
    assert present == [False, True]

"""Drafts that name the place and kind the loader accepts, found on the registry run (issue 31) and built here from
the constructs, not the plugins' code, against the installed vLLM (0.31.0's real classes) read statically:

- a method of a class reached through a package that re-exports it (`vllm.config.VllmConfig`, defined in
  `vllm.config.vllm`; hotwire-vllm, mimo-asr-vllm): drafted at the class's defining module, without `copies` (the
  class object is one; `pin` refused the package's place and advised `copies`, which a class member never needs);
- a class's place set to a plugin object (a factory function, a class built from the original, a closure;
  duplexjev-vllm, sabi-mla-vllm): a `set` of that place (`value_from`), never a `wrap`/`replace` of a class;
- a module of another release (`vllm.model_executor.models.qwen2_eagle`; vllm-hust-vspec, raif-vllm,
  turboquant-plus-vllm, vllm-hi): named as the module, `qwen2_eagle:Qwen2Model.load_weights` was no qualname.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import write

from .conftest import write_plugin

PLUGIN = '''
from vllm.config import VllmConfig
from vllm.model_executor.models import qwen3_5 as Q
from vllm.model_executor.models import ultravox as U

_orig_hash = VllmConfig.compute_hash


def _hash(self):
    return _orig_hash(self) + "-myplug"


def _make_tower(*, vllm_config, prefix=""):
    return None


def _layer_class(base):
    class Layer(base):
        pass

    return Layer


def register():
    VllmConfig.compute_hash = _hash


def build():
    orig = U.UltravoxWhisperEncoder
    U.UltravoxWhisperEncoder = _make_tower
    original = Q.Qwen3_5DecoderLayer
    Q.Qwen3_5DecoderLayer = _layer_class(original)

    def factory(config, **kwargs):
        return _make_tower(vllm_config=config)

    Q.Qwen3NextAttention = factory
'''

GONE = '''
def register():
    from vllm.model_executor.models.qwen2_eagle import Qwen2Model

    original = Qwen2Model.load_weights

    def load_weights(self, weights):
        return original(self, weights)

    Qwen2Model.load_weights = load_weights
'''


@pytest.fixture()
def on_031(upstream):
    if upstream.version() != "0.31.0":
        pytest.skip("written against vLLM 0.31.0's classes")
    return upstream


def _drafts(tmp_path, upstream, source: str):
    write_plugin(tmp_path / "src", {"myplug/__init__.py": source})
    result = scan(str(tmp_path / "src"), upstream=upstream)
    folder, _, rejected = write(result, tmp_path / "out")
    assert not rejected
    return result, folder, {d["target"]: d for d in (yaml.safe_load(y.read_text()) for y in folder.glob("*.yaml"))}


def test_a_method_of_a_re_exported_class_is_drafted_at_the_class_module(tmp_path, on_031):
    _, _, docs = _drafts(tmp_path, on_031, PLUGIN)
    assert "vllm.config:VllmConfig.compute_hash" not in docs
    doc = docs["vllm.config.vllm:VllmConfig.compute_hash"]
    assert doc["kind"] == "wrap" and "copies" not in doc


def test_a_class_in_place_is_a_set_of_that_place(tmp_path, on_031):
    _, _, docs = _drafts(tmp_path, on_031, PLUGIN)
    tower = docs["vllm.model_executor.models.ultravox:UltravoxWhisperEncoder"]
    assert (tower["kind"], tower["value_from"]) == ("set", "myplug:_make_tower")
    layer = docs["vllm.model_executor.models.qwen3_5:Qwen3_5DecoderLayer"]
    assert (layer["kind"], layer["value_from"]) == ("set", "TODO.module:PluginClass")  # built at run time
    # held by value in qwen3_5 (defined in qwen3_next): the plugin swaps the one place it names, no `copies`
    attention = docs["vllm.model_executor.models.qwen3_5:Qwen3NextAttention"]
    assert (attention["kind"], attention["value_from"]) == ("set", "TODO.module:PluginClass")
    assert "copies" not in attention


def test_the_reviewed_drafts_fit_their_places(tmp_path, on_031):
    """`pin --dry-run` on the drafts a person reviewed (the marker and the TODO text only): none is refused for
    its place or its kind."""
    _, folder, docs = _drafts(tmp_path, on_031, PLUGIN)
    for path in folder.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if str(doc.get("value_from", "")).startswith("TODO"):
            path.unlink()  # the reviewer writes that class: not the place's question
            continue
        del doc["draft"]
        doc.update(why="needed", upstream="none: plugin behaviour", retire_when={"manual": "when vLLM does it"})
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "pin", "--dry-run", "--patch-dir",
                          str(folder), "--manifest-dir", str(folder / "manifests")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path / 'out'}{os.pathsep}{tmp_path / 'src'}"},
                         timeout=600)
    assert "does not fit the place" not in out.stderr, out.stderr[-2000:]
    assert "is a class" not in out.stderr, out.stderr[-2000:]
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_module_the_release_lacks_is_named_as_a_module(tmp_path, on_031):
    result, _, docs = _drafts(tmp_path, on_031, GONE)
    assert list(docs) == ["vllm.model_executor.models.qwen2_eagle:Qwen2Model.load_weights"]
    site = next(s for s in result.sites if s.mechanism == "wrap")
    assert "module 'vllm.model_executor.models.qwen2_eagle' is not in this release" in "; ".join(site.notes)


def test_a_name_the_module_lacks_stays_an_attribute_of_it(upstream):
    """Only a lowercase name followed by more is read as a module: a function or a class the module lacks is its
    attribute, as before."""
    assert upstream.place("vllm.envs.VLLM_NO_SUCH_FLAG") == "vllm.envs:VLLM_NO_SUCH_FLAG"
    assert upstream.place("vllm.config.NoSuchConfig.field") == "vllm.config:NoSuchConfig.field"
    assert upstream.place("vllm.config.VllmConfig.compute_hash") == "vllm.config:VllmConfig.compute_hash"

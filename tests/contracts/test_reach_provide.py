"""A class swapped in by a `set` owes vLLM's inherited methods the attributes they read on its objects (issue 30).

The plugin's class subclasses vLLM 0.31.0's real `LlamaForCausalLM` and builds its state itself (it calls
`nn.Module.__init__`, not Llama's), so it inherits `compute_logits`, which reads `self.logits_processor`. The
release checked is a copy of the installed 0.31.0 tree in which `LlamaForCausalLM`'s own `self.logits_processor` is
renamed (its assignment and its readers in the class, nothing else): the plugin's class still sets the old name.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.contracts.test_reach import _variant, base_tree  # noqa: F401  (the fixture)
from tests.framework.helpers import patch_doc
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.releases import installed_version

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="the trees are copies of vLLM 0.31.0")
LLAMA = "vllm/model_executor/models/llama.py"
TARGET = "vllm.model_executor.models.llama:LlamaForCausalLM"
PLUGIN_CLASS = textwrap.dedent("""\
    from torch import nn

    from vllm.model_executor.models.llama import LlamaForCausalLM


    class SelfBuiltLlama(LlamaForCausalLM):
        \"\"\"Builds its own state; keeps vLLM's compute_logits and load_weights.\"\"\"

        def __init__(self, *, vllm_config, prefix=""):
            nn.Module.__init__(self)
            self.config = vllm_config.model_config.hf_config
            self.model = self._init_model(vllm_config=vllm_config, prefix=prefix)
            self.lm_head = build_head(self.config)
            self.logits_processor = build_logits(self.config)
            self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors


    def build_head(config):
        return None


    def build_logits(config):
        return None
    """)


def _renamed_in_class(text: str, cls: str, old: str, new: str) -> str:
    lines = text.splitlines(keepends=True)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls)
    for i in range(node.lineno - 1, node.end_lineno):
        lines[i] = re.sub(rf"\bself\.{old}\b", f"self.{new}", lines[i])
    return "".join(lines)


@pytest.fixture
def swapped_set(tmp_path, monkeypatch):
    """A patch set with one `set` of LlamaForCausalLM to the plugin's class (importable from tmp_path)."""
    pkg = tmp_path / "src" / "selfbuilt_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(PLUGIN_CLASS)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir(), mdir.mkdir()
    doc = patch_doc(id="swap-llama", kind="set", target=TARGET, value_from="selfbuilt_plugin.models:SelfBuiltLlama",
                    processes=["worker"])
    (pdir / "swap-llama.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return pdir, mdir


def _compute_logits_line(tree: Path, name: str) -> int:
    text = (tree / LLAMA).read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "LlamaForCausalLM")
    fn = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "compute_logits")
    return next(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr == name)


def test_pin_records_what_vllm_reads_and_check_names_the_renamed_attribute(base_tree, swapped_set, tmp_path, capsys):
    pdir, mdir = swapped_set
    dirs = ["--patch-dir", str(pdir), "--manifest-dir", str(mdir)]
    assert main(["pin", "--source", str(base_tree), "--vllm", "0.31.0", *dirs]) == 0, capsys.readouterr()
    reach = yaml.safe_load((mdir / "vllm-0.31.0.yaml").read_text())["patches"][0]["reach"]
    owed = {k for k, v in reach.items() if v["kind"] == "provide"}
    assert f"{TARGET}.logits_processor" in owed and f"{TARGET}.lm_head" in owed, reach
    assert main(["check", "--source", str(base_tree), "--vllm", "0.31.0", *dirs]) == 0
    capsys.readouterr()

    renamed = _renamed_in_class((base_tree / LLAMA).read_text(), "LlamaForCausalLM", "logits_processor",
                                "logits_proc")
    tree = _variant(base_tree, tmp_path / "renamed", {LLAMA: renamed})
    assert main(["check", "--source", str(tree), "--vllm", "0.31.0", *dirs]) == 1
    out = capsys.readouterr().out
    line = _compute_logits_line(tree, "logits_proc")
    assert "BROKEN    swap-llama@1" in out, out
    assert (f"[reach_missing] {TARGET}.logits_proc: swap-llama@1 swaps selfbuilt_plugin.models:SelfBuiltLlama in for "
            f"LlamaForCausalLM; vLLM 0.31.0's LlamaForCausalLM.compute_logits at {LLAMA}:{line} reads "
            "self.logits_proc on its objects, which SelfBuiltLlama does not set") in out, out


def test_a_class_that_calls_the_base_init_owes_nothing(base_tree, swapped_set, tmp_path, capsys):
    pdir, mdir = swapped_set
    module = Path(__import__("selfbuilt_plugin.models", fromlist=["x"]).__file__)
    module.write_text(PLUGIN_CLASS.replace("nn.Module.__init__(self)", "super().__init__(vllm_config=vllm_config)"))
    dirs = ["--patch-dir", str(pdir), "--manifest-dir", str(mdir)]
    assert main(["pin", "--source", str(base_tree), "--vllm", "0.31.0", *dirs]) == 0
    renamed = _renamed_in_class((base_tree / LLAMA).read_text(), "LlamaForCausalLM", "logits_processor",
                                "logits_proc")
    tree = _variant(base_tree, tmp_path / "renamed", {LLAMA: renamed})
    capsys.readouterr()
    assert main(["check", "--source", str(tree), "--vllm", "0.31.0", *dirs]) == 0, capsys.readouterr().out

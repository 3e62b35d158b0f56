"""`kind: set` + `inherited_from`: a class attribute that one subclass only inherits, overridden on that subclass
alone (issue 20 item 6). The real case: ROCm/ATOM sets `HarmonyParser.reasoning_parser_cls` and
`HarmonyParser.tool_parser_cls` (register.py, `_patch_vllm_harmony_parser_manager`: its get_parser wrapper's
fallback path; tests/corpus/atom atom-088), which HarmonyParser inherits from `Parser` (vllm.parser.abstract_parser)
through `DelegatingParser`. On the installed release's real classes (0.31.0 or 0.32.0).

What is pinned: the subclass as not defining the attribute (`kind: absent`) and the base's attribute as any class
attribute (its value digest). The loader sets it in the subclass's own `__dict__`; unpatch deletes it (the
subclass inherits again). A subclass that defines the attribute itself, or a base other than the declared one
that the MRO finds, is refused by the loader and `check` in the same words (misdeclared.py)."""

from __future__ import annotations

import pytest

from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import installed_static
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.runtime.verify import verify
from vllm_patchkit.tools.manifest_files import dump_fingerprint
from vllm_patchkit.declaration.validation import validate

from .helpers import make_loader, patch_doc

pytestmark = pytest.mark.usefixtures("undo_every_loader")

TOOL = "vllm.parser.harmony:HarmonyParser.tool_parser_cls"
REASONING = "vllm.parser.harmony:HarmonyParser.reasoning_parser_cls"
PARSER = "vllm.parser.abstract_parser:Parser"
GPTOSS_TOOLS = "vllm.tool_parsers.gptoss_tool_parser:GptOssToolParser"
GPTOSS_REASONING = "vllm.reasoning.gptoss_reasoning_parser:GptOssReasoningParser"
STRUCTURAL = "vllm.tool_parsers.abstract_tool_parser:ToolParser.structural_tag_model"
# ToolParser subclasses that only inherit structural_tag_model: Step3p5ToolParser on 0.31.0 (0.32.0 defines it
# there itself, the change the refusal test below re-enacts at run time), Step3ToolParser on 0.31.0 and 0.32.0
INHERITING = ("vllm.tool_parsers.step3p5_tool_parser:Step3p5ToolParser",
              "vllm.tool_parsers.step3_tool_parser:Step3ToolParser")


def _inheriting_parser() -> str:
    """The first of INHERITING that inherits ToolParser.structural_tag_model on the installed release (read
    statically, as check and pin read it); the loader tests run against that release."""
    static = installed_static()
    for cls in INHERITING:
        got = static.lookup(f"{cls}.structural_tag_model")
        if isinstance(got, Missing) and got.inherited_from == STRUCTURAL:
            return cls
    pytest.skip(f"on the installed vLLM {static.version()} none of {', '.join(INHERITING)} inherits "
                f"{STRUCTURAL} (each defines structural_tag_model itself)")


def _doc(pid: str, target: str, inherited_from: str, **extra) -> dict:
    return patch_doc(id=pid, kind="set", target=target, inherited_from=inherited_from, processes=["frontend"], **extra)


def _pins(doc: dict) -> dict:
    patch = validate(Patch, doc)
    found, broken = examine(installed_static(), patch, None)
    assert not broken, [b.explain() for b in broken]
    return {s: dump_fingerprint(f) for s, f in found.items()}


def _loader(tmp_path, *docs: dict, pins: dict = None):
    entries = [{"patch": f"{d['id']}@1", "targets": pins if pins is not None else _pins(d)} for d in docs]
    loader = make_loader(tmp_path, {d["id"]: d for d in docs}, entries)
    loader.run_import_stage()
    return loader


class _Tokenizer:
    def get_vocab(self) -> dict:
        return {}


def test_pinned_as_absent_on_the_subclass_and_the_base_by_value():
    from vllm_patchkit.upstream.source_fingerprint import value_digest

    assert _pins(_doc("tools", TOOL, f"{PARSER}.tool_parser_cls")) == {
        TOOL: {"kind": "absent"},  # HarmonyParser does not define it
        f"{PARSER}.tool_parser_cls": {"kind": "attribute", "value_digest": value_digest(None)}}  # `... = None`


def test_the_subclass_alone_gets_the_value_and_unpatch_restores_inheritance(tmp_path):
    from vllm.parser.abstract_parser import DelegatingParser, Parser
    from vllm.parser.harmony import HarmonyParser
    from vllm.tool_parsers.gptoss_tool_parser import GptOssToolParser

    loader = _loader(tmp_path, _doc("tools", TOOL, f"{PARSER}.tool_parser_cls", value_from=GPTOSS_TOOLS))
    rec = loader.records["tools"]
    assert rec.state == "applied", rec
    assert rec.detail["places"] == [TOOL]
    assert HarmonyParser.__dict__["tool_parser_cls"] is GptOssToolParser
    assert Parser.tool_parser_cls is None and DelegatingParser.tool_parser_cls is None  # the base is untouched
    parser = HarmonyParser(_Tokenizer())  # vLLM's Parser.__init__ reads self.__class__.tool_parser_cls
    assert isinstance(parser.tool_parser, GptOssToolParser)
    loader.unpatch()
    assert "tool_parser_cls" not in HarmonyParser.__dict__  # inherited again
    assert HarmonyParser.tool_parser_cls is None and HarmonyParser(_Tokenizer()).tool_parser is None


def test_atoms_pair_of_harmony_overrides(tmp_path):
    """ATOM's fallback sets reasoning_parser_cls = GptOssReasoningParser and tool_parser_cls = None."""
    from vllm.parser.harmony import HarmonyParser
    from vllm.reasoning.gptoss_reasoning_parser import GptOssReasoningParser

    loader = _loader(tmp_path, _doc("reasoning", REASONING, f"{PARSER}.reasoning_parser_cls",
                                    value_from=GPTOSS_REASONING),
                     _doc("tools", TOOL, f"{PARSER}.tool_parser_cls", value=None))
    assert [loader.records[p].state for p in ("reasoning", "tools")] == ["applied", "applied"]
    assert HarmonyParser.__dict__["reasoning_parser_cls"] is GptOssReasoningParser
    assert "tool_parser_cls" in HarmonyParser.__dict__ and HarmonyParser.__dict__["tool_parser_cls"] is None
    again = _loader(tmp_path / "again", _doc("reasoning", REASONING, f"{PARSER}.reasoning_parser_cls",
                                             value_from=GPTOSS_REASONING))
    assert again.records["reasoning"].detail.get("already")  # an earlier loader of this process set it
    loader.unpatch()
    assert "reasoning_parser_cls" not in HarmonyParser.__dict__ and "tool_parser_cls" not in HarmonyParser.__dict__


def _both(doc: dict, pins: dict):
    """check's breakages (statically, on the installed 0.31.0) and the loader's verdict, for one declaration."""
    patch = validate(Patch, doc)
    _, said = examine(installed_static(), patch, {s: Fingerprint(**f) for s, f in pins.items()})
    return [b for b in said if b.breaking], verify(patch, validate(ManifestEntry, {"patch": patch.key, "targets": pins}))


def test_a_subclass_that_defines_the_attribute_itself_is_refused_alike():
    """Hermes2ProToolParser defines structural_tag_model itself (it is not inherited from ToolParser): declared
    with inherited_from, check and the loader refuse it in the same words, never as "moved"."""
    target = "vllm.tool_parsers.hermes_tool_parser:Hermes2ProToolParser.structural_tag_model"
    doc = _doc("hermes", target, STRUCTURAL, value="x")
    [b], v = _both(doc, {target: {"kind": "absent"}, STRUCTURAL: {"kind": "attribute"}})
    assert b.kind.value == "misdeclared" and b.detail == misdeclared.now_defined(target, STRUCTURAL)
    assert isinstance(v, Finding) and v.code == "target" and v.reason == b.detail


def test_inherited_from_naming_a_base_the_mro_does_not_find_it_at_is_refused_alike():
    wrong = "vllm.parser.abstract_parser:DelegatingParser.tool_parser_cls"
    doc = _doc("tools", TOOL, wrong)
    [b], v = _both(doc, {TOOL: {"kind": "absent"}, wrong: {"kind": "attribute"}})
    assert b.kind.value == "misdeclared"
    assert b.detail == misdeclared.inherited_elsewhere(TOOL, wrong, f"{PARSER}.tool_parser_cls")
    assert isinstance(v, Finding) and v.code == "target" and v.reason == b.detail


def test_the_loader_refuses_when_the_subclass_came_to_define_it_or_the_base_value_changed(monkeypatch):
    """What 0.32.0 does to Step3p5ToolParser (it defines structural_tag_model = "qwen_3_coder" itself:
    tests/contracts/test_set_kinds_check.py), done here at run time by another hand: the loader refuses with the
    words check prints against the 0.32.0 wheel. A changed base value is a fingerprint failure. (On a release
    where Step3p5ToolParser defines it already, the same is done to a parser that still inherits it.)"""
    import importlib

    from vllm.tool_parsers.abstract_tool_parser import ToolParser

    cls_spec = _inheriting_parser()
    module, _, name = cls_spec.partition(":")
    Step3p5ToolParser = getattr(importlib.import_module(module), name)
    target = f"{cls_spec}.structural_tag_model"
    doc = _doc("step3p5", target, STRUCTURAL, value="qwen_3_coder")
    pins = _pins(doc)
    patch = validate(Patch, doc)
    entry = validate(ManifestEntry, {"patch": patch.key, "targets": pins})
    assert not isinstance(verify(patch, entry), Finding)
    monkeypatch.setattr(Step3p5ToolParser, "structural_tag_model", "someone's", raising=False)
    v = verify(patch, entry)
    assert isinstance(v, Finding) and v.code == "target" and v.reason == misdeclared.now_defined(target, STRUCTURAL)
    monkeypatch.delattr(Step3p5ToolParser, "structural_tag_model")
    monkeypatch.setattr(ToolParser, "structural_tag_model", "hermes")
    v = verify(patch, entry)
    assert isinstance(v, Finding) and v.code == "fingerprint"
    [b] = v.breakages
    assert b.kind.value == "value_changed" and b.target == STRUCTURAL and b.breaking


def test_declaration_errors():
    for doc, words in ((dict(kind="set", target="m:C.x", inherited_from="m:B.y"),
                        "'inherited_from' must name the same attribute on a base class (module:Base.x)"),
                       (dict(kind="wrap", target="m:C.x", inherited_from="m:B.x"),
                        "'inherited_from' is only for kind set"),
                       (dict(kind="set", target="m:C", inherited_from="m:B.C"),
                        "'inherited_from' needs 'target' to name a class attribute"),
                       (dict(kind="set", target="m:C.x", inherited_from="m:C.x"),
                        "'inherited_from' names the target itself")):
        with pytest.raises(Exception, match=words.replace("(", r"\(").replace(")", r"\)")):
            validate(Patch, patch_doc(id="x", processes=["frontend"], **doc))


LAZY_CHILD = r"""
import json, sys
from pathlib import Path
import vllm
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests

tmp = Path(sys.argv[1])
ps = load_patch_set([tmp / "patches"])
loader = Loader(ps, load_manifests([tmp / "manifests"], ps), role="frontend", status_dir=tmp / "status",
                vllm_version="0.31.0", lazy=True)
loader.run_import_stage()
out = {"before": {p: (str(r.state), "%(step)s" in sys.modules, "%(table)s" in sys.modules)
                  for p, r in loader.records.items()}}
import inspect
from %(step)s import %(parser)s as Parser
from vllm.v1.worker.block_table import BlockTable
import torch
kw = dict(block_size=16, max_num_reqs=2, max_num_blocks_per_req=4, max_num_batched_tokens=32, pin_memory=False,
          device=torch.device("cpu"), kernel_block_size=16, cp_kv_cache_interleave_size=1)
table = BlockTable(**{k: v for k, v in kw.items() if k in inspect.signature(BlockTable).parameters})
out["after"] = {p: str(r.state) for p, r in loader.records.items()}
out["class_value"] = Parser.__dict__.get("structural_tag_model")
out["object_value"] = table.%(attr)s
loader.unpatch()
out["unpatched"] = ["structural_tag_model" in Parser.__dict__, table.%(attr)s]
print("RESULT" + json.dumps(out))
"""


def test_both_forms_wait_for_their_module_and_apply_when_vllm_imports_it(tmp_path):
    """The plugin's loader is lazy: a target module not imported yet is verified and applied when it is
    (lazy.py), for these kinds as for any `set`. In a fresh interpreter (import order is process state).
    On each release a subclass that inherits structural_tag_model there, and an attribute BlockTable's objects
    get there: use_hybrid_blocks (a literal, 0.31.0), else cp_kv_cache_interleave_size (0.32.0 dropped the other)."""
    import json
    import os
    import subprocess
    import sys

    from .helpers import write_manifest, write_patch

    step, _, parser = _inheriting_parser().partition(":")
    table = "vllm.v1.worker.block_table"
    own = {"use_hybrid_blocks": False, "cp_kv_cache_interleave_size": 1}  # vLLM's value for the child's BlockTable
    release = installed_static().release
    attr = next((a for a in own if isinstance(release.instance_attribute(f"{table}:BlockTable.{a}"), Fingerprint)),
                None)
    if attr is None:
        pytest.skip(f"BlockTable's objects get none of {', '.join(own)} on the installed vLLM")
    docs = {"step": _doc("step", f"{step}:{parser}.structural_tag_model", STRUCTURAL, value="qwen_3_coder"),
            "table": patch_doc(id="table", kind="set", target=f"{table}:BlockTable.{attr}", instances=True,
                               value="ours", processes=["frontend"])}
    for name, doc in docs.items():
        write_patch(tmp_path / "patches", name, doc)
    write_manifest(tmp_path / "manifests", [{"patch": f"{d['id']}@1", "targets": _pins(d)} for d in docs.values()])
    env = {**os.environ, "VLLM_PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), "VLLM_PATCHKIT_FLUSH_SECONDS": "0"}
    done = subprocess.run([sys.executable, "-c", LAZY_CHILD % {"step": step, "parser": parser, "table": table, "attr": attr}, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
    assert out["before"] == {"step": ["not_imported", False, False], "table": ["not_imported", False, False]}
    assert out["after"] == {"step": "applied", "table": "applied"}
    assert out["class_value"] == "qwen_3_coder" and out["object_value"] == "ours"
    assert out["unpatched"] == [False, own[attr]]  # inherited again; the object got back vLLM's own value

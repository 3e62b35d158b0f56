"""`pin` and `check` for the two `set` forms of issue 20 item 6, against the real releases: pinned on the installed
vLLM 0.31.0 (read statically), checked against the 0.32.0 and 0.33.0 wheels (`vllm-patchkit pin` / `check`, the
words a user reads), and the loader's verdict on 0.31.0 equal to check's (one reading, one verdict).

- an attribute of each object (`instances: true`): BlockPool.enable_caching (unchanged: ok); BlockTable's
  use_hybrid_blocks (0.32.0 drops the assignment from BlockTable.__init__: target_removed); the V2 runner's
  pcp_manager (`self.pcp_manager = None` in 0.31.0/0.32.0's __init__, built there by a call in 0.33.0:
  value_changed on 0.33.0 only);
- an inherited class attribute overridden on one subclass (`inherited_from`): HarmonyParser.reasoning_parser_cls
  (ROCm/ATOM's override; unchanged: ok); Step3p5ToolParser.structural_tag_model (inherited from ToolParser on
  0.31.0; 0.32.0 defines it itself: misdeclared, breaking, never "moved"); a base whose value changed (the real
  0.31.0 parser modules with the one literal edited, as no base value of an inherited literal attribute changed
  between the three releases: value_changed at the base).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_patchkit.upstream import misdeclared
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.releases import ReleaseError, installed_root, installed_static, installed_version, open_release
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.runtime.verify import verify
from vllm_patchkit.tools.manifest_files import dump_fingerprint
from vllm_patchkit.declaration.validation import validate

from .helpers import cached_wheel_or_skip, patch_doc, release, write_patches, write_tree

POOL = "vllm.v1.core.block_pool:BlockPool.enable_caching"
TABLE = "vllm.v1.worker.block_table:BlockTable.use_hybrid_blocks"
PCP = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.pcp_manager"
REASONING = "vllm.parser.harmony:HarmonyParser.reasoning_parser_cls"
REASONING_BASE = "vllm.parser.abstract_parser:Parser.reasoning_parser_cls"
STEP = "vllm.tool_parsers.step3p5_tool_parser:Step3p5ToolParser.structural_tag_model"
STEP_BASE = "vllm.tool_parsers.abstract_tool_parser:ToolParser.structural_tag_model"

DOCS = [
    patch_doc("pool-no-cache", POOL, kind="set", instances=True, value=False, required=True),
    patch_doc("table-no-hybrid", TABLE, kind="set", instances=True, value=False, required=True),
    patch_doc("runner-no-pcp", PCP, kind="set", instances=True, value=None, required=True),
    patch_doc("harmony-reasoning", REASONING, kind="set", inherited_from=REASONING_BASE,
              value_from="vllm.reasoning.gptoss_reasoning_parser:GptOssReasoningParser", required=True,
              processes=["frontend"]),
    patch_doc("step3p5-structural", STEP, kind="set", inherited_from=STEP_BASE, value="qwen_3_coder",
              required=True, processes=["frontend"]),
]


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    base = tmp_path_factory.mktemp("set_kinds")
    patches = write_patches(base / "patches", DOCS)
    assert main(["pin", "--vllm", "0.31.0", "--patch-dir", str(patches), "--out", str(base / "manifests")]) == 0
    return patches, base / "manifests"


def test_pin_writes_the_two_forms(pinned):
    from vllm_patchkit.upstream.source_fingerprint import value_digest

    _, manifests = pinned
    m = yaml.safe_load((manifests / "vllm-0.31.0.yaml").read_text())
    targets = {e["patch"]: e["targets"] for e in m["patches"]}
    none = value_digest(None)
    assert targets["pool-no-cache@1"] == {POOL: {"kind": "instance_attribute"}}  # `= enable_caching`: no literal
    assert targets["runner-no-pcp@1"] == {PCP: {"kind": "instance_attribute", "value_digest": none}}
    assert targets["harmony-reasoning@1"] == {REASONING: {"kind": "absent"},
                                               REASONING_BASE: {"kind": "attribute", "value_digest": none}}
    assert targets["step3p5-structural@1"] == {STEP: {"kind": "absent"},
                                                STEP_BASE: {"kind": "attribute", "value_digest": none}}


def _check(pinned, version: str, capsys) -> tuple[int, str]:
    cached_wheel_or_skip(version)
    patches, manifests = pinned
    code = main(["check", "--vllm", version, "--patch-dir", str(patches), "--manifest-dir", str(manifests)])
    return code, capsys.readouterr().out


GONE = (f"[target_removed] {TABLE}: target not found: no method of vllm.v1.worker.block_table:BlockTable or of its "
        "bases in the vllm package assigns self.use_hybrid_blocks (read from their source): BlockTable objects do not "
        "get that attribute from vllm's code — affects table-no-hybrid@1 (breaking: the place the patch is installed "
        "at is gone)")
NOW_DEFINED = (f"[misdeclared] {STEP}: declaration does not fit the place: {misdeclared.now_defined(STEP, STEP_BASE)}"
               " — affects step3p5-structural@1 (breaking: the loader refuses this declaration at start-up)")


def test_check_on_0_32_0(pinned, capsys):
    code, out = _check(pinned, "0.32.0", capsys)
    assert code == 1
    for ok in ("pool-no-cache@1", "runner-no-pcp@1", "harmony-reasoning@1"):
        assert f"  ok        {ok} (pins of vLLM 0.31.0)" in out, out
    assert GONE in out and NOW_DEFINED in out, out
    assert "target_moved" not in out and "target_inherited" not in out


def test_check_on_0_33_0(pinned, capsys):
    code, out = _check(pinned, "0.33.0", capsys)
    assert code == 1
    assert "  ok        pool-no-cache@1" in out and "  ok        harmony-reasoning@1" in out, out
    assert GONE in out and NOW_DEFINED in out, out
    assert (f"[value_changed] {PCP}: value changed since it was pinned (digest sha256:8e317577e5d7e6da -> none: no "
            "longer a simple literal) — affects runner-no-pcp@1 (breaking: the value the patch relies on changed)"
            in out), out


def test_a_changed_base_value_is_reported_at_the_base(tmp_path):
    """The installed 0.31.0's parser modules, Parser.reasoning_parser_cls's literal edited: the change is reported
    where it happened (the base), for the patch overriding it on HarmonyParser; HarmonyParser itself still only
    inherits it, so nothing is said about it."""
    root = installed_root() / "vllm"
    abstract = (root / "parser" / "abstract_parser.py").read_text()
    line = "    reasoning_parser_cls: type[ReasoningParser] | None = None\n"
    assert abstract.count(line) == 1
    tree = write_tree(tmp_path / "after", {
        "vllm/_version.py": "__version__ = '0.31.1'\n",
        "vllm/parser/abstract_parser.py": abstract.replace(line, line.replace("None\n", "'gpt_oss'\n")),
        "vllm/parser/harmony.py": (root / "parser" / "harmony.py").read_text(),
    })
    patch = validate(Patch, DOCS[3])
    pins, broken = examine(installed_static(), patch, None)
    assert not broken
    _, found = examine(release(tree, "0.31.1"), patch, pins)
    [b] = found
    assert b.kind.value == "value_changed" and b.target == REASONING_BASE and b.breaking


def test_the_loader_and_check_give_one_verdict_on_the_installed_release_with_the_0_31_0_pins():
    """Each declaration (and three misdeclared ones) judged by the loader (`verify`, live, on the installed
    release) and by check (static, the same installed tree), with the pins the 0.31.0 release gives (read
    statically: the installed tree on the 0.31.0 leg, its wheel otherwise); a declaration 0.31.0 refuses gets pins
    from a release where it fits. On 0.32.0 the pins of TABLE and STEP no longer hold: both refuse, alike."""
    wrong_base = "vllm.parser.abstract_parser:DelegatingParser.reasoning_parser_cls"
    hermes = "vllm.tool_parsers.hermes_tool_parser:Hermes2ProToolParser.structural_tag_model"
    lookahead = "vllm.v1.core.block_pool:BlockPool.num_hash_lookahead_tokens"
    # STEP sets "qwen_3_coder", the very literal 0.32.0's Step3p5ToolParser defines itself: the loader once took
    # that for "set by an earlier loader of this process" and accepted it while check said misdeclared; it now
    # knows which values it wrote (apply.SET_BY) and refuses, as check does
    cases = [(d, None) for d in DOCS] + [
        (patch_doc("wrong-base", REASONING, kind="set", inherited_from=wrong_base, processes=["frontend"]),
         {REASONING: {"kind": "absent"}, wrong_base: {"kind": "attribute"}}),
        (patch_doc("hermes", hermes, kind="set", inherited_from=STEP_BASE, value="x", processes=["frontend"]),
         {hermes: {"kind": "absent"}, STEP_BASE: {"kind": "attribute"}}),
        (patch_doc("lookahead", lookahead, kind="set", instances=True, value=0), {lookahead: {"kind": "instance_attribute"}}),
    ]
    try:
        v031 = open_release("0.31.0")
    except ReleaseError as exc:
        pytest.skip(str(exc))
    static = installed_static()
    rows = []
    for doc, pins in cases:
        patch = validate(Patch, doc)
        if pins is None:
            found, broken = examine(v031, patch, None)
            assert not broken and all(isinstance(f, Fingerprint) for f in found.values()), (patch.key, found)
            pins = {s: dump_fingerprint(f) for s, f in found.items()}
        _, said = examine(static, patch, {s: Fingerprint(**f) for s, f in pins.items()}, v031)
        said = [b for b in said if b.breaking]
        v = verify(patch, validate(ManifestEntry, {"patch": patch.key, "targets": pins}))
        if isinstance(v, Finding):
            assert said and v.reason in [b.detail for b in said] + [f"{b.explain()} ({b.verdict()})" for b in said], (
                patch.key, v.reason, [b.explain() for b in said])
        else:
            assert said == [], (patch.key, [b.explain() for b in said])
        rows.append((patch.id, v.code if isinstance(v, Finding) else "ok"))
    # 0.32.0 drops BlockTable's use_hybrid_blocks and defines Step3p5ToolParser.structural_tag_model itself
    changed = "target" if static.version() != "0.31.0" else "ok"
    assert rows == [("pool-no-cache", "ok"), ("table-no-hybrid", changed), ("runner-no-pcp", "ok"),
                    ("harmony-reasoning", "ok"), ("step3p5-structural", changed), ("wrong-base", "target"),
                    ("hermes", "target"), ("lookahead", "target")]


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_the_static_reading_of_each_wheel_is_the_live_rule(version):
    """Every place above read from the wheel with the rule the loader uses (nothing imported): the reading of a
    wheel and of the installed tree are the same function over the same kind of syntax tree."""
    cached_wheel_or_skip(version)
    rel = open_release(version)
    got = {spec: rel.release.instance_attribute(spec) for spec in (POOL, TABLE, PCP)}
    assert isinstance(got[POOL], Fingerprint) and got[POOL].kind == "instance_attribute"
    assert not isinstance(got[TABLE], Fingerprint)  # gone from 0.32.0 on
    assert isinstance(got[PCP], Fingerprint)
    assert rel.lookup(REASONING).inherited_from == REASONING_BASE  # still only inherited
    assert isinstance(rel.lookup(STEP), Fingerprint)  # defined on Step3p5ToolParser itself from 0.32.0 on
    assert rel.version() == version
    if installed_version() != version:  # read from the wheel (the installed release is read from its own tree)
        assert Path(str(rel.release.label)).name.startswith(f"vllm-{version}")

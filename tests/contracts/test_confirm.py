"""`check --confirm` (issue 30, item 4): each reach or signature breakage check reports is exercised on the release
in a child process, and reads confirmed, NOT CONFIRMED (a false alarm made visible) or cannot confirm.

Against the real vLLM 0.31.0 installed here: the renamed-attribute tree of test_reach.py (a copy of its Python tree
with `InputBatch.num_prompt_tokens` renamed, put first on the child's path), and breakages made by hand on real
classes and functions for the verdicts the shipped set does not produce (a name that is there, an import, a call)."""

from __future__ import annotations

import json
import types

import pytest

from tests.contracts.test_reach import IMPL, PATCH, _line_reading, base_tree, renamed_tree  # noqa: F401 (fixtures)
from vllm_patchkit.tools import confirm
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.releases import installed_version
from vllm_patchkit.tools.report import PatchResult, Report
from vllm_patchkit.upstream.findings import Breakage, BreakageKind

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="the trees are copies of vLLM 0.31.0")
INPUT_BATCH = "vllm.v1.worker.gpu_input_batch:InputBatch"


def test_the_renamed_attribute_is_confirmed_in_a_child_on_the_tree(renamed_tree, capsys):
    assert main(["check", "--source", str(renamed_tree), "--vllm", "0.31.0", "--confirm"]) == 1  # check's verdict
    out = capsys.readouterr().out
    line = _line_reading(IMPL.read_text())
    assert f"with {renamed_tree} first on the path" in out
    assert "1 confirmed, 0 not confirmed, 0 could not be tried" in out
    assert (f"  {PATCH} [reach_missing] {INPUT_BATCH}.num_prompt_tokens (patches/batch_dispatch_override.py:{line}): "
            "confirmed: AttributeError: 'InputBatch' object has no attribute 'num_prompt_tokens'") in out


def test_json_carries_the_confirmations(renamed_tree, capsys):
    main(["check", "--source", str(renamed_tree), "--vllm", "0.31.0", "--confirm", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    [c] = doc["confirmations"]
    assert c["verdict"] == "confirmed" and c["target"] == f"{INPUT_BATCH}.num_prompt_tokens"
    assert "first on the path" in doc["confirmed_by"]


def _report(*breakages: Breakage, uses=()) -> tuple[Report, object]:
    patch = types.SimpleNamespace(uses=list(uses), value_from=None)
    res = PatchResult("p@1", "broken", list(breakages), pins_from="0.31.0")
    return Report("0.31.0", "test", [res]), types.SimpleNamespace(patches={"p@1": patch})


def _installed():
    runner, why = confirm.runner_for("0.31.0", None, None)
    assert runner is not None, why
    return runner


def test_a_name_the_release_has_is_not_confirmed_and_a_gone_one_is():
    """The child asks the real classes: a false alarm (InputBatch has num_reqs) reads NOT CONFIRMED."""
    report, ps = _report(
        Breakage(BreakageKind.reach_missing, "p@1", f"{INPUT_BATCH}.num_reqs", old="attribute", new="0.31.0",
                 detail="x.py:1"),
        Breakage(BreakageKind.reach_missing, "p@1", f"{INPUT_BATCH}.num_reqs_gone", old="method", new="0.31.0",
                 detail="x.py:2"),
        Breakage(BreakageKind.reach_missing, "p@1", "vllm.v1.core.kv_cache_utils:get_kv_cache_configs_gone",
                 old="import", new="0.31.0", detail="x.py:3"),
        Breakage(BreakageKind.reach_missing, "p@1", "vllm.v1.core.kv_cache_utils:hash_block_tokens",
                 old="import", new="0.31.0", detail="x.py:4"))
    got = confirm.confirm(report, ps, {}, _installed())
    assert [c.verdict for c in got] == ["not_confirmed", "confirmed", "confirmed", "not_confirmed"]
    assert "AttributeError" in got[1].said and "num_reqs_gone" in got[1].said
    assert got[2].said.startswith("ImportError: cannot import name 'get_kv_cache_configs_gone'")
    assert [c.at for c in got] == ["x.py:1", "x.py:2", "x.py:3", "x.py:4"]
    assert "NOT CONFIRMED" in got[0].line()


def test_a_used_callables_call_is_bound_to_its_live_signature():
    """vLLM 0.31.0's function takes (hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None). A pin
    with a required keyword it does not take is confirmed as the TypeError the call raises; a pin with a fourth
    required positional is not (the call binds it to extra_keys: no error, whatever the static diff said)."""
    target = "vllm.v1.core.kv_cache_utils:hash_block_tokens"
    removed = Breakage(BreakageKind.parameter_removed, "p@1", target, parameter="salt", old="salt")
    manifests = {"0.31.0": types.SimpleNamespace(patches=[types.SimpleNamespace(patch="p@1", targets={
        target: types.SimpleNamespace(signature="(hash_function, parent_block_hash, curr_block_token_ids, *, salt)")})])}
    report, ps = _report(removed, uses=[target])
    [c] = confirm.confirm(report, ps, manifests, _installed())
    assert c.verdict == "confirmed" and c.said.startswith("TypeError: got an unexpected keyword argument 'salt'")
    pin = manifests["0.31.0"].patches[0].targets[target]
    pin.signature = "(hash_function, parent_block_hash, curr_block_token_ids, salt)"
    [c] = confirm.confirm(report, ps, manifests, _installed())
    assert c.verdict == "not_confirmed"


def test_a_release_that_cannot_run_here_is_never_called_confirmed():
    report, ps = _report(Breakage(BreakageKind.reach_missing, "p@1", f"{INPUT_BATCH}.num_reqs_gone",
                                  old="attribute", new="0.33.0", detail="x.py:1"))
    runner, why = confirm.runner_for("0.33.0", None, None)
    assert runner is None and "--confirm-python" in why
    [c] = confirm.confirm(report, ps, {}, runner, why)
    assert c.verdict == "cannot" and "not installed here" in c.said


def test_a_child_importing_another_release_gives_no_verdict():
    report, ps = _report(Breakage(BreakageKind.reach_missing, "p@1", f"{INPUT_BATCH}.num_reqs_gone",
                                  old="attribute", new="0.32.0", detail="x.py:1"))
    runner = confirm.Runner(_installed().python, None, "0.32.0")  # claims 0.32.0; the interpreter has 0.31.0
    [c] = confirm.confirm(report, ps, {}, runner)
    assert c.verdict == "cannot" and "imports vLLM 0.31.0, not 0.32.0" in c.said


def test_the_matrix_refuses_confirm(capsys):
    assert main(["check", "--vllm", "0.31.0,0.32.0", "--confirm"]) == 2
    assert "--confirm reads one release" in capsys.readouterr().err


@pytest.mark.parametrize("said", ["PATCHKIT-CONFIRM {not json", 'PATCHKIT-CONFIRM {"vllm": "0.31.0"}',
                                  'PATCHKIT-CONFIRM {"vllm": "0.31.0", "answers": [{"verdict": "fine"}]}'])
def test_a_garbled_child_answer_is_no_verdict(tmp_path, said):
    """A child that prints a marked line that cannot be read (a plugin printing over it, a truncated pipe): the
    breakage reads `cannot confirm`, never confirmed and never a traceback."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{said}'\n")
    fake.chmod(0o755)
    report, ps = _report(Breakage(BreakageKind.reach_missing, "p@1", f"{INPUT_BATCH}.num_reqs_gone",
                                  old="attribute", new="0.31.0", detail="x.py:1"))
    [c] = confirm.confirm(report, ps, {}, confirm.Runner(str(fake), None, "0.31.0"))
    assert c.verdict == "cannot" and "could not be read" in c.said

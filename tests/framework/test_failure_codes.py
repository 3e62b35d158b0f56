"""One vocabulary of failure codes (declaration/failures.py): every code the source gives a finding or a record is
a member, an unknown one is refused where it is made, every member has its row, the remedies read the rows in the
words they had, each of `check`'s BreakageKinds names the loader's code, records keep their plain strings, and
docs/failure-codes.md is current."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import msgspec
import pytest

from vllm_patchkit.declaration.errors import remedies
from vllm_patchkit.declaration.failures import BY_CODE, ROWS, FailureCode
from vllm_patchkit.upstream.findings import LOADER_CODES, NOT_RECORDED, BreakageKind, Finding

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "vllm_patchkit"
#: calls that write their argument at this position into a record's `code`
RECORD_WRITERS = {"set": 1, "required_failed": 1, "remedies": 0, "Skip": 0}


def _strings(node: ast.AST) -> list[str]:
    """The string constants an argument can be: a literal, or either branch of `a if c else b`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    return []


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _forwarders(tree: ast.AST) -> set[str]:
    """Names bound to a function, method or lambda that passes its first parameter on as a Finding's code
    (`_finding`, convention's `_Binding.add`)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            fn, name = node, node.name
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)):
            fn, name = node.value, node.targets[0].id
        else:
            continue
        params = [a.arg for a in fn.args.args]
        if params[:1] in (["self"], ["cls"]):  # a method (convention's `_Binding.add`): its first own parameter
            params = params[1:]
        if not params:
            continue
        first = params[0]
        if any(isinstance(c, ast.Call) and _name(c) == "Finding" and c.args and isinstance(c.args[0], ast.Name)
               and c.args[0].id == first for c in ast.walk(fn)):
            out.add(name)
    return out


def _codes_in_source() -> dict[str, list[str]]:
    """Every string the source gives a Finding (directly or through a forwarder), a record writer or a findings
    entry (`{"code": ...}`) as its code -> where."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        makers = {"Finding"} | _forwarders(tree)
        for node in ast.walk(tree):
            args: list = []
            if isinstance(node, ast.Call):
                name = _name(node)
                if name in makers and node.args:
                    args = [node.args[0]]
                elif name in RECORD_WRITERS and len(node.args) > RECORD_WRITERS[name] and "runtime" in path.parts:
                    args = [node.args[RECORD_WRITERS[name]]]
                args += [k.value for k in node.keywords if k.arg == "code" and name in makers | set(RECORD_WRITERS)]
            elif isinstance(node, ast.Dict) and "runtime" in path.parts:
                args = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "code"]
            for arg in args:
                for code in _strings(arg):
                    found.setdefault(code, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_code_the_source_writes_is_a_member():
    found = _codes_in_source()
    # the reader finds what it must: literals (verify, convention's `add`, subclass's `_finding`), both branches
    assert {"target", "fingerprint", "renamed", "no_varkw", "undeclared_override", "implementation_missing",
            "shape"} <= set(found)
    unknown = {c: w for c, w in found.items() if c not in FailureCode.__members__}
    assert unknown == {}, f"codes that are no FailureCode member: {unknown}"


def _named_members(skip: tuple = ()) -> set[str]:
    return {node.attr for path in SRC.rglob("*.py") if path.relative_to(SRC).as_posix() not in skip
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "FailureCode"}


def test_every_member_the_source_names_exists_and_every_member_is_written():
    """`FailureCode.x` in the source: a misspelt member would raise only on the path that writes it; and a member
    nothing writes (the vocabulary's own modules aside) is a row describing nothing."""
    named = _named_members()
    assert named and named - set(FailureCode.__members__) == set()
    written = set(_codes_in_source()) | _named_members(skip=("declaration/failures.py", "upstream/findings.py"))
    assert set(FailureCode.__members__) - written == set()


def test_a_finding_takes_a_string_as_its_member_and_refuses_an_unknown_code():
    f = Finding("target", "gone", "x", "missing")
    assert f.code is FailureCode.target and f.code == "target"
    assert Finding(FailureCode.kind, "r").code is FailureCode.kind
    with pytest.raises(ValueError, match=r"'no_such_code' is not a FailureCode member"):
        Finding("no_such_code", "why")


def test_every_member_has_one_row_and_is_named_by_its_value():
    assert [r.code for r in ROWS] == list(FailureCode)  # one row each, in the enum's order
    for code in FailureCode:
        assert code.name == code.value  # a str Enum hashes by name: a plain string must find its row
        row = BY_CODE[code.value]
        assert row.meaning and row.recorded, code
        assert str(code) == f"{code}" == code.value


def _manifests(**releases):
    return {v: types.SimpleNamespace(patches=[types.SimpleNamespace(patch=f"{i}@1") for i in ids])
            for v, ids in releases.items()}


ALLOW = ("set VLLM_PATCHKIT_ALLOW_UNPATCHED={pid} (or `all`) to serve without it: the patch is then skipped, logged "
         "as a warning and listed under `warnings` by `vllm-patchkit status` (a warning never changes its exit code).")


@pytest.mark.parametrize("code,pid,text", [
    ("target", "p", "Remedies: use a vLLM release it is pinned for (0.31.0); or upstream moved or removed it: "
                    "`vllm-patchkit check --vllm 0.32.0` says where it went; write a patch version that fits vLLM "
                    "0.32.0 and pin it; or, at your own risk, " + ALLOW),
    ("conflict", "p", "Remedies: someone else's code stands at the target (found above): remove that plugin or keep "
                      "it from loading (`VLLM_PLUGINS` lists the general plugins vLLM loads), or agree with its "
                      "authors on one change; another vLLM release or a new pin does not help; or, at your own risk, "
                      + ALLOW),
    ("unavailable", "r", "No vLLM release other than 0.32.0 pins it. Remedies: port it: `vllm-patchkit pin --vllm "
                         "0.32.0` (a new patch version if the change is breaking), review, commit; or, at your own "
                         "risk, " + ALLOW),
    ("precondition_unknown", "q", "Remedies: use a vLLM release it is pinned for (0.33.0); or the framework cannot "
                                  "read this precondition's fact on vLLM 0.32.0 (upstream removed or renamed what it "
                                  "reads): teach its row in `declaration/precondition_table.py` to read it there (report it), or "
                                  "serve a release whose facts it reads; or, at your own risk, " + ALLOW),
    ("process", "p", "Remedy: at your own risk, " + ALLOW),
    ("not_a_code", "q", "Remedy: at your own risk, " + ALLOW),
])
def test_remedies_read_the_rows_in_the_words_they_had(code, pid, text):
    """The texts `errors.remedies` gave before its table moved to the rows (byte for byte), for a code as a
    string and as a member."""
    manifests = _manifests(**{"0.31.0": ["p"], "0.32.0": ["p", "q"], "0.33.0": ["q"]})
    assert remedies(code, pid, "0.32.0", manifests) == text.format(pid=pid)
    if code in FailureCode.__members__:
        assert remedies(FailureCode(code), pid, "0.32.0", manifests) == text.format(pid=pid)


def test_every_breakage_kind_names_the_loaders_code():
    assert set(LOADER_CODES) == set(BreakageKind)
    for kind in BreakageKind:
        assert kind.failure_code is LOADER_CODES[kind]
        assert (kind.failure_code is None) == (kind in NOT_RECORDED), kind
    # the loader's code for a change is one a failure (or, for a copy bypassing the patch, a finding) records
    assert {k.failure_code for k in BreakageKind} - {None} <= set(FailureCode)
    assert BreakageKind.required_parameter_added.failure_code is FailureCode.fingerprint
    assert BreakageKind.copy_undeclared.failure_code is FailureCode.stale_copy


def test_a_record_keeps_its_plain_strings():
    """A record holding members encodes exactly as one holding the strings (json, msgspec, the record file)."""
    from vllm_patchkit.runtime.record import FAILED, PatchRecord, ProcessRecord

    def record(code, finding_code):
        rec = PatchRecord(patch="p@1", kind="wrap", required=True, stage="import", at=1.0)
        rec.set(FAILED, code, "gone", "x", "missing")
        rec.at = 1.0
        rec.findings.append({"code": finding_code, "where": "m:f", "reason": "r"})
        rec.detail["failure"] = code
        return ProcessRecord(run_id="r", role="frontend", pid=1, ppid=0, vllm_version="0.31.0", started=0.0,
                             patches=[rec])

    member = record(Finding("target", "gone").code, Finding("stale_copy", "r", where="m:f").as_record()["code"])
    plain = record("target", "stale_copy")
    assert json.dumps(member.to_json()) == json.dumps(plain.to_json())
    assert msgspec.json.encode(member.to_json()) == msgspec.json.encode(plain.to_json())
    assert msgspec.json.encode(member) == msgspec.json.encode(plain)
    assert json.dumps(Finding("copy", "r", where="m:f").as_record(by="x")) == \
        '{"code": "copy", "where": "m:f", "by": "x", "reason": "r"}'
    back = ProcessRecord.from_json(json.loads(json.dumps(member.to_json())))
    assert back.patches[0].code == FailureCode.target


def test_check_statuses_are_one_enum_with_the_same_words():
    from vllm_patchkit.tools.report import PatchResult, PatchStatus, Report

    assert [s.value for s in PatchStatus] == ["ok", "compatible", "stale", "broken", "not_applicable", "unpinned"]
    res = PatchResult("p@1", "stale")
    assert res.status is PatchStatus.stale and f"{res.status}" == "stale"
    assert json.dumps(res.as_dict()) == json.dumps({**res.as_dict(), "status": "stale"})
    report = Report("1.0.0", "toy", [res, PatchResult("q@1", PatchStatus.ok)])
    assert report.failed and json.dumps(report.counts()) == (
        '{"ok": 1, "compatible": 0, "stale": 1, "broken": 0, "not_applicable": 0, "unpinned": 0, "retirable": 0}')
    with pytest.raises(ValueError):
        PatchResult("p@1", "fine")


def test_the_failure_codes_page_is_current_and_names_every_code_and_kind():
    from vllm_patchkit.tools import docs_failures

    text = docs_failures.render()
    assert (ROOT / "docs" / docs_failures.NAME).read_text() == text, "run `vllm-patchkit docs` and commit docs/"
    for code in FailureCode:
        assert f"| `{code.value}` |" in text, code
    for kind in BreakageKind:
        assert f"`{kind.value}`" in text, kind
    assert "[failure-codes.md](failure-codes.md)" in (ROOT / "docs" / "troubleshooting.md").read_text()

"""One verdict per run, rendered everywhere: `verdict.judge` works out every row's state, problem and warning
once; `status` (table and JSON), /metrics, the route and gathering only render it.

Two halves: the verdict's values for a run with one row of each state the table marks (real records,
`ProcessRecord`/`PatchRecord`), and what each renderer shows of that one verdict; then a reading of the
renderers' source proving they compute no row state themselves (issue 32, item 2).
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from pathlib import Path

import vllm_patchkit.reporting as reporting_pkg
from vllm_patchkit.reporting import gather, metrics, route, status
from vllm_patchkit.reporting.run_folder import Run, load_run
from vllm_patchkit.reporting.verdict import judge
from vllm_patchkit.reporting.verdict_values import Ending, Mark, ProblemCode, RowState, WarningCode
from vllm_patchkit.runtime.record import PatchRecord, ProcessRecord, State, process_file, write_atomic

RUN = "20260101T000000-1-abcdef"
RENDERERS = ("status.py", "metrics.py", "route.py", "gather.py")


def _rec(patch, state, code=None, *, required=False, calls=0, expected_calls="never_counted", expected=None,
         found=None, **extra):
    r = PatchRecord(patch=patch, patch_set="s", kind="wrap", required=required, stage="import",
                    expected_calls=expected_calls, calls=calls, **extra)
    return r.set(state, code, expected=expected, found=found)


def _write(base: Path, role: str, pid: int, patches, steps=None) -> None:
    proc = ProcessRecord(run_id=RUN, role=role, pid=pid, ppid=1, vllm_version="0.31.0", started=time.time(),
                         steps=steps, patches=list(patches))
    write_atomic(process_file(base, proc), proc.to_json())


def _run(tmp_path) -> Run:
    base = tmp_path / "status"
    _write(base, "engine_core", 101, [
        _rec("late@1", "pending", required=True),  # stepped, never judged
        _rec("moved@1", "not_imported", required=True),  # applied nowhere
        _rec("pins@1", "failed", "fingerprint", required=True, expected="(a, b)", found="(a,)"),
    ], steps=40)
    _write(base, "worker", 102, [
        _rec("step@1", "applied", expected_calls="per_step"),  # inert
        _rec("base@1", "applied", findings=[{"code": "shadowed", "by": "CPUModelRunner"}]),
        _rec("boom@1", "applied", calls=3, raised=2, exceptions=[
            {"type": "KeyError", "message": "'x'", "at": "impl.py:3", "passed_through": False, "count": 2}]),
        _rec("other-role@1", "skipped", "process"),
        _rec("no-release@1", "skipped", "unavailable", warning="needed here, not on this release"),
    ], steps=40)
    return load_run(base, RUN)


def test_one_judgement_gives_each_row_its_state_marks_and_problems(tmp_path):
    v = judge(_run(tmp_path))
    rows = {r.record.patch: r for pv in v.processes for r in pv.rows}
    assert {k: r.state for k, r in rows.items()} == {
        "late@1": RowState.pending, "moved@1": RowState.not_imported, "pins@1": RowState.failed,
        "step@1": RowState.inert, "base@1": RowState.shadowed, "boom@1": RowState.raised,
        "other-role@1": RowState.skipped, "no-release@1": RowState.not_applicable}
    assert rows["late@1"].marks == (Mark.never_judged,) and rows["late@1"].label == "pending, NEVER JUDGED"
    assert rows["moved@1"].label == "not_imported, APPLIED NOWHERE"
    assert rows["step@1"].label == "applied, INERT" and rows["base@1"].label == "applied, SHADOWED"
    assert rows["boom@1"].label == "applied, RAISED" and rows["no-release@1"].label == "skipped, WARNING"
    assert not rows["other-role@1"].shown and rows["pins@1"].evidence and rows["boom@1"].counted
    assert [(p.code, p.processes, p.patch) for p in v.problems] == [
        (ProblemCode.never_judged, ("engine_core (pid 101)",), "late@1"),
        (ProblemCode.required_failed, ("engine_core (pid 101)",), "pins@1"),
        (ProblemCode.inert, ("worker (pid 102)",), "step@1"),
        (ProblemCode.shadowed, ("worker (pid 102)",), "base@1"),
        (ProblemCode.applied_nowhere, ("engine_core (pid 101)",), "moved@1")]
    assert v.problems[2].words == "step@1 in worker (pid 102): inert (0 calls after 40 steps)"
    assert [w.code for w in v.warnings] == [WarningCode.optional_raised, WarningCode.patch]
    assert v.exit_code == 1 and [pv.end.state for pv in v.processes] == [Ending.unknown, Ending.unknown]


def _metric_states(run) -> dict:
    out = {}
    for fam in metrics.families(run):
        for s in fam.samples:
            if s.name == "vllm_patchkit_patch_state":
                out[s.labels["patch"] + "@" + s.labels["version"]] = s.labels["state"]
            elif s.name in ("vllm_patchkit_status_exit_code", "vllm_patchkit_problems", "vllm_patchkit_warnings"):
                out[s.name] = s.value
    return out


def test_table_json_metrics_and_route_render_that_one_verdict(tmp_path):
    run = _run(tmp_path)
    v = judge(run)
    shown = [r for pv in v.processes for r in pv.rows if r.shown]
    table = status.table_of(v)
    for row in shown:
        assert row.label in table
    assert "other-role@1" not in table and "other-role@1" in status.table_of(v, show_skipped=True)
    assert "[expected: (a, b); found: (a,)]" in table
    body = json.loads(status.json_of(v))
    assert (body["exit_code"], body["problems"], body["warnings"]) == (1, v.problem_lines(), v.warning_lines())
    assert [p["ended"] for p in body["processes"]] == [pv.end.to_json() for pv in v.processes]
    assert status.to_json(run) == status.json_of(v)  # judged again from the same records: the same words
    seen = _metric_states(run)
    assert {k: s for k, s in seen.items() if "@" in k} == {r.record.patch: r.state.value for r in shown}
    assert (seen["vllm_patchkit_status_exit_code"], seen["vllm_patchkit_problems"],
            seen["vllm_patchkit_warnings"]) == (1, len(v.problems), len(v.warnings))
    answer = asyncio.run(route.Snapshot(tmp_path / "status", RUN).read())
    assert answer == (route.bounded(status.json_of(v)), v.exit_code)  # the body and the 503 from one verdict


def test_a_gathered_process_flows_into_the_same_verdict(tmp_path):
    """gather.merge adds a dict; the verdict types it with its host and judges it with the rest."""
    remote = ProcessRecord(run_id=RUN, role="worker", pid=7, ppid=1, vllm_version="0.31.0", started=0.0,
                           patches=[_rec("far@1", "failed", "fingerprint", required=True)]).to_json()
    run, added = gather.merge(_run(tmp_path), [{"host": "node-b", "record": remote}], local_host="node-a")
    v = judge(run)
    [far] = [pv for pv in v.processes if pv.record.host == "node-b"]
    assert added == 1 and far.rows[0].state == RowState.failed
    assert far.end.state == Ending.unknown  # another host's: its liveness is not checked here
    assert ProblemCode.required_failed in [p.code for p in v.problems if p.processes == ("worker (pid 7)",)]


# -- the renderers compute nothing of the verdict ------------------------------------------------------------

#: Names that, compared, would be a row state worked out again: a record's state, its cause code, its expected
#: calls, a finding's code, a process's end.
_JUDGED_FIELDS = {"state", "code", "expected_calls", "end", "end_signal", "required", "unpersisted_since"}
#: Words a comparison would have to use: the record's states, the row states, the ends, finding and skip codes.
_JUDGED_WORDS = ({s.value for s in State} | {s.value for s in RowState} | {e.value for e in Ending}
                 | {"per_step", "shadowed", "stale_copy", "process", "unavailable", "unpatched_allowed"})
#: The verdict's helpers of old (and its private ones): a renderer that calls one judges again.
_JUDGING_CALLS = {"is_inert", "never_applied", "unwritten", "gathered_live", "raised_words", "verified_against",
                  "end_of", "ends", "state_of", "assess", "warnings_of", "installs_function", "liveness",
                  "_row", "_ends", "_end_of", "_unwritten", "_never_applied", "_raised_words", "_verified_against"}


def _named(node: ast.AST) -> set[str]:
    """Field names and string constants a comparison operand mentions: `rec.state`, `rec.get("state")`,
    `rec["state"]`, `"applied"`."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            out.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.add(sub.value)
    return out


def judging(source: str) -> list[str]:
    """Where `source` works out a row state itself: comparisons that mention a judged field or word, calls of
    the verdict's helpers, more than one `judge` call in one function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = _named(node) & (_JUDGED_FIELDS | _JUDGED_WORDS)
            if hit:
                found.append(f"line {node.lineno}: compares {sorted(hit)}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in _JUDGING_CALLS:
                found.append(f"line {node.lineno}: calls {name}")
        elif isinstance(node, (ast.ImportFrom,)):
            hit = {a.name for a in node.names} & _JUDGING_CALLS
            if hit:
                found.append(f"line {node.lineno}: imports {sorted(hit)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = sum(1 for sub in ast.walk(node) if isinstance(sub, ast.Call) and
                    getattr(sub.func, "id", getattr(sub.func, "attr", None)) == "judge")
            if n > 1:
                found.append(f"line {node.lineno}: {node.name} judges the run {n} times")
    return found


def test_status_metrics_route_and_gather_compute_no_row_state():
    folder = Path(reporting_pkg.__file__).parent
    found = {name: judging((folder / name).read_text()) for name in RENDERERS}
    assert found == {name: [] for name in RENDERERS}


def test_the_reading_catches_a_renderer_that_judges():
    """The check above is not vacuous: the forms the renderers used before the verdict was one are caught."""
    before = '''
def state_of(rec, steps, min_steps):
    if rec.get("state") == "skipped" and rec.get("code") == "process":
        return None
    if any(f.get("code") == "shadowed" for f in rec.get("findings") or []):
        return "shadowed"
    return "inert" if is_inert(rec, steps, min_steps) else rec.state
def report(run):
    return to_json(judge(run)), judge(run).exit_code
'''
    found = judging(before)
    assert {f.split(":")[0] for f in found if "compares" in f} == {"line 3", "line 5"}
    assert "line 7: calls is_inert" in found and any("judges the run 2 times" in f for f in found)
    assert judging("if row.shown and n > 0:\n    pass\n") == []

"""Report: one server run's verdict (`verdict.judge`) rendered as `vllm-patchkit status` prints it (table or
JSON), its exit code included. Usable from CI and as a readiness probe; nothing here judges a row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from vllm_patchkit.reporting.run_folder import Run, load_run
from vllm_patchkit.reporting.terminal_text import rich_text
from vllm_patchkit.reporting.verdict import judge
from vllm_patchkit.reporting.verdict_values import ProcessVerdict, Row, Verdict


def json_of(verdict: Verdict) -> str:
    """`status --json`'s text: the records as read, each process with its end, and the verdict's words."""
    run = verdict.run
    return json.dumps(
        {
            "run_id": run.run_id if run else None,
            "exit_code": verdict.exit_code,
            "problems": verdict.problem_lines(),
            "warnings": verdict.warning_lines(),
            "refused": run.refused if run else [],
            "processes": [{**p, "ended": pv.end.to_json()} for p, pv in zip(run.processes, verdict.processes)]
            if run else [],
        },
        indent=1,
    )


def to_json(run: Optional[Run], min_steps: int = 8) -> str:
    return json_of(judge(run, min_steps))


def report(base: Path, run_id: Optional[str] = None, min_steps: int = 8) -> tuple[str, int]:
    """Exactly what `vllm-patchkit status --json [--run RUN] [--min-steps N]` prints for `base`, and its exit
    code, from one read of the records and one verdict: the API server's /patchkit/status serves this, so the
    probe and the CLI cannot disagree."""
    verdict = judge(load_run(base, run_id), min_steps)
    return json_of(verdict), verdict.exit_code


def _label(pv: ProcessVerdict) -> str:
    proc = pv.record
    hosted = ("+" + "+".join(proc.hosts)) if proc.hosts else ""
    label = f"{proc.role}{hosted} {proc.pid}" + (f"\n{pv.steps} steps" if proc.steps is not None else "")
    return label + ("\nrecord STALE" if pv.unwritten else "")  # the problem line itself is the verdict's


def _cells(row: Row) -> tuple[str, str, str]:
    """The state, calls and reason / detail cells of one row."""
    rec = row.record
    reason = "; ".join(x for x in (row.raised, rec.reason) if x)
    if row.evidence:
        reason += f" [expected: {rec.expected}; found: {rec.found}]"
    extra = "; ".join(f"{k}: {v}" for k, v in rec.detail.items() if k not in ("warned", "decided", "remedy"))
    for f in rec.findings:
        extra += ("; " if extra else "") + f"{f.get('code')}: {f.get('where', '')}"
    passed = [e for e in rec.exceptions if e.get("passed_through")]
    if rec.passed_through:
        extra += ("; " if extra else "") + (f"{rec.passed_through} exception(s) of vLLM's own code passed "
                                            "through (not the patch's)")
        extra += f": {passed[0].get('type')}: {passed[0].get('message')}" if passed else ""
    calls = str(rec.calls) if row.counted else "-"
    if row.counted and rec.raised:
        calls += f" ({rec.raised} raised)"
    return row.label, calls, "; ".join(str(x) for x in (reason, extra) if x)


def render(run: Optional[Run], min_steps: int = 8, show_skipped: bool = False) -> str:
    """`table_of` the run's verdict."""
    return table_of(judge(run, min_steps), show_skipped)


def table_of(verdict: Verdict, show_skipped: bool = False) -> str:
    """A rich table: one row per patch per process. Every text in it comes from records (a third party's exception
    text, a path, a patch file's words): it is given to rich as `Text` with control characters made visible
    (`terminal_text`), never as markup."""
    from rich.console import Console
    from rich.table import Table

    import io

    console = Console(file=io.StringIO(), record=True, width=160, force_terminal=False, color_system=None,
                      markup=False, emoji=False, highlight=False)

    def say(text: str) -> None:
        console.print(rich_text(text))

    run = verdict.run
    if run is None or (not run.processes and not run.refused):
        say("vllm-patchkit: no records (has a server with the plugin run as this user?)")
        for why in (run.storage if run is not None else []):
            say(f"  problem: {why}")
        return console.export_text()
    table = Table(title=rich_text(f"vllm-patchkit status — run {run.run_id}", newlines=False), show_lines=False)
    for col in ("process", "set", "patch", "state", "calls", "reason / detail"):
        table.add_column(col, overflow="fold")
    counts: dict[str, int] = {}
    for pv in verdict.processes:
        label = _label(pv)
        for row in pv.rows:
            counts[row.record.state.value] = counts.get(row.record.state.value, 0) + 1
            if not (row.shown or show_skipped):
                continue
            table.add_row(*(rich_text(cell) for cell in (label, row.record.patch_set or "-", row.record.patch,
                                                          *_cells(row))))
            label = ""
    console.print(table)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    hidden = "" if show_skipped else " (patches skipped as not for a process are hidden; --all shows them)"
    warned = verdict.warning_lines()
    say(f"{len(run.processes)} processes; {summary}; {'OK' if verdict.ok else 'PROBLEMS'}"
        f"{f' with {len(warned)} warning(s)' if warned else ''}{hidden}")
    for pv in verdict.processes:
        for source, names in sorted(pv.record.counters.items()):
            shown = ", ".join(f"{k} {v}" for k, v in sorted(names.items()))
            say(f"{pv.record.role} {pv.record.pid}: {source}: {shown}")
    for pv in verdict.processes:
        if pv.record.error:
            say(f"start-up stopped in {pv.record.who}:\n  {pv.record.error}")
    for p in verdict.problem_lines():
        say(f"  problem: {p}")
    for w in warned:
        say(f"  warning: {w}")
    return console.export_text()

"""Report: one server run's records rendered as `vllm-patchkit status` prints them (table or JSON), with the
exit code of the verdict (`verdict`). Usable from CI and as a readiness probe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.kinds import installs_function
from vllm_patchkit.reporting.run_folder import Run, load_run
from vllm_patchkit.reporting.terminal_text import rich_text
from vllm_patchkit.reporting.verdict import (OK, assess, ends, is_inert, never_applied, raised_words, unwritten,
                                             verified_against, warnings_of)


def to_json(run: Optional[Run], min_steps: int = 8) -> str:
    code, problems = assess(run, min_steps)
    ended = ends(run)[0]
    return json.dumps(
        {
            "run_id": run.run_id if run else None,
            "exit_code": code,
            "problems": problems,
            "warnings": warnings_of(run),
            "refused": run.refused if run else [],
            "processes": [{**p, "ended": ended.get(i)} for i, p in enumerate(run.processes)] if run else [],
        },
        indent=1,
    )


def report(base: Path, run_id: Optional[str] = None, min_steps: int = 8) -> tuple[str, int]:
    """Exactly what `vllm-patchkit status --json [--run RUN] [--min-steps N]` prints for `base`, and its exit
    code, from one read of the records: the API server's /patchkit/status serves this, so the probe and
    the CLI cannot disagree."""
    run = load_run(base, run_id)
    return to_json(run, min_steps), assess(run, min_steps)[0]


def render(run: Optional[Run], min_steps: int = 8, show_skipped: bool = False) -> str:
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

    if run is None or (not run.processes and not run.refused):
        say("vllm-patchkit: no records (has a server with the plugin run as this user?)")
        for why in (run.storage if run is not None else []):
            say(f"  problem: {why}")
        return console.export_text()
    table = Table(title=rich_text(f"vllm-patchkit status — run {run.run_id}", newlines=False), show_lines=False)
    run_steps = max((p.get("steps") or 0 for p in run.processes), default=0) or None
    for col in ("process", "set", "patch", "state", "calls", "reason / detail"):
        table.add_column(col, overflow="fold")
    nowhere = never_applied(run)
    ended = ends(run)[0]
    for i, proc in enumerate(run.processes):
        steps = proc.get("steps")
        if steps is None:
            steps = run_steps
        hosts = proc.get("hosts")
        hosted = ("+" + "+".join(h for h in hosts if isinstance(h, str))) if isinstance(hosts, list) and hosts else ""
        label = f"{proc['role']}{hosted} {proc['pid']}" + (f"\n{steps} steps" if proc.get("steps") is not None else "")
        if unwritten(proc, ended.get(i, {})):
            label += "\nrecord STALE"  # the problem line itself comes from assess()
        for rec in proc.get("patches", []):
            if not show_skipped and rec.get("state") == "skipped" and rec.get("code") == "process":
                continue
            state = rec.get("state", "?")
            if rec.get("required") and rec.get("state") == "pending" and (proc.get("steps") or 0) > 0:
                state = "pending, NEVER JUDGED"  # the problem line itself comes from assess()
            if is_inert(rec, steps, min_steps):
                state = "applied, INERT"
            if rec.get("state") == "not_imported" and rec.get("patch") in nowhere:
                state += ", APPLIED NOWHERE"  # required, and applied in no process of the run
            if any(f.get("code") == "shadowed" for f in rec.get("findings") or []):
                state += ", SHADOWED"
            if rec.get("warning") or verified_against(rec):
                state += ", WARNING"
            raised = raised_words(rec)
            if raised:
                state += ", RAISED"
            reason = "; ".join(x for x in (raised, rec.get("reason") or "") if x)
            if rec.get("state") in ("failed", "refused") and rec.get("code") != "refused" and \
                    (rec.get("expected") is not None or rec.get("found") is not None):
                reason += f" [expected: {rec.get('expected')}; found: {rec.get('found')}]"
            detail = rec.get("detail") or {}
            extra = "; ".join(f"{k}: {v}" for k, v in detail.items() if k not in ("warned", "decided", "remedy"))
            for f in rec.get("findings") or []:
                extra += ("; " if extra else "") + f"{f.get('code')}: {f.get('where', '')}"
            passed = [e for e in rec.get("exceptions") or [] if e.get("passed_through")]
            if rec.get("passed_through"):
                extra += ("; " if extra else "") + (f"{rec['passed_through']} exception(s) of vLLM's own code passed "
                                                    "through (not the patch's)")
                extra += f": {passed[0].get('type')}: {passed[0].get('message')}" if passed else ""
            counted = installs_function(rec.get("kind")) and rec.get("state") == "applied"
            calls = str(rec.get("calls", 0)) if counted else "-"
            if counted and rec.get("raised"):
                calls += f" ({rec['raised']} raised)"
            table.add_row(*(rich_text(cell) for cell in (label, rec.get("patch_set") or "-", rec["patch"], state, calls,
                                                          "; ".join(str(x) for x in (reason, extra) if x))))
            label = ""
    console.print(table)
    code, problems = assess(run, min_steps)
    counts: dict[str, int] = {}
    for proc in run.processes:
        for rec in proc.get("patches", []):
            counts[rec.get("state", "?")] = counts.get(rec.get("state", "?"), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    hidden = "" if show_skipped else " (patches skipped as not for a process are hidden; --all shows them)"
    say(f"{len(run.processes)} processes; {summary}; {'OK' if code == OK else 'PROBLEMS'}"
                  f"{f' with {len(warnings_of(run))} warning(s)' if warnings_of(run) else ''}{hidden}")
    for proc in run.processes:
        for source, names in sorted((proc.get("counters") or {}).items()):
            shown = ", ".join(f"{k} {v}" for k, v in sorted(names.items()))
            say(f"{proc.get('role')} {proc.get('pid')}: {source}: {shown}")
    for proc in run.processes:
        if proc.get("error"):
            say(f"start-up stopped in {proc.get('role')} (pid {proc.get('pid')}):\n  {proc['error']}")
    for p in problems:
        say(f"  problem: {p}")
    for w in warnings_of(run):
        say(f"  warning: {w}")
    return console.export_text()

"""The verdict on one run, computed once: each row's state, how each process ended, the problems and warnings.

Exit codes: 0 all good; 1 a required patch failed / was refused / is inert / was
`not_imported` in every process that needed it and applied in none / raised out of its own code; a live
process's record is stale or not persisted; the status folder's file system is full; 2 no records.

Why apart from reading (`run_folder`) and rendering (`status`, `metrics`, `route`): the table, the JSON, the
readiness probe and the metrics must judge a run by one rule, so the rule is written once, here, over the
typed records (`verdict_values.SeenProcess`), and its result is values (`verdict_values.Verdict`) they render.
"""

from __future__ import annotations

import time
from typing import Optional

import msgspec

from vllm_patchkit.declaration.kinds import installs_function
from vllm_patchkit.reporting.run_folder import Run
from vllm_patchkit.reporting.verdict_values import (BAD, NONE, OK, End, Ending, Mark, Problem, ProblemCode,
                                                    ProcessVerdict, Row, RowState, RunWarning, SeenProcess,
                                                    Verdict, WarningCode)
from vllm_patchkit.runtime.nearest import VERIFIED_AGAINST
from vllm_patchkit.runtime.record import PatchRecord, State

__all__ = ["OK", "BAD", "NONE", "judge", "assess", "warnings_of", "STALE_SLACK_SECONDS"]

#: Seconds a live process's record may be older than its flusher's promise (`refresh_seconds` plus two
#: intervals) before it is stale: a loaded machine delays a flush, it does not stop it.
STALE_SLACK_SECONDS = 10.0
#: Skipped with these codes: needed here, but this release cannot apply it (/metrics: `not_applicable`).
_NOT_APPLICABLE = ("unavailable", "unpatched_allowed")
_NOT_APPLIED = (State.failed, State.refused)
_REQUIRED_NOT_APPLIED = {State.failed: ProblemCode.required_failed, State.refused: ProblemCode.required_refused}


def _clock(t) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError):
        return str(t)


def _signame(sig) -> str:
    import signal as signal_mod

    try:
        return f"signal {int(sig)} ({signal_mod.Signals(int(sig)).name})"
    except (ValueError, TypeError):
        return f"signal {sig}"


def _raised_words(rec: PatchRecord) -> Optional[str]:
    """What a patch's own code raised (not what vLLM's original raised through it), in one line; None if nothing."""
    if not rec.raised:
        return None
    own = sorted((e for e in rec.exceptions if not e.get("passed_through")), key=lambda e: -(e.get("count") or 0))
    words = f"its implementation raised {rec.raised} exception(s)" + (f" in {rec.calls} call(s)" if rec.calls else "")
    if own:
        e = own[0]
        words += f": {e.get('type')}: {e.get('message')} (at {e.get('at')}"
        words += f", raised in {e['raised_in']})" if e.get("raised_in") else ")"
        if len(own) > 1:
            words += f" and {len(own) - 1} other kind(s)"
    return words


def _verified_against(rec: PatchRecord) -> Optional[str]:
    """An applied patch verified against the pins of another release (no manifest pins the running one):
    "the pins of 0.31.0 on 0.31.1" (runtime/nearest.py writes it). A warning, never a silent OK."""
    said = rec.detail.get(VERIFIED_AGAINST)
    return said if rec.state == State.applied and isinstance(said, str) else None


def _end_of(proc: SeenProcess) -> tuple[End, bool]:
    """How one process ended, as far as this host can tell, and whether a vanished/killed process is a candidate
    problem (judged by the run's rule in `_ends`)."""
    from vllm_patchkit.runtime.process import HOSTNAME, boot_id, liveness

    sig = proc.end_signal
    if proc.end == "clean":
        return End(Ending.clean, sig, "exited normally" + (f" after {_signame(sig)}" if sig else "")), False
    if proc.start_ticks is None:  # an older record, or a loader made by hand: no identity to check
        return End(Ending.unknown, None, "no end written and no process identity recorded"), False
    if proc.hostname not in (None, HOSTNAME) or (proc.host is not None and proc.host != HOSTNAME) or \
            proc.boot_id not in (None, boot_id()):
        return End(Ending.unknown, None, "on another host (or before a reboot): not checked here"), False
    live, zombie_sig = liveness(int(proc.pid), proc.start_ticks)
    if live == "alive":
        return End(Ending.running, None, "running"), False
    if proc.end == "signal":
        return End(Ending.signal, sig, f"received {_signame(sig)} and never reached its exit (then killed)"), True
    if zombie_sig:
        return End(Ending.signal, zombie_sig, f"vanished without writing its end: killed by {_signame(zombie_sig)}"), True
    why = "vanished without writing its end (killed by a signal it cannot catch, e.g. SIGKILL, or crashed)"
    if live == "reused":
        why += "; its pid now belongs to another process"
    return End(Ending.unknown, None, why), True


def _last_raise(proc: SeenProcess) -> Optional[str]:
    """The newest exception a patch's own code raised in this process: what was in flight when it died."""
    newest = None
    for rec in proc.patches:
        for e in rec.exceptions:
            if not e.get("passed_through") and (newest is None or (e.get("last") or 0) > (newest[1].get("last") or 0)):
                newest = (rec.patch, e)
    if newest is None:
        return None
    key, e = newest
    return f"the last exception out of a patch: {key} raised {e.get('type')}: {e.get('message')} (at {e.get('at')}) " \
           f"at {_clock(e.get('last'))}"


def _ends(procs: list[SeenProcess]) -> tuple[list[End], list[Problem]]:
    """Each process's end, with the run's rule applied, and the problems.

    A process that vanished or died by a signal is a problem, unless the run's front end recorded a clean stop
    (SIGTERM/SIGINT to the API server: its `shutdown`) and the process was alive at that moment: vLLM then
    stops EngineCore and the workers itself (it force-kills them). A running EngineCore or worker whose parent
    process of the run is gone is orphaned: a problem too. Processes with a start-up `error` are reported by it.
    """
    out: list[End] = []
    problems: list[Problem] = []
    stops = [p.shutdown for p in procs if p.role == "frontend" and isinstance(p.shutdown, dict)]
    alive_at_stop = {pid for st in stops for pid in st.get("alive") or []}
    for proc in procs:
        e, judged = _end_of(proc)
        out.append(e)
        if not judged or proc.error:
            continue
        e.gone = True
        last = _last_raise(proc)
        if last:
            e.why += f"; {last}"
        if stops and (proc.pid in alive_at_stop or isinstance(proc.shutdown, dict)):
            e.why += f"; stopped with the run (alive when the clean stop by {_signame(stops[0].get('signal'))} began)"
            e.stopped_with_run = True
            continue
        when = ("before the clean stop of the server began" if stops else
                "while the run was serving (no clean stop of the server was recorded)")
        problems.append(Problem(ProblemCode.process_gone, f"{proc.who} {e.why}, {when}", (proc.who,)))
    by_pid = {p.pid: i for i, p in enumerate(procs) if p.host is None}
    for i, proc in enumerate(procs):
        if out[i].state != Ending.running or proc.role == "frontend" or proc.ppid not in by_pid:
            continue
        j = by_pid[proc.ppid]
        if j != i and (out[j].state in (Ending.clean, Ending.signal) or out[j].gone):
            parent = procs[j]
            out[i].orphaned = True
            problems.append(Problem(ProblemCode.orphaned, f"{proc.who} is orphaned: it still runs while its parent "
                                    f"{parent.who} is gone ({out[j].why})", (proc.who, parent.who)))
    return out, problems


def _unwritten(proc: SeenProcess, end: End, now: Optional[float]) -> Optional[tuple[ProblemCode, str]]:
    """Why a running process's record shows not its newest state (flush.py's promise broken), or None."""
    if proc.unpersisted_since is not None:  # an in-memory record (a gathered answer) says it itself
        return ProblemCode.unpersisted_record, (
            f"records of {proc.who} not persisted since {_clock(proc.unpersisted_since)} "
            f"({proc.write_failures} failed write(s), last: {proc.write_error})")
    refresh, flush = proc.refresh_seconds, proc.flush_seconds
    if end.state != Ending.running or not refresh or not proc.updated:
        return None
    age = (now if now is not None else time.time()) - float(proc.updated)
    if age <= float(refresh) + 2 * float(flush or 0) + STALE_SLACK_SECONDS:
        return None
    return ProblemCode.stale_record, (
        f"record of {proc.who} is stale: last written {age:.0f} s ago at {_clock(proc.updated)} while the "
        f"process runs (it rewrites it at least every {float(refresh):g} s): its newest state is not on disk "
        "(its log says why: 'cannot write records to'; a full disk or an unwritable status folder), so its "
        "rows show the state of then")


def _never_applied(procs: list[SeenProcess]) -> dict[str, list[str]]:
    """Required patches `not_imported` in every process of the run that needed them and applied in none:
    patch key -> the processes ("role (pid N)") that waited for the module.

    `not_imported` alone is honest about one process (the code it changes never ran there), but a required
    fix applied nowhere in the whole run is not in effect anywhere: the target module may have moved, so
    vLLM runs other code unpatched. That must never read as OK.
    """
    waited: dict[str, list[str]] = {}
    applied: set[str] = set()
    for proc in procs:
        for rec in proc.patches:
            if rec.required and rec.state == State.not_imported:
                waited.setdefault(rec.patch, []).append(proc.who)
            elif rec.required and rec.state == State.applied:
                applied.add(rec.patch)
    return {key: where for key, where in waited.items() if key not in applied}


def _row(proc: SeenProcess, rec: PatchRecord, steps: Optional[int], min_steps: int, nowhere: dict,
         problems: list[Problem]) -> Row:
    """One patch in one process judged; its problems appended to `problems` in the order `status` prints them."""
    def said(code: ProblemCode, words: str) -> None:
        problems.append(Problem(code, f"{rec.patch} in {proc.who}: {words}", (proc.who,), rec.patch))

    raised = _raised_words(rec)
    never_judged = rec.required and rec.state == State.pending and (proc.steps or 0) > 0
    inert = (rec.state == State.applied and rec.expected_calls == "per_step" and rec.calls == 0
             and steps is not None and steps >= min_steps)
    shadowed = any(f.get("code") == "shadowed" for f in rec.findings)
    if rec.required and rec.state in _NOT_APPLIED:
        said(_REQUIRED_NOT_APPLIED[rec.state], f"required patch {rec.state.value}: {rec.reason}")
    if rec.required and raised:
        said(ProblemCode.required_raised, f"required patch: {raised}")
    if never_judged:
        said(ProblemCode.never_judged, f"required patch never judged: the process ran {proc.steps} steps but its "
             "config-ready point never ran (check the core.config-ready.* row)")
    if inert:
        said(ProblemCode.inert, f"inert (0 calls after {steps} steps)")
    for f in rec.findings:
        if f.get("code") == "shadowed":
            said(ProblemCode.shadowed, f"shadowed by {f.get('by')} (can never run)")
        if (f.get("code") == "stale_copy" and rec.required and rec.state == State.applied
                and str(f.get("where", "")).startswith("vllm.")):
            # vLLM's own module calls the original through it: the required patch is bypassed there
            said(ProblemCode.stale_copy, f"stale copy at {f['where']}: vLLM calls the original through it, bypassing "
                 "this required patch (declare it in `copies`; `vllm-patchkit check` lists every such copy as "
                 "copy_undeclared)")
    marks = tuple(m for m, on in ((Mark.never_judged, never_judged), (Mark.inert, inert),
                                  (Mark.applied_nowhere, rec.state == State.not_imported and rec.patch in nowhere),
                                  (Mark.shadowed, shadowed),
                                  (Mark.warning, bool(rec.warning or _verified_against(rec))),
                                  (Mark.raised, raised is not None)) if on)
    if shadowed:
        state = RowState.shadowed
    elif inert:
        state = RowState.inert
    elif rec.state == State.applied and rec.raised:
        state = RowState.raised
    elif rec.state == State.skipped and rec.code in _NOT_APPLICABLE:
        state = RowState.not_applicable
    else:
        state = RowState(rec.state.value)
    return Row(rec, state, marks, shown=not (rec.state == State.skipped and rec.code == "process"),
               counted=installs_function(rec.kind) and rec.state == State.applied, raised=raised,
               evidence=(rec.state in _NOT_APPLIED and rec.code != "refused"
                         and (rec.expected is not None or rec.found is not None)))


def _warnings(run: Optional[Run], judged: list[ProcessVerdict]) -> list[RunWarning]:
    """What an operator must see but that does not fail the run: needed optional patches not
    applied, required ones served without by explicit permission, no exact manifest, each patch verified against
    the pins of the nearest pinned release (one line per patch, naming every process it applied in)."""
    if run is None:
        return []
    out = [RunWarning(WarningCode.run, w) for w in run.warnings]
    out += [RunWarning(WarningCode.refused_record, r) for r in run.refused if r not in run.warnings]
    nearest: dict[tuple[str, str], list[str]] = {}
    for pv in judged:
        proc = pv.record
        if proc.host is not None and proc.unpersisted_since is not None:
            # answered live over RPC: its rows are the process's state now, so a failed write of its file
            # leaves the folder, not this answer, behind (a warning, never a problem)
            out.append(RunWarning(WarningCode.live_unpersisted, f"{pv.unwritten}: this answer is live, but "
                                  "`vllm-patchkit status` reading the folder shows an older state of it", (proc.who,)))
        for w in proc.warnings:
            if w not in [x.words for x in out]:
                out.append(RunWarning(WarningCode.process, w, (proc.who,)))
        for row in pv.rows:
            rec = row.record
            if rec.warning:
                out.append(RunWarning(WarningCode.patch, f"{rec.patch} in {proc.who}: {rec.warning}", (proc.who,),
                                      rec.patch))
            if not rec.required and row.raised:
                out.append(RunWarning(WarningCode.optional_raised, f"{rec.patch} in {proc.who}: optional patch: "
                                      f"{row.raised}", (proc.who,), rec.patch))
            said = _verified_against(rec)
            if said is not None:
                nearest.setdefault((rec.patch, said), []).append(proc.who)
    out += [RunWarning(WarningCode.verified_against, f"{key} in {', '.join(where)}: verified against {said}",
                       tuple(where), key) for (key, said), where in nearest.items()]
    return out


def seen(run: Run) -> list[SeenProcess]:
    """The run's process records typed (each was validated when read or gathered, so this cannot fail on them)."""
    return [msgspec.convert(p, SeenProcess) for p in run.processes]


def judge(run: Optional[Run], min_steps: int = 8, now: Optional[float] = None) -> Verdict:
    """The run's verdict: every row judged, every process's end, the problems (in the order `status` prints
    them: storage, per process, applied nowhere, ends) and the warnings; `now` for the staleness of records."""
    if run is None or not run.processes:
        problems = [Problem(ProblemCode.no_records, "no records")]
        problems += [Problem(ProblemCode.storage_full, w) for w in (run.storage if run is not None else [])]
        return Verdict(run, NONE, problems, _warnings(run, []))
    procs = seen(run)
    problems = [Problem(ProblemCode.storage_full, w) for w in run.storage]
    ended, end_problems = _ends(procs)
    nowhere = _never_applied(procs)
    run_steps = max((p.steps or 0 for p in procs), default=0) or None
    judged: list[ProcessVerdict] = []
    for proc, end in zip(procs, ended):
        stale = _unwritten(proc, end, now)
        pv = ProcessVerdict(proc, end, proc.steps if proc.steps is not None else run_steps,
                            stale[1] if stale else None)
        judged.append(pv)
        if stale and not (proc.host is not None and proc.unpersisted_since is not None):
            problems.append(Problem(stale[0], stale[1], (proc.who,)))
        if proc.error and not any(r.required and r.state in _NOT_APPLIED for r in proc.patches):
            problems.append(Problem(ProblemCode.startup_stopped, f"start-up stopped in {proc.who}: {proc.error}",
                                    (proc.who,)))
        pv.rows = [_row(proc, rec, pv.steps, min_steps, nowhere, problems) for rec in proc.patches]
    for key, where in nowhere.items():
        problems.append(Problem(ProblemCode.applied_nowhere, (
            f"{key}: required patch applied in no process of this run: not_imported in every process "
            f"that needed it ({', '.join(where)}): its target module was never imported there, so it was "
            "never verified nor installed; if vLLM ran that code path it ran unpatched (a moved target, "
            "or start-up has not imported it yet)"), tuple(where), key))
    problems += end_problems
    return Verdict(run, BAD if problems else OK, problems, _warnings(run, judged), judged)


def assess(run: Optional[Run], min_steps: int = 8) -> tuple[int, list[str]]:
    """The verdict's exit code and problems' words (for callers that need only these: CI, tests)."""
    v = judge(run, min_steps)
    return v.exit_code, v.problem_lines()


def warnings_of(run: Optional[Run]) -> list[str]:
    """The verdict's warnings' words."""
    return judge(run).warning_lines()

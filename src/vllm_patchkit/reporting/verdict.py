"""The verdict on one run: its exit code and the problems behind it, its warnings, how each process ended.

Exit codes: 0 all good; 1 a required patch failed / was refused / is inert / was
`not_imported` in every process that needed it and applied in none / raised out of its own code; a live
process's record is stale or not persisted; the status folder's file system is full; 2 no records.

Why apart from reading (`run_folder`) and rendering (`status`): the table, the JSON, the readiness probe and
the metrics must judge a run by one rule, so the rule is written once, over the records as read.
"""

from __future__ import annotations

from typing import Optional

from vllm_patchkit.reporting.run_folder import Run
from vllm_patchkit.runtime.nearest import VERIFIED_AGAINST

OK, BAD, NONE = 0, 1, 2
#: Seconds a live process's record may be older than its flusher's promise (`refresh_seconds` plus two
#: intervals) before it is stale: a loaded machine delays a flush, it does not stop it.
STALE_SLACK_SECONDS = 10.0


def raised_words(rec: dict) -> Optional[str]:
    """What a patch's own code raised (not what vLLM's original raised through it), in one line; None if nothing."""
    n = rec.get("raised") or 0
    if not n:
        return None
    own = [e for e in rec.get("exceptions") or [] if not e.get("passed_through")]
    own.sort(key=lambda e: -(e.get("count") or 0))
    calls = rec.get("calls")
    words = f"its implementation raised {n} exception(s)" + (f" in {calls} call(s)" if calls else "")
    if own:
        e = own[0]
        words += f": {e.get('type')}: {e.get('message')} (at {e.get('at')}"
        words += f", raised in {e['raised_in']})" if e.get("raised_in") else ")"
        if len(own) > 1:
            words += f" and {len(own) - 1} other kind(s)"
    return words


def _clock(t) -> str:
    import time

    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError):
        return str(t)


def unwritten(proc: dict, end: dict, now: Optional[float] = None) -> Optional[str]:
    """Why a running process's record shows not its newest state (flush.py's promise broken), or None."""
    import time

    who = f"{proc.get('role')} (pid {proc.get('pid')})"
    if proc.get("unpersisted_since") is not None:  # an in-memory record (a gathered answer) says it itself
        return (f"records of {who} not persisted since {_clock(proc['unpersisted_since'])} "
                f"({proc.get('write_failures')} failed write(s), last: {proc.get('write_error')})")
    refresh, flush = proc.get("refresh_seconds"), proc.get("flush_seconds")
    if end.get("state") != "running" or not refresh or not proc.get("updated"):
        return None
    age = (now if now is not None else time.time()) - float(proc["updated"])
    allowed = float(refresh) + 2 * float(flush or 0) + STALE_SLACK_SECONDS
    if age <= allowed:
        return None
    return (f"record of {who} is stale: last written {age:.0f} s ago at {_clock(proc['updated'])} while the "
            f"process runs (it rewrites it at least every {float(refresh):g} s): its newest state is not on disk "
            "(its log says why: 'cannot write records to'; a full disk or an unwritable status folder), so its "
            "rows show the state of then")


def gathered_live(proc: dict) -> bool:
    """A record answered live over RPC (gather.py marks it with its host): its rows are the process's state now,
    so a failed write of its file leaves the folder, not this answer, behind (a warning, never a problem)."""
    return "host" in proc and proc.get("unpersisted_since") is not None


def is_inert(rec: dict, steps: Optional[int], min_steps: int) -> bool:
    """A per-step patch that has not run once after the engine ran enough steps."""
    return (
        rec.get("state") == "applied"
        and rec.get("expected_calls") == "per_step"
        and rec.get("calls", 0) == 0
        and steps is not None
        and steps >= min_steps
    )


def never_applied(run: Optional[Run]) -> dict[str, list[str]]:
    """Required patches `not_imported` in every process of the run that needed them and applied in none:
    patch key -> the processes ("role (pid N)") that waited for the module.

    `not_imported` alone is honest about one process (the code it changes never ran there), but a required
    fix applied nowhere in the whole run is not in effect anywhere: the target module may have moved, so
    vLLM runs other code unpatched. That must never read as OK.
    """
    waited: dict[str, list[str]] = {}
    applied: set[str] = set()
    for proc in (run.processes if run else []):
        for rec in proc.get("patches", []):
            if not rec.get("required"):
                continue
            if rec.get("state") == "not_imported":
                waited.setdefault(rec["patch"], []).append(f"{proc.get('role')} (pid {proc.get('pid')})")
            elif rec.get("state") == "applied":
                applied.add(rec["patch"])
    return {key: where for key, where in waited.items() if key not in applied}


def _signame(sig) -> str:
    import signal as signal_mod

    try:
        return f"signal {int(sig)} ({signal_mod.Signals(int(sig)).name})"
    except (ValueError, TypeError):
        return f"signal {sig}"


def end_of(proc: dict) -> dict:
    """How one process ended, as far as this host can tell: {"state": running | clean | signal | unknown,
    "signal": N or None, "why": words, "judged": True when a vanished/killed process is a candidate problem}."""
    from vllm_patchkit.runtime.process import HOSTNAME, boot_id, liveness

    sig = proc.get("end_signal")
    if proc.get("end") == "clean":
        return {"state": "clean", "signal": sig,
                "why": "exited normally" + (f" after {_signame(sig)}" if sig else "")}
    if proc.get("start_ticks") is None:  # an older record, or a loader made by hand: no identity to check
        return {"state": "unknown", "signal": None, "why": "no end written and no process identity recorded"}
    if proc.get("hostname") not in (None, HOSTNAME) or ("host" in proc and proc["host"] != HOSTNAME) or \
            proc.get("boot_id") not in (None, boot_id()):
        return {"state": "unknown", "signal": None, "why": "on another host (or before a reboot): not checked here"}
    live, zombie_sig = liveness(int(proc.get("pid", 0)), proc.get("start_ticks"))
    if live == "alive":
        return {"state": "running", "signal": None, "why": "running"}
    if proc.get("end") == "signal":
        return {"state": "signal", "signal": sig, "judged": True,
                "why": f"received {_signame(sig)} and never reached its exit (then killed)"}
    if zombie_sig:
        return {"state": "signal", "signal": zombie_sig, "judged": True,
                "why": f"vanished without writing its end: killed by {_signame(zombie_sig)}"}
    why = "vanished without writing its end (killed by a signal it cannot catch, e.g. SIGKILL, or crashed)"
    if live == "reused":
        why += "; its pid now belongs to another process"
    return {"state": "unknown", "signal": None, "judged": True, "why": why}


def _last_raise(proc: dict) -> Optional[str]:
    """The newest exception a patch's own code raised in this process: what was in flight when it died."""
    newest = None
    for rec in proc.get("patches", []):
        for e in rec.get("exceptions") or []:
            if not e.get("passed_through") and (newest is None or (e.get("last") or 0) > (newest[1].get("last") or 0)):
                newest = (rec.get("patch"), e)
    if newest is None:
        return None
    key, e = newest
    return f"the last exception out of a patch: {key} raised {e.get('type')}: {e.get('message')} (at {e.get('at')}) " \
           f"at {_clock(e.get('last'))}"


def ends(run: Optional[Run]) -> tuple[dict[int, dict], list[str]]:
    """Each process's end (by index in run.processes), with the run's rule applied, and the problems.

    A process that vanished or died by a signal is a problem, unless the run's front end recorded a clean stop
    (SIGTERM/SIGINT to the API server: its `shutdown`) and the process was alive at that moment: vLLM then
    stops EngineCore and the workers itself (it force-kills them). A running EngineCore or worker whose parent
    process of the run is gone is orphaned: a problem too. Processes with a start-up `error` are reported by it.
    """
    out: dict[int, dict] = {}
    problems: list[str] = []
    if run is None:
        return out, problems
    stops = [p["shutdown"] for p in run.processes if p.get("role") == "frontend" and isinstance(p.get("shutdown"), dict)]
    alive_at_stop = {pid for st in stops for pid in st.get("alive") or []}
    for i, proc in enumerate(run.processes):
        e = out[i] = end_of(proc)
        who = f"{proc.get('role')} (pid {proc.get('pid')})"
        if not e.pop("judged", False) or proc.get("error"):
            continue
        e["gone"] = True
        last = _last_raise(proc)
        if last:
            e["why"] += f"; {last}"
        if stops and (proc.get("pid") in alive_at_stop or isinstance(proc.get("shutdown"), dict)):
            e["why"] += f"; stopped with the run (alive when the clean stop by {_signame(stops[0].get('signal'))} began)"
            e["stopped_with_run"] = True
            continue
        when = ("before the clean stop of the server began" if stops else
                "while the run was serving (no clean stop of the server was recorded)")
        problems.append(f"{who} {e['why']}, {when}")
    by_pid = {p.get("pid"): i for i, p in enumerate(run.processes) if "host" not in p}
    for i, proc in enumerate(run.processes):
        if out[i]["state"] != "running" or proc.get("role") == "frontend" or proc.get("ppid") not in by_pid:
            continue
        j = by_pid[proc["ppid"]]
        if j != i and (out[j]["state"] in ("clean", "signal") or out[j].get("gone")):
            parent = run.processes[j]
            out[i]["orphaned"] = True
            problems.append(f"{proc.get('role')} (pid {proc.get('pid')}) is orphaned: it still runs while its parent "
                            f"{parent.get('role')} (pid {parent.get('pid')}) is gone ({out[j]['why']})")
    return out, problems


def assess(run: Optional[Run], min_steps: int = 8) -> tuple[int, list[str]]:
    """Exit code and the problems behind it."""
    if run is None or not run.processes:
        return NONE, ["no records"] + (list(run.storage) if run is not None else [])
    problems = list(run.storage)
    ended = ends(run)
    run_steps = max((p.get("steps") or 0 for p in run.processes), default=0) or None
    for i, proc in enumerate(run.processes):
        stale = unwritten(proc, ended[0].get(i, {}))
        if stale and not gathered_live(proc):
            problems.append(stale)
        steps = proc.get("steps")
        if steps is None:
            steps = run_steps
        rows_say_it = any(r.get("required") and r.get("state") in ("failed", "refused") for r in proc.get("patches", []))
        if proc.get("error") and not rows_say_it:
            problems.append(f"start-up stopped in {proc.get('role')} (pid {proc.get('pid')}): {proc['error']}")
        for rec in proc.get("patches", []):
            where = f"{rec['patch']} in {proc['role']} (pid {proc['pid']})"
            if rec.get("required") and rec.get("state") in ("failed", "refused"):
                problems.append(f"{where}: required patch {rec['state']}: {rec.get('reason')}")
            if rec.get("required") and raised_words(rec):
                problems.append(f"{where}: required patch: {raised_words(rec)}")
            if rec.get("required") and rec.get("state") == "pending" and (proc.get("steps") or 0) > 0:
                problems.append(f"{where}: required patch never judged: the process ran {proc['steps']} steps "
                                "but its config-ready point never ran (check the core.config-ready.* row)")
            if is_inert(rec, steps, min_steps):
                problems.append(f"{where}: inert (0 calls after {steps} steps)")
            for f in rec.get("findings") or []:
                if f.get("code") == "shadowed":
                    problems.append(f"{where}: shadowed by {f.get('by')} (can never run)")
                if (f.get("code") == "stale_copy" and rec.get("required") and rec.get("state") == "applied"
                        and str(f.get("where", "")).startswith("vllm.")):
                    # vLLM's own module calls the original through it: the required patch is bypassed there
                    problems.append(f"{where}: stale copy at {f['where']}: vLLM calls the original through it, "
                                    "bypassing this required patch (declare it in `copies`; `vllm-patchkit check` "
                                    "lists every such copy as copy_undeclared)")
    for key, where in never_applied(run).items():
        problems.append(f"{key}: required patch applied in no process of this run: not_imported in every process "
                        f"that needed it ({', '.join(where)}): its target module was never imported there, so it was "
                        "never verified nor installed; if vLLM ran that code path it ran unpatched (a moved target, "
                        "or start-up has not imported it yet)")
    problems += ended[1]
    return (BAD if problems else OK), problems


def verified_against(rec: dict) -> Optional[str]:
    """An applied patch verified against the pins of another release (no manifest pins the running one):
    "the pins of 0.31.0 on 0.31.1" (runtime/nearest.py writes it). A warning, never a silent OK."""
    said = (rec.get("detail") or {}).get(VERIFIED_AGAINST)
    return said if rec.get("state") == "applied" and isinstance(said, str) else None


def warnings_of(run: Optional[Run]) -> list[str]:
    """What an operator must see but that does not fail the run: needed optional patches not
    applied, required ones served without by explicit permission, no exact manifest, each patch verified against
    the pins of the nearest pinned release (one line per patch, naming every process it applied in)."""
    if run is None:
        return []
    out = list(run.warnings) + [r for r in run.refused if r not in run.warnings]
    nearest: dict[tuple[str, str], list[str]] = {}
    for proc in run.processes:
        if gathered_live(proc):
            out.append(f"{unwritten(proc, {})}: this answer is live, but `vllm-patchkit status` reading the "
                       "folder shows an older state of it")
        for w in proc.get("warnings") or []:
            if w not in out:
                out.append(w)
        for rec in proc.get("patches", []):
            if rec.get("warning"):
                out.append(f"{rec['patch']} in {proc.get('role')} (pid {proc.get('pid')}): {rec['warning']}")
            if not rec.get("required") and raised_words(rec):
                out.append(f"{rec['patch']} in {proc.get('role')} (pid {proc.get('pid')}): optional patch: "
                           f"{raised_words(rec)}")
            said = verified_against(rec)
            if said is not None:
                nearest.setdefault((rec["patch"], said), []).append(f"{proc.get('role')} (pid {proc.get('pid')})")
    out += [f"{key} in {', '.join(where)}: verified against {said}" for (key, said), where in nearest.items()]
    return out

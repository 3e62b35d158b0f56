"""Report: read one server run's records and render them (table or JSON), with an exit code.

Exit codes: 0 all good; 1 a required patch failed / was refused / is inert / was
`not_imported` in every process that needed it and applied in none; 2 no records.
Usable from CI and as a readiness probe.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vllm_patchkit.upstream.files import trusted_folder, uid
from vllm_patchkit.runtime.record import SCHEMA_VERSION, ProcessRecord

log = logging.getLogger("vllm.patchkit")

OK, BAD, NONE = 0, 1, 2


@dataclass
class Run:
    run_id: str
    processes: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # record files not read, each with why (also warnings)


#: The largest record file `status` reads, in bytes (a record of a process with every patch of a big set is
#: tens of kB); a larger file is refused by its size, without reading it. Override: VLLM_PATCHKIT_MAX_RECORD_BYTES.
MAX_RECORD_ENV = "VLLM_PATCHKIT_MAX_RECORD_BYTES"
DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024
#: Record files read per run at most (a server has a front end, EngineCore(s) and a worker per GPU).
MAX_RECORDS_PER_RUN = 1024
#: Schema versions of records this reader understands (record.SCHEMA_VERSION is the one written).
KNOWN_SCHEMA_VERSIONS = range(1, SCHEMA_VERSION + 1)

# Open a record without following a symlink (O_NOFOLLOW: ELOOP) and without blocking on a FIFO or a device
# (O_NONBLOCK: a FIFO opens at once, and fstat then says it is no regular file).
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


def max_record_bytes() -> int:
    try:
        value = int(os.environ.get(MAX_RECORD_ENV) or DEFAULT_MAX_RECORD_BYTES)
    except ValueError:
        value = DEFAULT_MAX_RECORD_BYTES
    return value if value > 0 else DEFAULT_MAX_RECORD_BYTES


_KIND = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def read_record(folder_fd: int, name: str, limit: Optional[int] = None) -> tuple[Optional[dict], Optional[str]]:
    """One record file of a run folder, read defensively: (its JSON data, None) or (None, why it was refused).

    Never follows a symlink, never blocks (a FIFO or a device is refused by what `fstat` of the opened
    descriptor says, before any read), checks the owner on that descriptor, refuses a file over `limit`
    bytes by its size without reading it (and never reads more than `limit` + 1 bytes), and refuses a
    schema_version this reader does not know."""
    limit = limit or max_record_bytes()
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            try:
                target = os.readlink(name, dir_fd=folder_fd)
            except OSError:
                target = "?"
            return None, f"a symlink (to {target}): records are regular files and symlinks are never followed"
        return None, f"cannot be opened: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"not a regular file but {_KIND.get(stat.S_IFMT(st.st_mode), 'a special file')}: never read"
        if uid() is not None and st.st_uid != uid():
            return None, f"owned by uid {st.st_uid}, not {uid()}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, "group/world-writable: records are written 0600"
        if st.st_size > limit:
            return None, (f"{st.st_size} bytes, over the limit of {limit} bytes per record ({MAX_RECORD_ENV}): "
                          "not read")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            return None, f"grew past the limit of {limit} bytes per record ({MAX_RECORD_ENV}) while read: not used"
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    finally:
        os.close(fd)
    try:
        data = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than Python's stack
        return None, f"not valid JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if not isinstance(data, dict):
        return None, f"not a record: a JSON {type(data).__name__}, not an object"
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_SCHEMA_VERSIONS:
        return None, (f"unknown schema_version {version!r}: this vllm-patchkit reads versions "
                      f"{KNOWN_SCHEMA_VERSIONS.start}-{KNOWN_SCHEMA_VERSIONS.stop - 1} (a newer vllm-patchkit wrote "
                      "it: run that one's `vllm-patchkit status`; or it is not a record)")
    return data, None


def list_runs(base: Path) -> list[str]:
    if not base.is_dir():
        return []
    runs = []
    for p in base.iterdir():
        if p.name.startswith("."):
            continue
        try:
            if p.is_dir():
                runs.append((p.stat().st_mtime, p.name))
        except OSError:
            continue
    return [name for _, name in sorted(runs)]


def load_run(base: Path, run_id: Optional[str] = None) -> Optional[Run]:
    """The named run, or the latest one; None when there are no records.

    Only regular files named `*.json` are read, each by `read_record`; every file refused is named in
    `Run.refused` with the reason, and listed among the run's warnings (as an unreadable record always was)."""
    warnings: list[str] = []
    if base.is_dir() and not trusted_folder(base, warnings):
        for w in warnings:
            log.warning("vllm-patchkit: %s", w)
        return Run(run_id or "?", [], warnings)
    runs = list_runs(base)
    if not runs:
        return None
    rid = run_id or runs[-1]
    folder = base / rid
    if not folder.is_dir():
        return None
    run = Run(rid, [], warnings)
    if not trusted_folder(folder, warnings):
        return run
    try:
        dfd = os.open(os.path.realpath(folder), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                      | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        warnings.append(f"ignored {folder}: cannot be opened: {exc.strerror}")
        return run
    try:
        names = sorted(n for n in os.listdir(dfd) if n.endswith(".json") and not n.startswith("."))
        if len(names) > MAX_RECORDS_PER_RUN:
            run.refused.append(f"{len(names) - MAX_RECORDS_PER_RUN} record file(s) of {folder} not read: more than "
                               f"{MAX_RECORDS_PER_RUN} in one run (from {names[MAX_RECORDS_PER_RUN]})")
            names = names[:MAX_RECORDS_PER_RUN]
        for name in names:
            data, why = read_record(dfd, name)
            if why is None:
                try:
                    run.processes.append(ProcessRecord.from_json(data).to_json())
                    continue
                except ValueError as exc:  # pydantic's ValidationError is a ValueError
                    why = f"not a valid record: {str(exc).splitlines()[0]}"
            run.refused.append(f"record {folder / name} refused: {why}")
    finally:
        os.close(dfd)
    order = {"frontend": 0, "engine_core": 1, "worker": 2}
    run.processes.sort(key=lambda p: (order.get(p.get("role"), 9), p.get("pid", 0)))
    return run


def narrow(run: Optional[Run], sets: set[str]) -> Optional[Run]:
    """The run with only the patches of the named sets (process-level errors and warnings kept)."""
    if run is None:
        return None
    procs = [{**p, "patches": [r for r in p.get("patches", []) if r.get("patch_set") in sets]} for p in run.processes]
    return Run(run.run_id, procs, list(run.warnings), list(run.refused))


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
        return NONE, ["no records"]
    problems = []
    run_steps = max((p.get("steps") or 0 for p in run.processes), default=0) or None
    for proc in run.processes:
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
    problems += ends(run)[1]
    return (BAD if problems else OK), problems


def warnings_of(run: Optional[Run]) -> list[str]:
    """What an operator must see but that does not fail the run: needed optional patches not
    applied, required ones served without by explicit permission, no exact manifest."""
    if run is None:
        return []
    out = list(run.warnings) + [r for r in run.refused if r not in run.warnings]
    for proc in run.processes:
        for w in proc.get("warnings") or []:
            if w not in out:
                out.append(w)
        for rec in proc.get("patches", []):
            if rec.get("warning"):
                out.append(f"{rec['patch']} in {proc.get('role')} (pid {proc.get('pid')}): {rec['warning']}")
    return out


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
    """A rich table: one row per patch per process."""
    from rich.console import Console
    from rich.table import Table

    import io

    console = Console(file=io.StringIO(), record=True, width=160, force_terminal=False, color_system=None)
    if run is None or (not run.processes and not run.refused):
        console.print("vllm-patchkit: no records (has a server with the plugin run as this user?)")
        return console.export_text()
    table = Table(title=f"vllm-patchkit status — run {run.run_id}", show_lines=False)
    run_steps = max((p.get("steps") or 0 for p in run.processes), default=0) or None
    for col in ("process", "set", "patch", "state", "calls", "reason / detail"):
        table.add_column(col, overflow="fold")
    nowhere = never_applied(run)
    for proc in run.processes:
        steps = proc.get("steps")
        if steps is None:
            steps = run_steps
        label = f"{proc['role']} {proc['pid']}" + (f"\n{steps} steps" if proc.get("steps") is not None else "")
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
            if rec.get("warning"):
                state += ", WARNING"
            reason = rec.get("reason") or ""
            if rec.get("state") in ("failed", "refused") and rec.get("code") != "refused" and \
                    (rec.get("expected") is not None or rec.get("found") is not None):
                reason += f" [expected: {rec.get('expected')}; found: {rec.get('found')}]"
            detail = rec.get("detail") or {}
            extra = "; ".join(f"{k}: {v}" for k, v in detail.items() if k not in ("warned", "decided", "remedy"))
            for f in rec.get("findings") or []:
                extra += ("; " if extra else "") + f"{f.get('code')}: {f.get('where', '')}"
            counted = rec.get("kind") in ("wrap", "replace") and rec.get("state") == "applied"
            calls = str(rec.get("calls", 0)) if counted else "-"
            table.add_row(label, rec.get("patch_set") or "-", rec["patch"], state, calls,
                          "; ".join(x for x in (reason, extra) if x))
            label = ""
    console.print(table)
    code, problems = assess(run, min_steps)
    counts: dict[str, int] = {}
    for proc in run.processes:
        for rec in proc.get("patches", []):
            counts[rec.get("state", "?")] = counts.get(rec.get("state", "?"), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    hidden = "" if show_skipped else " (patches skipped as not for a process are hidden; --all shows them)"
    console.print(f"{len(run.processes)} processes; {summary}; {'OK' if code == OK else 'PROBLEMS'}"
                  f"{f' with {len(warnings_of(run))} warning(s)' if warnings_of(run) else ''}{hidden}")
    for proc in run.processes:
        for source, names in sorted((proc.get("counters") or {}).items()):
            shown = ", ".join(f"{k} {v}" for k, v in sorted(names.items()))
            console.print(f"{proc.get('role')} {proc.get('pid')}: {source}: {shown}")
    for proc in run.processes:
        if proc.get("error"):
            console.print(f"start-up stopped in {proc.get('role')} (pid {proc.get('pid')}):\n  {proc['error']}")
    for p in problems:
        console.print(f"  problem: {p}")
    for w in warnings_of(run):
        console.print(f"  warning: {w}")
    return console.export_text()

"""The verdict on one run as values: each row's state, each process's end, the problems and the warnings.

Why values: `status` (table and JSON), /metrics, the readiness route and a gathered view render one verdict;
`verdict.judge` computes it once from the typed records, and no renderer works a row's state out again
(tests/framework/test_verdict_rendered.py holds them to it). Findings as values, rendering apart, as `check`
does with `tools/report.py` and `tools/render.py`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from msgspec import Struct, field

from vllm_patchkit.runtime.record import PatchRecord, ProcessRecord

OK, BAD, NONE = 0, 1, 2  # exit codes: all good; problems; no records


class RowState(str, Enum):
    """One word for a patch in one process (the `state` label of /metrics): the record's state, or what the
    verdict found worse about it, in this order: shadowed, inert, raised, not applicable."""

    applied = "applied"
    skipped = "skipped"
    failed = "failed"
    refused = "refused"
    pending = "pending"
    not_imported = "not_imported"
    shadowed = "shadowed"  # a finding says another wrapper stands in front of it: it can never run
    inert = "inert"  # a per-step patch with 0 calls after enough steps
    raised = "raised"  # applied, and its own code raised on a call (runtime/raised.py)
    not_applicable = "not_applicable"  # needed here, but this release cannot apply it (unavailable, allowed so)


class Mark(str, Enum):
    """What the status table appends to a row's recorded state, in this order ("applied, INERT")."""

    never_judged = "NEVER JUDGED"  # required, pending, in a process that stepped: its config-ready point never ran
    inert = "INERT"
    applied_nowhere = "APPLIED NOWHERE"  # required, not_imported here and applied in no process of the run
    shadowed = "SHADOWED"
    warning = "WARNING"  # the row's own warning, or verified against another release's pins
    raised = "RAISED"


class Ending(str, Enum):
    """How a process ended, as far as this host can tell."""

    running = "running"
    clean = "clean"  # its exit flush ran
    signal = "signal"  # killed by a signal (noted by the plugin, or read from a zombie's wait status)
    unknown = "unknown"  # vanished without a word, another host's, or no identity recorded


class ProblemCode(str, Enum):
    """Why a run fails (exit 1; `no_records`: 2)."""

    no_records = "no_records"
    storage_full = "storage_full"  # the status folder's file system is full (storage.py)
    stale_record = "stale_record"  # a live process's record is older than its flusher promised
    unpersisted_record = "unpersisted_record"  # a process says its newest state could not be written
    startup_stopped = "startup_stopped"
    required_failed = "required_failed"
    required_refused = "required_refused"
    required_raised = "required_raised"
    never_judged = "never_judged"
    inert = "inert"
    shadowed = "shadowed"
    stale_copy = "stale_copy"  # vLLM's own module calls the original of a required patch through a copy
    applied_nowhere = "applied_nowhere"
    process_gone = "process_gone"  # vanished or killed while the run was serving
    orphaned = "orphaned"  # still runs while its parent process of the run is gone


class WarningCode(str, Enum):
    """What an operator must see but that never changes the exit code."""

    run = "run"  # about the run's folder or the gather (untrusted folder, a failed gather, another run's answer)
    refused_record = "refused_record"  # a record file not read, with why
    live_unpersisted = "live_unpersisted"  # a live answer whose file cannot be written: the folder is behind
    process = "process"  # a process's own warning (no manifest pins this release, ...)
    patch = "patch"  # a row's own warning (needed but not applied, served without by permission, ...)
    optional_raised = "optional_raised"
    verified_against = "verified_against"  # applied against the pins of another release (runtime/nearest.py)


class Problem(Struct, frozen=True):
    """One reason the run fails: its code, the processes and the patch it is about, the words `status` prints."""

    code: ProblemCode
    words: str
    processes: tuple[str, ...] = ()  # "role (pid N)"
    patch: Optional[str] = None  # id@version


class RunWarning(Struct, frozen=True):
    """One warning of the run, shaped as a `Problem`."""

    code: WarningCode
    words: str
    processes: tuple[str, ...] = ()
    patch: Optional[str] = None


class End(Struct):
    """How one process ended (`status --json`'s `ended`)."""

    state: Ending
    signal: Optional[int]
    why: str
    gone: bool = False  # vanished or killed, and judged by the run's rule (a process with a start-up error is not)
    stopped_with_run: bool = False  # gone after (or during) the front end's recorded clean stop
    orphaned: bool = False

    def to_json(self) -> dict:
        out: dict[str, Any] = {"state": self.state.value, "signal": self.signal, "why": self.why}
        out.update({k: True for k in ("gone", "stopped_with_run", "orphaned") if getattr(self, k)})
        return out


class Row(Struct, frozen=True):
    """One patch in one process, judged."""

    record: PatchRecord
    state: RowState
    marks: tuple[Mark, ...] = ()
    shown: bool = True  # False: skipped as not for this process (the table hides it unless --all, /metrics always)
    counted: bool = False  # applied, of a kind whose installed function counts its calls
    raised: Optional[str] = None  # what its own code raised, in one line
    evidence: bool = False  # failed or refused by a comparison: its expected and found values tell why

    @property
    def label(self) -> str:
        """The table's state cell: the recorded state and the marks ("not_imported, APPLIED NOWHERE")."""
        return ", ".join([self.record.state.value] + [m.value for m in self.marks])


class SeenProcess(ProcessRecord, kw_only=True):
    """A process record as the reader saw it: from the run folder, or answered live over RPC (`host` set by
    gather.py: the host it answered from). Typed once, for the verdict."""

    host: Optional[str] = None

    @property
    def who(self) -> str:
        return f"{self.role} (pid {self.pid})"


class ProcessVerdict(Struct):
    """One process of the run, judged: its end, why its record may be behind, its rows."""

    record: SeenProcess
    end: End
    steps: Optional[int]  # its own steps, or the run's when it counts none (what `inert` is judged by)
    unwritten: Optional[str] = None  # why its newest state is not on disk (stale, not persisted), or None
    rows: list[Row] = field(default_factory=list)


class Verdict(Struct):
    """The run's verdict: exit code, problems, warnings and every process judged; renderers only show it."""

    run: Any  # run_folder.Run or None: the records as read (status --json prints them)
    exit_code: int
    problems: list[Problem] = field(default_factory=list)
    warnings: list[RunWarning] = field(default_factory=list)
    processes: list[ProcessVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == OK

    def problem_lines(self) -> list[str]:
        return [p.words for p in self.problems]

    def warning_lines(self) -> list[str]:
        return [w.words for w in self.warnings]

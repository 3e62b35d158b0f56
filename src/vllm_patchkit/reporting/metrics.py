"""Patch status as Prometheus metrics, read from a server run's records at scrape time.

A custom collector rather than Gauge objects kept up to date: every scrape reads
the record files of the run (one per process: API server, EngineCore, workers),
so /metrics shows all processes as their last flush left them, and nothing is
held between scrapes. The figures are those of `vllm-patchkit status --json`
(same reader, the same verdict: `verdict.judge`); see docs/operations.md.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.reporting.run_folder import Run, load_run
from vllm_patchkit.reporting.verdict import judge
from vllm_patchkit.reporting.verdict_values import Verdict

log = logging.getLogger("vllm.patchkit")

PREFIX = "vllm_patchkit"
#: Patch rows (patches x processes) turned into series at most: records are bounded in size
#: (status.max_record_bytes), and so is what one scrape can add to /metrics.
MAX_PATCH_ROWS = 20000


def families(run: Optional[Run], min_steps: int = 8) -> list:
    """The metric families for one run (an empty run: only the exit code, 2, and the run info if known)."""
    return families_of(judge(run, min_steps))


def families_of(verdict: Verdict) -> list:
    """The run's verdict as metric families: each shown row's state, counts summed by role, the exit code."""
    run = verdict.run
    states = GaugeMetricFamily(
        f"{PREFIX}_patch_state",
        "Processes of a role in which a patch is in this state (1 per process; absent means 0).",
        labels=["patch", "version", "set", "role", "required", "state"])
    calls = CounterMetricFamily(
        f"{PREFIX}_patch_calls", "Calls of a counted patch, summed over the processes of a role (last flush).",
        labels=["patch", "role"])
    exceptions = CounterMetricFamily(
        f"{PREFIX}_patch_exceptions", "Exceptions out of a patch's installed function, summed over the processes "
        "of a role (last flush): origin `implementation` (the patch's own code) or `passed_through` (vLLM's "
        "original raised it through the wrapper).", labels=["patch", "role", "origin"])
    steps_total = CounterMetricFamily(
        f"{PREFIX}_steps", "Engine/worker steps counted by the core step hooks, summed over a role.", labels=["role"])
    procs = GaugeMetricFamily(f"{PREFIX}_processes", "Processes of the run with a record, by role.", labels=["role"])
    components = CounterMetricFamily(
        f"{PREFIX}_component_counts", "Counters of a plugin's own components (not patches; "
        "vllm_patchkit.runtime.state.count), summed over the processes of a role (last flush).",
        labels=["source", "name", "role"])
    info = InfoMetricFamily(f"{PREFIX}_run", "The server run the records belong to.",
                            labels=["run_id", "vllm_version", "manifest"])
    exit_code = GaugeMetricFamily(f"{PREFIX}_status_exit_code",
                                  "Exit code of `vllm-patchkit status` for this run: 0 ok, 1 problems, 2 no records.",
                                  value=verdict.exit_code)
    n_problems = GaugeMetricFamily(f"{PREFIX}_problems", "Problems behind a non-zero exit code.",
                                   value=len(verdict.problems))
    n_warnings = GaugeMetricFamily(f"{PREFIX}_warnings", "Warnings of the run (they never change the exit code).",
                                   value=len(verdict.warnings))
    refused = GaugeMetricFamily(f"{PREFIX}_refused_records",
                                "Record files of the run not read (a symlink, a FIFO, too large, unknown "
                                "schema_version...): `vllm-patchkit status` names each.",
                                value=len(run.refused) if run is not None else 0)
    storage = GaugeMetricFamily(f"{PREFIX}_storage_full", "1 when the status folder's file system is full: records "
                                "cannot be written there.", value=int(bool(run is not None and run.storage)))
    if run is None:
        return [exit_code, n_problems, n_warnings, refused, storage]
    stale = GaugeMetricFamily(f"{PREFIX}_unwritten_records", "Running processes whose record is stale or not "
                              "persisted (their newest state is not on disk).",
                              value=sum(1 for pv in verdict.processes if pv.unwritten))
    rows = sum(len(pv.rows) for pv in verdict.processes)
    truncated = GaugeMetricFamily(f"{PREFIX}_series_truncated",
                                  f"1 when the run has more than {MAX_PATCH_ROWS} patch rows and per-patch series "
                                  "were left out.", value=int(rows > MAX_PATCH_ROWS))
    state_n: Counter = Counter()
    call_n: Counter = Counter()
    exc_n: Counter = Counter()
    step_n: Counter = Counter()
    role_n: Counter = Counter()
    comp_n: Counter = Counter()
    infos = set()
    for pv in verdict.processes:
        proc = pv.record
        role = str(proc.role)
        role_n[role] += 1
        infos.add((run.run_id, str(proc.vllm_version or ""), str(proc.manifest or "")))
        if proc.steps is not None:
            step_n[role] += proc.steps
        for source, names in proc.counters.items():
            for name, n in names.items():
                comp_n[(str(source), str(name), role)] += int(n)
        for row in (pv.rows if rows <= MAX_PATCH_ROWS else []):
            if not row.shown:  # not for this process, as the table hides it
                continue
            rec = row.record
            key = PatchKey.parse(rec.patch)
            patch_id, version = key.id, str(key.version)
            state_n[(patch_id, version, rec.patch_set or "", role, str(rec.required).lower(), row.state.value)] += 1
            if row.counted:
                call_n[(patch_id, role)] += rec.calls
            for origin, n in (("implementation", rec.raised), ("passed_through", rec.passed_through)):
                if n:
                    exc_n[(patch_id, role, origin)] += n
    for labels, n in sorted(state_n.items()):
        states.add_metric(list(labels), n)
    for labels, n in sorted(call_n.items()):
        calls.add_metric(list(labels), n)
    for labels, n in sorted(exc_n.items()):
        exceptions.add_metric(list(labels), n)
    for role, n in sorted(step_n.items()):
        steps_total.add_metric([role], n)
    for role, n in sorted(role_n.items()):
        procs.add_metric([role], n)
    for labels, n in sorted(comp_n.items()):
        components.add_metric(list(labels), n)
    for rid, version, manifest in sorted(infos) or [(run.run_id, "", "")]:
        info.add_metric([rid, version, manifest], {})
    return [states, calls, exceptions, steps_total, procs, components, info, exit_code, n_problems, n_warnings,
            refused, truncated, storage, stale]


class PatchStatusCollector(Collector):
    """Reads one run's records at every scrape; a failed read shows as `vllm_patchkit_scrape_error 1`,
    never as a failed scrape of vLLM's own metrics."""

    def __init__(self, base: Path, run_id: Optional[str], min_steps: int = 8, gatherer=None):
        self.base, self.run_id, self.min_steps = Path(base), run_id, min_steps
        self.gatherer = gatherer  # gather.Gatherer: workers' records as of the last gather (refreshed here)
        self.last_seconds = 0.0

    def describe(self) -> Iterable:
        return []  # names vary with the records; nothing to check against other collectors up front

    def collect(self) -> Iterable:
        t0 = time.perf_counter()
        try:
            run = load_run(self.base, self.run_id)
            if self.gatherer is not None:  # a scrape cannot await: the last answers, and a refresh started
                run = self.gatherer.apply(run)
                self.gatherer.refresh_soon()
            out = families(run, self.min_steps)
            failed = 0
        except Exception as exc:  # a scrape of vLLM's metrics must never fail because of ours
            log.warning("vllm-patchkit: /metrics could not read the records in %s: %s", self.base, exc)
            out, failed = [], 1
        self.last_seconds = time.perf_counter() - t0
        out.append(GaugeMetricFamily(f"{PREFIX}_scrape_error", "1 when the records could not be read at this scrape.",
                                     value=failed))
        out.append(GaugeMetricFamily(f"{PREFIX}_scrape_duration_seconds", "Time to read the records at this scrape.",
                                     value=self.last_seconds))
        return out


_installed: dict[int, PatchStatusCollector] = {}  # id(registry) -> our collector there: one per registry


def install(registry, base: Path, run_id: Optional[str], min_steps: int = 8, gatherer=None) -> PatchStatusCollector:
    """Register the collector on `registry` once; an app built again (tests, restarts in-process) re-points it."""
    mine = _installed.get(id(registry))
    if mine is None:
        mine = _installed[id(registry)] = PatchStatusCollector(base, run_id, min_steps, gatherer)
        registry.register(mine)
    else:
        mine.base, mine.run_id, mine.min_steps, mine.gatherer = Path(base), run_id, min_steps, gatherer
    return mine

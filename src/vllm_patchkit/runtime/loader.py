"""The loader: one process's patches, planned, decided, applied and recorded, once per stage.

Stage "import" runs from the plugin entry point; stage "config" runs at the process's config-ready point (see
vllm_patchkit/hooks/config_ready.py). Within a stage every decision is made before anything is installed, so a
required patch that cannot apply stops start-up with nothing half-applied. The pipeline's pieces are their own
modules: plan.py (which version, in which order, at which stage), decide.py (needed? available? verified?), the patch's kind (runtime/kinds: apply), the
record (ledger.py), waiting.py (targets imported later), stale_watch.py and standing.py (after apply), hosting.py
(another role's code in this process). Each is an object the loader makes and calls, owning its own data; none
calls another's methods: the loader hands each what it needs (the ledger, the applied patches, a callback).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from vllm_patchkit.declaration import manifest as manifests_mod
from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import Refusal
from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.patchsets import CORE, discover
from vllm_patchkit.declaration.preconditions import Facts, config_facts, current_platform_name, held
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import ManifestEntry
from vllm_patchkit.declaration.review import refuse_drafts
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.availability import Unavailable
from vllm_patchkit.runtime.decide import Decider, Deferred, NeededButUnavailable
from vllm_patchkit.runtime.hosting import Hosting
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.kinds import kind_of
from vllm_patchkit.runtime.flush import write_record
from vllm_patchkit.runtime.plan import check_contradictions, check_modules, plan_of
from vllm_patchkit.runtime.raised import publish as publish_raised
from vllm_patchkit.runtime.release import installed_vllm_version, judged_version  # noqa: F401 (its old home)
from vllm_patchkit.runtime.record import (APPLIED, FAILED, NOT_IMPORTED, PENDING, REFUSED, SKIPPED, PatchRecord,
                                          ProcessRecord, run_id)
from vllm_patchkit.runtime.sets_cache import Vetted, cache_sets, cached_sets
from vllm_patchkit.runtime.shadow import classes_in_use
from vllm_patchkit.runtime.stale_watch import StaleWatch
from vllm_patchkit.runtime.standing import Standing
from vllm_patchkit.runtime.verify import Verified
from vllm_patchkit.runtime.waiting import Waiting

log = logging.getLogger("vllm.patchkit")

class Loader:
    """Holds one process's plan and the applied patches; composes the jobs that decide, wait, watch and host, and
    the ledger that holds the records."""

    def __init__(
        self,
        patch_set: PatchSet,
        manifests: dict[str, manifests_mod.Loaded],
        *,
        role: str,
        vllm_version: Optional[str] = None,
        platform: Optional[str] = None,
        policy: Optional[str] = None,
        status_dir: Optional[Path] = None,
        write_records: bool = True,
        lazy: bool = False,
        vetted: Optional[Vetted] = None,
    ):
        refuse_drafts(patch_set)  # an unreviewed draft is a guess, never applied (declaration/review.py)
        self.patch_set = patch_set
        self.role = role
        seam = None  # the test seam's warning (release.py), when vLLM's version is read here
        if vllm_version is None:
            vllm_version, seam = judged_version()
        self.vllm_version = vllm_version
        self.facts = Facts(self.vllm_version, platform if platform is not None else current_platform_name(), role)
        self.status_dir = status_dir
        self.write_records = write_records
        # lazy: a target whose module is not imported when its stage runs is verified and applied when it is
        # imported (lazy.py), never imported early; the plugin's loader is lazy, a loader made by hand is not
        self.lazy = lazy
        self.applied: dict[str, Applied] = {}
        self.stacks: dict[str, list[str]] = {}  # target -> patch keys applied on it, innermost first
        self.manifests = manifests
        self.unavailable: dict[str, Unavailable] = {}  # patch id -> why this release offers no entry
        self.loaded, self.manifest_note = manifests_mod.select(manifests, self.vllm_version, policy)
        self.pins_of = manifests_mod.nearest_of(self.loaded, self.vllm_version)  # None: an exact pin, or none
        process = ProcessRecord(
            run_id=run_id(),
            role=role,
            pid=os.getpid(),
            ppid=os.getppid(),
            vllm_version=self.vllm_version,
            manifest=Path(self.loaded.path).name if self.loaded else None,
            started=time.time(),
            notes=[self.manifest_note],
            warnings=[w for w in (seam, None if self.manifest_note.startswith("manifest ") else self.manifest_note) if w],
        )
        self.ledger = Ledger(process, self.vllm_version, manifests, self.flush)
        self.process: ProcessRecord = process
        self.records: dict[str, PatchRecord] = self.ledger.records
        self._flushing = threading.RLock()  # the flusher thread, a note's flush: the newer snapshot is written last
        self.plan: list[tuple[Patch, Optional[ManifestEntry], str]] = plan_of(
            patch_set, self.loaded, self.vllm_version, self.manifest_note, self.pins_of, self.records, self.unavailable)
        # vetted: what the start-up cache's writer already checked of these very sets (sets_cache.Vetted)
        check_modules(self.plan, self.unavailable, patch_set, vetted.modules if vetted else frozenset())
        if vetted is None or not vetted.no_contradictions:
            check_contradictions(patch_set, manifests)
        self.vllm_config: Any = None  # the config stage's VllmConfig (kind subclass sets a field on it)
        self.pinned_by: dict[str, list[str]] = {}  # every pinned place -> the patch keys pinning it
        for patch, _, _ in self.plan:
            for place in patch.pinned_specs:
                self.pinned_by.setdefault(place, []).append(patch.key)
        # the jobs, each with what it reads handed in (see the module docstring)
        self.hosting = Hosting(role, self.ledger)
        self.stale = StaleWatch(self.ledger, self.applied)
        self.standing = Standing(self.ledger, self.applied, patch_set)
        self.waiting = Waiting(self.ledger, self.applied, pins_of=self.pins_of, decide=self._decide,
                               apply=self._apply_one, applied_late=self.stale.watch_applied)
        self.decider = Decider(self.ledger, self.facts, unavailable=self.unavailable, pinned_by=self.pinned_by,
                               pins_of=self.pins_of, lazy=lazy, hosts=self.hosting.hosts,
                               waits_for=self.waiting.waits_for)

    @classmethod
    def builtin(cls, *, role: str, sets: Optional[Iterable[str]] = None, manifest_dir: Optional[Path] = None,
                with_env: bool = True, **kw):
        """Every installed patch set (the framework's own first, then each entry point's, then the
        folders in $VLLM_PATCHKIT_EXTRA_PATCHES) with their manifests. `sets` narrows by name;
        `manifest_dir` stands in for every product set's manifests (tests simulate a release with it)."""
        from vllm_patchkit.upstream import cache

        cached, name = cached_sets(sets, with_env) if manifest_dir is None else (None, None)
        if cached is not None:
            loader = cls(cached[0], cached[1], role=role, vetted=cached[2], **kw)
        else:
            # the cold path: read and validate the YAML (a process served from the start-up cache never imports it)
            from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs

            sources = discover(sets, with_env=with_env)
            ps = load_patch_set(sources)
            dirs = manifest_dirs(sources)
            if manifest_dir is not None:
                dirs = [s.manifests for s in sources if s.name == CORE and s.manifests] + [Path(manifest_dir)]
            ms = manifests_mod.load_manifests(dirs, ps)
            loader = cls(ps, ms, role=role, **kw)
            cache_sets(name, sources, dirs, ps, ms, loader.vllm_version)  # only a set the loader accepted
        cache.attach(loader.process)  # the record says what the caches did, now and later (fingerprints)
        return loader

    # -- stages -------------------------------------------------------------
    def run_import_stage(self) -> None:
        self._run_stage("import", None)

    def run_config_stage(self, vllm_config: Any) -> None:
        """Judge and apply the config-stage patches with this process's VllmConfig."""
        cfg = config_facts(vllm_config)
        cfg["classes"] = classes_in_use(vllm_config, self.role, cfg.get("runner"))
        self.process.config = cfg
        self.vllm_config = vllm_config
        self.decider.preflight(self.plan, self.role, cfg)
        self._run_stage("config", cfg)
        self.hosting.check(self.role, vllm_config)
        if any(kind_of(a.patch).selects_class for a in self.applied.values()):
            cfg["classes"] = classes_in_use(vllm_config, self.role, cfg.get("runner"))  # the subclass now selected
        if os.environ.get("VLLM_PATCHKIT_SHADOW_CHECK", "1") != "0":
            self.standing.report_shadowed(cfg["classes"])
            self.flush()

    def host(self, role: str, vllm_config: Any) -> None:
        """`role`'s code starts in this process (its config-ready point ran here, hosting.py): its patches are
        judged and applied here with this config, both stages, as in a process of its own."""
        if not self.hosting.admit(role, self.plan):
            return
        self._run_stage("import", None)
        cfg = config_facts(vllm_config)
        cfg["classes"] = classes_in_use(vllm_config, role, cfg.get("runner"))
        self._run_stage("config", cfg)
        self.hosting.check(role, vllm_config)
        self.flush()

    def _decide(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict]):
        return self.decider.decide(patch, entry, stage, cfg, self.vllm_config)

    def _run_stage(self, stage: str, cfg: Optional[dict]) -> None:
        decisions: list[tuple[Patch, Verified]] = []
        refusals: list[tuple[Patch, Unavailable, str]] = []
        deferred: list[tuple[Patch, Optional[ManifestEntry], Deferred]] = []
        for patch, entry, pstage in self.plan:
            rec = self.records[patch.id]
            if pstage != stage or rec.state != PENDING:
                continue
            outcome = self._decide(patch, entry, stage, cfg)
            if isinstance(outcome, Deferred):
                self.waiting.defer(patch, outcome)
                deferred.append((patch, entry, outcome))
            elif isinstance(outcome, Verified):
                decisions.append((patch, outcome))
            elif isinstance(outcome, NeededButUnavailable):
                refusals.append((patch, outcome.why, "its process and preconditions hold here: "
                                 + held(patch.when, cfg or {})))
        for patch, why, because in refusals:
            self.ledger.refuse_unavailable(patch, why, because)
        for patch, v in decisions:
            if kind_of(patch).refuses:
                self.decider.done(patch.id)
                self.records[patch.id].set(REFUSED, FailureCode.refused, patch.message)
                self.ledger.stop(Refusal(f"vllm-patchkit: {patch.key}: {patch.message}"))
        self.ledger.fail_closed()
        if self.lazy:  # the plugin's loader: the flusher's full search after the config stage covers these too,
            for patch, v in decisions:  # off the start-up path (~9 ms in a process with vLLM's engine loaded)
                self.stale.watch(patch, v.place)
        else:
            self.stale.report(decisions)
        for patch, v in decisions:
            self._apply_one(patch, v)
            if self.lazy:
                self.waiting.watch_late_copies(patch)
        self.ledger.fail_closed()
        for patch, entry, d in deferred:
            self.waiting.watch(patch, entry, stage, cfg, d.module)
        self.flush()
        self._log_summary(stage)

    def _apply_one(self, patch: Patch, v: Verified) -> None:
        rec = self.records[patch.id]
        self.decider.done(patch.id)
        kind = kind_of(patch)
        try:
            if v.already:
                applied, detail = None, {"already": "the target already holds this patch; not stacked again"}
            else:
                applied, detail = kind.apply(patch, v, rec, self.flush)
            rec.detail.update(detail)
        except Exception as exc:  # an install error is recorded, never swallowed
            if patch.required:
                self.ledger.required_failed(patch, FailureCode.apply, f"{type(exc).__name__}: {exc}")
            else:
                rec.set(FAILED, FailureCode.apply, f"{type(exc).__name__}: {exc}")
            return
        if applied is not None:
            self.applied[patch.id] = applied
        rec.set(APPLIED)
        if applied is not None and patch.target and kind.installs_function:
            self._record_stack(patch)
        if v.later_uses:
            self.waiting.watch_uses(patch, next((e for p, e, _ in self.plan if p.id == patch.id), None), v.later_uses)

    def _record_stack(self, patch: Patch) -> None:
        """Several patches on one target: every one of them records the order (innermost first)."""
        stack = self.stacks.setdefault(patch.target, [])
        stack.append(patch.key)
        if len(stack) > 1:
            for key in stack:
                self.records[PatchKey.parse(key).id].detail["stack"] = (
                    f"{len(stack)} patches on {patch.target}, innermost first: {' < '.join(stack)}")

    # -- record -------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (APPLIED, SKIPPED, FAILED, REFUSED, PENDING, NOT_IMPORTED)}
        for r in self.records.values():
            out[r.state] += 1
        out["warnings"] = sum(1 for r in self.records.values() if r.warning)
        return out

    def sync_calls(self) -> int:
        """Copy live counters into the records; returns the total calls and counts (a cheap change detector)."""
        total = 0
        steps_by_role: dict[tuple, int] = {}  # a process hosting roles (hosting.py) counts each step once per role
        for patch_id, applied in self.applied.items():
            calls = applied.counter.calls
            self.records[patch_id].calls = calls
            publish_raised(applied.counter, self.records[patch_id])  # exceptions out of it (raised.py)
            if applied.patch.instances:
                self.records[patch_id].detail["objects"] = (len(applied.instances) if applied.instances != () else
                                                       "not tracked (the class takes no weak references)")
            total += calls + applied.counter.raised + applied.counter.passed
            if applied.patch.counts_steps:  # alternatives of one role (step, step_with_batch_queue) add up
                role = tuple(p.value for p in applied.patch.processes)
                steps_by_role[role] = steps_by_role.get(role, 0) + calls
            if applied.ctx is not None:  # the implementation's own counters (PatchContext.count)
                applied.ctx.publish(self.records[patch_id].detail)
        steps = max(steps_by_role.values()) if steps_by_role else None
        self.process.steps = steps
        self.standing.report_not_built(steps)
        if self is runtime.current():  # the process's loader: the plugin components' counters are this process's
            counted, self.process.counters = runtime.counters()
            total += counted
        return total

    def flush(self) -> Optional[Path]:
        """Write this process's records (flush.write_record: a failure is a state, never fatal). One flush at a time (the
        flusher thread's and a patch's note may coincide): unserialised, an older snapshot could replace a newer
        file and stay there until the next count changed. A forked child never writes its parent's record (nor
        waits on a lock a thread of the parent held at the fork)."""
        if not self.write_records or os.getpid() != self.process.pid:
            return None
        with self._flushing:
            self.standing.check_in_place()
            self.sync_calls()
            self.process.updated = time.time()
            self.process.patches = list(self.records.values())
            return write_record(self.process, self.status_dir)

    def _log_summary(self, stage: str) -> None:
        c = self.counts()
        failed = [r.patch for r in self.records.values() if r.state in (FAILED, REFUSED)]
        log.info(
            "vllm-patchkit: role=%s pid=%d stage=%s manifest=%s applied=%d skipped=%d failed=%d refused=%d pending=%d "
            "not_imported=%d warnings=%d%s%s",
            self.role, os.getpid(), stage, self.process.manifest, c[APPLIED], c[SKIPPED], c[FAILED], c[REFUSED],
            c[PENDING], c[NOT_IMPORTED], c["warnings"], f" failed_ids={','.join(failed)}" if failed else "",
            f" warned_ids={','.join(r.patch for r in self.records.values() if r.warning)}" if c["warnings"] else "",
        )

    # -- after apply: what the flusher asks ---------------------------------
    def check_in_place(self) -> int:
        """Applied patches whose object a later `setattr` replaced (standing.py); returns how many were new."""
        return self.standing.check_in_place()

    def rescan_stale(self) -> int:
        """The full stale-copy search, off the start-up path (stale_watch.py); returns the new findings."""
        return self.stale.rescan()

    # -- undo ---------------------------------------------------------------
    def unpatch(self) -> None:
        """Put back the exact original objects, newest first; drop the hooks still waiting for an import."""
        self.waiting.forget()
        self.stale.clear()
        for patch_id in reversed(list(self.applied)):
            self.applied.pop(patch_id).undo()
            self.records[patch_id].set(PENDING, None, "unpatched")
            self.records[patch_id].detail.pop("stack", None)
        self.stacks.clear()

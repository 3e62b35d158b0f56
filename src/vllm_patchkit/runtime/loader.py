"""The loader: plan -> verify -> apply -> record, once per stage, in one process.

Stage "import" runs from the plugin entry point; stage "config" runs at the
process's config-ready point (see vllm_patchkit/hooks/config_ready.py). Within a
stage every decision is made before anything is installed, so a required
patch that cannot apply stops start-up with nothing half-applied.

Size (~530 lines): the decision order (needed first, then available; the front
end's pre-flight for other processes' patches) is one sequence that reads best in
one place; module checks, stale/shadow reports and records are small methods of it.
"""

from __future__ import annotations

import graphlib
import importlib.machinery
import importlib.util
import sys
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from vllm_patchkit.declaration import manifest as manifests_mod
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.availability import Unavailable, allowed_unpatched, refusal_message, unavailable
from vllm_patchkit.runtime.apply import Applied, install, set_env_default
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.declaration.declare import PatchSet, load_patch_set, manifest_dirs
from vllm_patchkit.declaration.errors import (DeclarationError, PatchSetErrors, Refusal, RequiredPatchFailed, RequiredPatchUnavailable,
                     remedies)
from vllm_patchkit.declaration.patchsets import CORE, discover
from vllm_patchkit.declaration.preconditions import (Facts, config_facts, current_platform_name, held, unmet_at_config, unmet_at_import,
                            version_matches)
from vllm_patchkit.runtime.record import (
    APPLIED,
    FAILED,
    NOT_IMPORTED,
    PENDING,
    REFUSED,
    SKIPPED,
    PatchRecord,
    ProcessRecord,
    default_status_dir,
    process_file,
    run_id,
    write_atomic,
)
from vllm_patchkit.declaration.schema import Kind, ManifestEntry, Patch
from vllm_patchkit.upstream.targets import main_aliases
from vllm_patchkit.runtime.shadow import classes_in_use, find_shadowed
from vllm_patchkit.runtime.verify import Finding, Verified, stale_copies, verify

log = logging.getLogger("vllm.patchkit")

LAZY_KINDS = (Kind.wrap, Kind.replace, Kind.set)  # kinds that change an object at a target (not an env, a refusal)


class Deferred:
    """A needed patch whose target module is not imported yet: judged again when `module` is imported."""

    def __init__(self, module: str, because: str):
        self.module, self.because = module, because


def module_exists(name: str) -> bool:
    """Whether `name` can be found, without importing it or any parent that is not imported yet.

    The plan checks every module a listed patch names; importing them (as
    `importlib.util.find_spec` does with parents) would load hundreds of vLLM
    modules into processes that never use them. A module that exists but fails
    to import is found here and recorded as that patch's failure at verify time.
    """
    if name in sys.modules:
        return True
    parts = name.split(".")
    path = None
    start = 0
    for i in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is not None:
            path, start = getattr(parent, "__path__", None), i
            if path is None:
                return False
            break
    for i in range(start, len(parts)):
        fullname = ".".join(parts[: i + 1])
        try:
            spec = (importlib.machinery.PathFinder.find_spec(fullname, path) if path is not None or i == 0
                    else None)
            if spec is None and i == 0:
                spec = importlib.util.find_spec(fullname)  # top level: other finders (editable installs)
            elif spec is None:  # a submodule an editable install maps (its finder is on sys.meta_path)
                spec = _other_finders(fullname, path)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return False
    return True


def _other_finders(fullname: str, path) -> Any:
    """The spec the other meta-path finders give (as the import system asks them), importing nothing."""
    for finder in list(sys.meta_path):
        if finder is importlib.machinery.PathFinder or type(finder).__name__ == "ImportHook":
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(fullname, path)
        except Exception:
            continue
        if spec is not None:
            return spec
    return None


# -- the once-per-installation cache of the validated patch sets (cache.py) -------------------------
# Finding the sets (entry points of every distribution, ~20 ms), reading and validating every patch YAML and
# manifest (~50 ms) give the same answer in every process of an installation: kept as JSON in
# `patchsets-<key>.json`, the key made of what is installed, the framework's validating code and the
# environment. The entry holds the stamp of every input (each file in the sets' folders by size, mtime, inode,
# and each YAML's content digest; each entry point's module and its distribution's entry_points.txt, METADATA
# and RECORD, with their digests) and is used only while all of them are unchanged and its own digest matches
# (cache.read_entry); otherwise it is rebuilt from the files, and the process record says why.
def _sets_key(sets, with_env: bool) -> tuple[list, str]:
    from vllm_patchkit.upstream import cache
    from vllm_patchkit.declaration.patchsets import EXTRA_ENV

    key = [cache.installation_stamp(), cache.code_stamp(), sorted(sets) if sets is not None else None, with_env,
           os.environ.get(EXTRA_ENV) if with_env else None]
    return key, cache.digest_of(key)


def _sets_inputs(folders: list, files: list) -> dict:
    from vllm_patchkit.upstream import cache

    return {"folders": cache.folder_stamp(folders, digest=lambda p: p.endswith(".yaml")),
            "files": cache.file_stamp(files)}


def _cached_sets(sets, with_env: bool) -> tuple[Optional[tuple], Optional[str]]:
    """((patch set, manifests), the entry's name) from a verified entry, else (None, the entry's name) after saying
    why it was not used (a missing entry is said by `_cache_sets`, once it is written). The cyclic GC is paused
    meanwhile: the entry's JSON and its models are thousands of young objects that would otherwise bring a full
    collection over all of vLLM's forward (~1 ms per process, benchmarks/startup.py)."""
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        return _read_cached_sets(sets, with_env)
    finally:
        if paused:
            gc.enable()


def _read_cached_sets(sets, with_env: bool) -> tuple[Optional[tuple], Optional[str]]:
    from vllm_patchkit.upstream import cache
    from vllm_patchkit.declaration.schema import Manifest

    if cache.cache_dir() is None:
        cache.report(f"cache: off ({cache.CACHE_DIR_ENV}={os.environ.get(cache.CACHE_DIR_ENV)})")
        return None, None
    try:
        _, digest = _sets_key(sets, with_env)
    except Exception as exc:
        log.debug("vllm-patchkit: patch-set cache key: %s", exc)
        return None, None
    name = f"patchsets-{digest}.json"
    body, why = cache.read_entry(name)
    if why is not None:
        cache.rebuilt(name, why[1], why[0])
        return None, name
    if body is None:
        return None, name
    try:
        if type(body) is not dict:
            raise cache.NotRebuildable("not a mapping")
        if body.get("key") != digest:
            cache.rebuilt(name, f"it holds the entry of another key ({body.get('key')!r:.20})", cache.TAMPERED)
            return None, name
        if not all(type(x) is list and all(type(p) is str for p in x) for x in (body["folders"], body["files"])):
            raise cache.NotRebuildable("its folders and files are not lists of paths")
        now = _sets_inputs(body["folders"], body["files"])
        if now != body["inputs"]:
            cache.rebuilt(name, cache.first_difference(body["inputs"], now), cache.STALE)
            return None, name
        content = body["content"]
        ps = PatchSet({k: cache.load_model(Patch, d) for k, d in content["patches"].items()},
                      dict(content["files"]), dict(content["set_of"]))
        ms = {v: manifests_mod.Loaded(cache.load_model(Manifest, m["manifest"]), m["path"])
              for v, m in content["manifests"].items()}
        if not all(isinstance(x, str) for d in (ps.files, ps.set_of) for kv in d.items() for x in kv) or not all(
                k == p.key for k, p in ps.patches.items()) or not all(isinstance(m.path, str) for m in ms.values()):
            raise cache.NotRebuildable("a file name or key of the wrong type")
    except (cache.NotRebuildable, AttributeError, KeyError, TypeError, ValueError) as exc:
        cache.rebuilt(name, f"its content does not fit the schema ({exc})", cache.TAMPERED)
        return None, name
    cache.report(f"cache: used: {name} (its digest and every input verified)")
    return (ps, ms), name


def _cache_sets(name: Optional[str], sources, dirs, ps: PatchSet, ms: dict) -> None:
    from vllm_patchkit.upstream import cache

    if name is None:
        return
    try:
        not_json = [k for k, p in ps.patches.items() if not cache.cacheable(p)]
        not_json += [m.path for m in ms.values() if not cache.cacheable(m.manifest)]
        if not_json:
            cache.report(f"cache: not written: {name}: {', '.join(not_json)} does not come back from JSON unchanged")
            return
        folders = sorted({str(s.patches) for s in sources} | {str(d) for d in dirs})
        files = sorted({f for s in sources for f in getattr(s, "inputs", ())})
        content = {"patches": {k: cache.dumps(p) for k, p in ps.patches.items()}, "files": ps.files,
                   "set_of": ps.set_of,
                   "manifests": {v: {"path": m.path, "manifest": cache.dumps(m.manifest)} for v, m in ms.items()}}
        body = {"key": name[len("patchsets-"):-len(".json")], "folders": folders, "files": files,
                "inputs": _sets_inputs(folders, files), "content": content}
        if cache.write(name, body):
            cache.report(f"cache: written: {name}")
    except Exception as exc:  # never fatal: the next process validates again
        log.debug("vllm-patchkit: patch-set cache not written: %s", exc)


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


class Loader:
    """Holds one process's plan, the applied patches, and their records."""

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
    ):
        self.patch_set = patch_set
        self.role = role
        self.vllm_version = vllm_version or installed_vllm_version()
        self.facts = Facts(self.vllm_version, platform if platform is not None else current_platform_name(), role)
        self.status_dir = status_dir
        self.write_records = write_records
        # lazy: a target whose module is not imported when its stage runs is verified and applied when it is
        # imported (lazy.py), never imported early; the plugin's loader is lazy, a loader made by hand is not
        self.lazy = lazy
        self.waiting_on: dict[str, str] = {}  # patch id -> the module whose import it waits for
        # id(original) -> (patch id, declared places, the original): every applied function patch, for the
        # full stale-copy search the flusher runs once start-up is over (`rescan_stale`)
        self.stale_watch: dict[int, tuple[str, set[str], Any]] = {}
        self.applied: dict[str, Applied] = {}
        self.stacks: dict[str, list[str]] = {}  # target -> patch keys applied on it, innermost first
        self.manifests = manifests
        self.unavailable: dict[str, Unavailable] = {}  # patch id -> why this release offers no entry
        self.loaded, self.manifest_note = manifests_mod.select(manifests, self.vllm_version, policy)
        self.process = ProcessRecord(
            run_id=run_id(),
            role=role,
            pid=os.getpid(),
            ppid=os.getppid(),
            vllm_version=self.vllm_version,
            manifest=Path(self.loaded.path).name if self.loaded else None,
            started=time.time(),
            notes=[self.manifest_note],
            warnings=[] if self.manifest_note.startswith("manifest ") else [self.manifest_note],
        )
        self.records: dict[str, PatchRecord] = {}
        self.plan: list[tuple[Patch, Optional[ManifestEntry], str]] = self._plan()
        self._check_modules()
        self._check_contradictions()
        self.vllm_config: Any = None  # the config stage's VllmConfig (kind subclass sets a field on it)
        self.pinned_by: dict[str, list[str]] = {}  # every pinned place -> the patch keys pinning it
        for patch, _, _ in self.plan:
            for spec in patch.pinned_specs:
                self.pinned_by.setdefault(spec, []).append(patch.key)

    @classmethod
    def builtin(cls, *, role: str, sets: Optional[Iterable[str]] = None, manifest_dir: Optional[Path] = None,
                with_env: bool = True, **kw):
        """Every installed patch set (the framework's own first, then each entry point's, then the
        folders in $VLLM_PATCHKIT_EXTRA_PATCHES) with their manifests. `sets` narrows by name;
        `manifest_dir` stands in for every product set's manifests (tests simulate a release with it)."""
        from vllm_patchkit.upstream import cache

        cached, name = _cached_sets(sets, with_env) if manifest_dir is None else (None, None)
        if cached is not None:
            loader = cls(cached[0], cached[1], role=role, **kw)
        else:
            sources = discover(sets, with_env=with_env)
            ps = load_patch_set(sources)
            dirs = manifest_dirs(sources)
            if manifest_dir is not None:
                dirs = [s.manifests for s in sources if s.name == CORE and s.manifests] + [Path(manifest_dir)]
            ms = manifests_mod.load_manifests(dirs, ps)
            loader = cls(ps, ms, role=role, **kw)
            _cache_sets(name, sources, dirs, ps, ms)  # only a set the loader accepted
        cache.attach(loader.process)  # the record says what the caches did, now and later (fingerprints)
        return loader

    # -- plan ---------------------------------------------------------------
    def _plan(self) -> list[tuple[Patch, Optional[ManifestEntry], str]]:
        """Choose the version of each patch the manifest lists; order by `requires`.

        A patch the manifest does not offer stays pending, with the reason kept in
        `self.unavailable`: whether that matters is decided at its stage, once it is
        known whether this process and this model need it. An observing core hook
        (`observer: true`) is taken unpinned instead, so that stage can run at all.
        """
        m = self.loaded.manifest if self.loaded else None
        chosen: dict[str, tuple[Patch, Optional[ManifestEntry]]] = {}
        listed = {e.patch.split("@")[0]: e for e in (m.patches if m else [])}
        marked_na = {n.patch for n in (m.not_applicable if m else [])}
        for pid in sorted({p.id for p in self.patch_set.patches.values()}):
            versions = sorted(self.patch_set.by_id(pid), key=lambda p: p.version)
            fitting = [p for p in versions if version_matches(p.when, self.vllm_version)]
            entry = listed.get(pid)
            patch = self.patch_set.patches[entry.patch] if entry else (fitting or versions)[-1]
            chosen[pid] = (patch, entry)
            rec = PatchRecord(patch=patch.key, patch_set=self.patch_set.set_of.get(patch.key), kind=patch.kind.value,
                              required=patch.required, stage=patch.stage, target=patch.target,
                              expected_calls=patch.expected_calls.value)
            self.records[pid] = rec
            if entry is None:
                why = unavailable(pid, m, self.loaded.path if self.loaded else None, self.manifest_note,
                                  self.vllm_version)
                if patch.observer and pid not in marked_na:
                    rec.detail["unpinned"] = f"observing hook applied without a pin ({why.reason})"
                else:
                    self.unavailable[pid] = why
        graph = {pid: set(self.patch_set.requires_of(p)) & chosen.keys() for pid, (p, _) in chosen.items()}
        order = list(graphlib.TopologicalSorter(graph).static_order())
        stage_of: dict[str, str] = {}
        plan = []
        for pid in order:
            patch, entry = chosen[pid]
            stage = patch.stage
            if any(stage_of.get(d) == "config" for d in patch.requires):
                stage = "config"  # a dependent cannot run before what it depends on
            stage_of[pid] = stage
            self.records[pid].stage = stage
            plan.append((patch, entry, stage))
        return plan

    def _check_modules(self) -> None:
        """Every module a listed patch names must exist, before anything is applied."""
        errors = []
        for patch, entry, _ in self.plan:
            if entry is None and patch.id in self.unavailable:
                continue
            named = [("target", patch.target), ("implementation", patch.implementation), ("value_from", patch.value_from)]
            named += [(f"copies[{i}]", c) for i, c in enumerate(patch.copies)]
            named += [(f"uses[{i}]", c) for i, c in enumerate(patch.uses)]
            for fld, spec in named:
                if spec is None:
                    continue
                module = spec.partition(":")[0]
                if not module_exists(module):
                    errors.append(DeclarationError(self.patch_set.files[patch.key], fld,
                                                   f"module {module!r} not found (expected an importable module in {spec!r})"))
        if errors:
            raise PatchSetErrors(errors)

    def _check_contradictions(self) -> None:
        """A manifest listing a required patch whose own `when.vllm` excludes its release would be skipped here
        as not needed, silently: a declaration error naming the manifest entry and the patch file
        (contradictions.py; `check` and `pin` refuse it in the same words)."""
        from vllm_patchkit.declaration.contradictions import discovered_folders, find

        if find(self.patch_set, self.manifests):  # the folders are looked up only to name the right file
            raise PatchSetErrors([c.as_error() for c in find(self.patch_set, self.manifests,
                                                              folders=discovered_folders())])

    # -- stages -------------------------------------------------------------
    def run_import_stage(self) -> None:
        self._run_stage("import", None)

    def run_config_stage(self, vllm_config: Any) -> None:
        """Judge and apply the config-stage patches with this process's VllmConfig."""
        cfg = config_facts(vllm_config)
        cfg["classes"] = classes_in_use(vllm_config, self.role, cfg.get("runner"))
        self.process.config = cfg
        self.vllm_config = vllm_config
        self._preflight(cfg)
        self._run_stage("config", cfg)
        if any(a.patch.kind is Kind.subclass for a in self.applied.values()):
            cfg["classes"] = classes_in_use(vllm_config, self.role, cfg.get("runner"))  # the subclass now selected
        if os.environ.get("VLLM_PATCHKIT_SHADOW_CHECK", "1") != "0":
            self._report_shadowed(cfg["classes"])
            self.flush()

    def _report_shadowed(self, in_use: dict[str, str]) -> None:
        """Applied class-level patches that the classes this process uses can never reach."""
        for rec in self.records.values():
            if rec.state != APPLIED or rec.target is None or rec.kind not in ("wrap", "replace"):
                continue
            patch = self.patch_set.patches.get(rec.patch)
            if patch is not None and patch.instances:
                continue  # set on each object: an override in its class is wrapped too, never shadowing it
            for used, by in find_shadowed(rec.target, in_use):
                rec.findings.append({"code": "shadowed", "where": used, "by": by,
                                     "reason": f"{used} uses {by}'s override, which never calls up to {rec.target}"})
                log.warning("vllm-patchkit: %s is shadowed: %s overrides %s without calling it; the patch can never run",
                            rec.patch, by, rec.target)

    def _preflight(self, cfg: dict) -> None:
        """Refuse here, early, when another process will need a required patch this release cannot give.

        The front end knows the release, the manifest and the architecture before it
        starts EngineCore; a worker failing later costs a model load and reads worse.
        Only a refusal leaves a row here: other processes' patches stay `process` skips.
        """
        for patch, _, _ in self.plan:
            why = self.unavailable.get(patch.id)
            if why is None or not patch.required or patch.kind is Kind.refuse or self.role in patch.processes:
                continue
            if allowed_unpatched(patch.id):
                continue
            if unmet_at_import(patch.when, self.facts) is not None or unmet_at_config(patch.when, cfg) is not None:
                continue
            owners = ", ".join(p.value for p in patch.processes)
            self._refuse_unavailable(patch, why, f"the {owners} process(es) will need it: {held(patch.when, cfg)}")

    def _refuse_unavailable(self, patch: Patch, why: Unavailable, why_needed: str):
        rec = self.records[patch.id]
        remedy = remedies("unavailable", patch.id, self.vllm_version, self.manifests)
        message = refusal_message(patch.key, self.vllm_version, why_needed, why.reason, remedy)
        rec.set(REFUSED, "unavailable", message, "an entry in the manifest for this release", why.code)
        rec.detail["remedy"] = remedy
        self.process.error = message
        log.error("%s", message)
        self.flush()
        raise RequiredPatchUnavailable(rec, message)

    def _required_failed(self, patch: Patch, code: str, reason: str, expected: Any = None,
                         found: Any = None) -> PatchRecord:
        """A needed required patch cannot apply (`code`): failed, with the remedies its class has; or, when
        $VLLM_PATCHKIT_ALLOW_UNPATCHED names it (or `all`), skipped loudly as the remedies promise."""
        rec = self.records[patch.id]
        if allowed_unpatched(patch.id):
            rec.set(SKIPPED, "unpatched_allowed", f"needed here but failed ({code}): {reason}; served without it "
                    "because VLLM_PATCHKIT_ALLOW_UNPATCHED names it", expected, found)
            rec.detail["failure"] = code
            self._warn(rec, f"REQUIRED patch {patch.key} is needed here but failed ({code}): {reason}; serving "
                            "WITHOUT it because VLLM_PATCHKIT_ALLOW_UNPATCHED names it")
            return rec
        rec.set(FAILED, code, reason, expected, found)
        rec.detail["remedy"] = remedies(code, patch.id, self.vllm_version, self.manifests)
        return rec

    def _warn(self, rec: PatchRecord, message: str) -> None:
        rec.warning = message
        log.warning("vllm-patchkit: %s", message)

    def _decide(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict]):
        """Is it needed here (process, preconditions)? Then: can it be applied (requires, manifest, verify)?"""
        rec = self.records[patch.id]
        if self.role not in [p.value for p in patch.processes]:
            return rec.set(SKIPPED, "process", "not for this process", [p.value for p in patch.processes], self.role)
        unmet = unmet_at_import(patch.when, self.facts)
        if unmet is None and stage == "config":
            unmet = unmet_at_config(patch.when, cfg or {})
        if unmet is not None:
            if patch.kind is Kind.refuse:
                return rec.set(SKIPPED, "precondition", f"refusal condition does not hold: {unmet}",
                               unmet.expected, unmet.actual)
            return rec.set(SKIPPED, "precondition", str(unmet), unmet.expected, unmet.actual)
        # needed here from this point on
        waits_for = None  # a dependency still waiting for its module: this one waits with it
        for dep in patch.requires:
            drec = self.records[dep]
            if drec.state == NOT_IMPORTED and dep in self.waiting_on:
                waits_for = waits_for or dep
                continue
            if drec.state != APPLIED and drec.detail.get("decided") != "apply":
                reason = f"requires {dep}, which is {drec.state}" + (f" ({drec.code})" if drec.code else "")
                if patch.required:  # needed and required: a missing dependency must not read as a skip
                    return self._required_failed(patch, "requires", reason, f"{dep} applied", drec.state)
                rec.set(SKIPPED, "requires", reason, f"{dep} applied", drec.state)
                self._warn(rec, f"optional patch {patch.key} is needed here but {reason}")
                return rec
        why = self.unavailable.get(patch.id)
        if why is not None:
            if patch.kind is Kind.refuse:  # its condition holds: refuse, even with no pin to check
                rec.detail["decided"] = "apply"
                return Verified()
            if not patch.required:
                rec.set(SKIPPED, "unavailable", f"needed here but {why.reason}", "an entry in the manifest", why.code)
                self._warn(rec, f"optional patch {patch.key} is needed here but cannot be applied on vLLM "
                                f"{self.vllm_version}: {why.reason}")
                return rec
            if allowed_unpatched(patch.id):
                rec.set(SKIPPED, "unpatched_allowed", f"needed here but {why.reason}; served without it because "
                        f"VLLM_PATCHKIT_ALLOW_UNPATCHED names it", "an entry in the manifest", why.code)
                self._warn(rec, f"REQUIRED patch {patch.key} is needed here but cannot be applied on vLLM "
                                f"{self.vllm_version} ({why.reason}); serving WITHOUT it because "
                                "VLLM_PATCHKIT_ALLOW_UNPATCHED names it")
                return rec
            rec.detail["unavailable"] = why
            return rec
        if waits_for is not None:
            module = self.waiting_on[waits_for]
            return Deferred(module, f"requires {waits_for}, which waits for {module} to be imported")
        if self.lazy and patch.kind in LAZY_KINDS and patch.target is not None:
            module = patch.target.partition(":")[0]
            if module not in sys.modules:
                return Deferred(module, f"its target module {module} is not imported")
        result = verify(patch, entry, self.pinned_by)
        if patch.kind is Kind.subclass and not isinstance(result, Finding):
            from vllm_patchkit.runtime.subclass import select

            sel = select(patch, self.vllm_config, result.impl, result.place.get_raw())
            if isinstance(sel, Finding):
                result = sel
            elif sel.skip is not None:
                return rec.set(SKIPPED, sel.skip.code, sel.skip.reason, sel.skip.expected, sel.skip.found)
            else:
                result.selection, result.already = sel, sel.already
        if isinstance(result, Finding):
            rec.findings.extend({"code": "breakage", **b.as_dict(), "patch": patch.key} for b in result.breakages)
            if patch.required:
                return self._required_failed(patch, result.code, result.reason, result.expected, result.found)
            rec.set(FAILED, result.code, result.reason, result.expected, result.found)
            return rec
        rec.detail["decided"] = "apply"
        return result

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
                self._defer(patch, outcome)
                deferred.append((patch, entry, outcome))
            elif isinstance(outcome, Verified):
                decisions.append((patch, outcome))
            elif "unavailable" in rec.detail:
                refusals.append((patch, rec.detail.pop("unavailable"), "its process and preconditions hold here: "
                                 + held(patch.when, cfg or {})))
        for patch, why, because in refusals:
            self._refuse_unavailable(patch, why, because)
        for patch, v in decisions:
            if patch.kind is Kind.refuse:
                rec = self.records[patch.id].set(REFUSED, "refused", patch.message)
                rec.detail.pop("decided", None)
                self.process.error = f"vllm-patchkit: {patch.key}: {patch.message}"
                self.flush()
                raise Refusal(f"vllm-patchkit: {patch.key}: {patch.message}")
        self._fail_closed()
        if self.lazy:  # the plugin's loader: the flusher's full search after the config stage covers these too,
            for patch, v in decisions:  # off the start-up path (~9 ms in a process with vLLM's engine loaded)
                self._watch_stale(patch, v.place)
        else:
            self._report_stale(decisions)
        for patch, v in decisions:
            self._apply_one(patch, v)
            if self.lazy:
                self._watch_late_copies(patch)
        self._fail_closed()
        for patch, entry, d in deferred:
            self._watch(patch, entry, stage, cfg, d.module)
        self.flush()
        self._log_summary(stage)

    # -- lazy targets (lazy.py) ---------------------------------------------------------------
    def _defer(self, patch: Patch, d: Deferred) -> None:
        self.waiting_on[patch.id] = d.module
        self.records[patch.id].set(
            NOT_IMPORTED, "not_imported",
            f"needed here; {d.because}: verified and applied when it is imported. Still in this state at the "
            "end: the module was never imported in this process, so the code it changes never ran here",
            f"{d.module} imported", "not imported")

    def _watch(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict],
               module: str) -> None:
        from vllm_patchkit.runtime.lazy import HOOK

        mod = sys.modules.get(module)
        if mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False):
            # imported since it was deferred (another patch's `uses` or implementation imported it): the
            # finder will not be asked again, so judge it now
            self._on_import(patch, entry, stage, cfg, module)
            return
        HOOK.watch(module, self, lambda mod: self._on_import(patch, entry, stage, cfg, module))

    def _on_import(self, patch: Patch, entry: Optional[ManifestEntry], stage: str, cfg: Optional[dict],
                   module: str) -> None:
        """`module` has just executed: judge the patch again (its target now resolves), verify against the
        pin, apply, record, flush. A required patch that fails here fails that import, naming the patch."""
        rec = self.records[patch.id]
        if rec.state != NOT_IMPORTED or self.waiting_on.get(patch.id) != module:
            return  # unpatched meanwhile, or already judged: never applied twice
        del self.waiting_on[patch.id]
        rec.set(PENDING)
        outcome = self._decide(patch, entry, stage, cfg)
        if isinstance(outcome, Deferred):  # it also waits for another module (its own target, after a dependency)
            self._defer(patch, outcome)
            self._watch(patch, entry, stage, cfg, outcome.module)
            self.flush()
            return
        if isinstance(outcome, Verified):
            self._apply_one(patch, outcome)
            if rec.state == APPLIED:
                rec.detail["lazy"] = f"applied when {module} was imported"
                applied = self.applied.get(patch.id)
                if applied is not None and applied.places:
                    self._watch_stale_applied(patch, applied)
                self._watch_late_copies(patch)
        if rec.state == FAILED and patch.required:
            exc = RequiredPatchFailed(rec)
            self.process.error = str(exc)
            log.error("%s", exc)
            self.flush()
            from vllm_patchkit.runtime.lazy import HOOK

            def again(mod, exc=exc):  # a caller that catches the error and imports again fails again
                raise exc

            HOOK.keep_failing(module, self, again)
            raise exc
        if rec.state == FAILED and rec.warning is None:
            self._warn(rec, f"optional patch {rec.patch} failed when {module} was imported ({rec.code}): "
                            f"{rec.reason}; expected {rec.expected}, found {rec.found}")
        self.flush()
        log.info("vllm-patchkit: role=%s pid=%d %s %s when %s was imported", self.role, os.getpid(), rec.patch,
                 rec.state, module)

    def _watch_late_copies(self, patch: Patch) -> None:
        """Declared copies whose module is not imported yet: patched when it is, if it then holds the original
        (normally it takes the patched object by value and there is nothing to do)."""
        applied = self.applied.get(patch.id)
        if applied is None or not applied.late_copies or applied.installed is None:
            return
        from vllm_patchkit.runtime.lazy import HOOK

        for spec in applied.late_copies:
            module = spec.partition(":")[0]
            if module not in sys.modules:
                HOOK.watch(module, self, lambda mod, spec=spec: self._on_copy_import(patch.id, spec))

    def _on_copy_import(self, pid: str, spec: str) -> None:
        from vllm_patchkit.runtime.apply import function_of
        from vllm_patchkit.upstream.targets import MISSING, TargetError, resolve

        applied = self.applied.get(pid)
        if applied is None or spec not in applied.late_copies:
            return
        rec = self.records[pid]
        try:
            place = resolve(spec, import_module=False)
            held = place.get_raw()
        except TargetError as exc:
            held, place = MISSING, None
            rec.findings.append({"code": "copy", "where": spec, "reason": f"declared copy not found: {exc}"})
        if place is not None and held is not MISSING and held is not applied.installed:
            if function_of(held) is applied.original:
                place.set_raw(applied.installed)
                applied.places.append((place, held))
                applied.late_copies.remove(spec)
                rec.detail.setdefault("places", []).append(spec)
            else:
                rec.findings.append({"code": "copy", "where": spec,
                                     "reason": f"declared copy {spec} holds a different object: {repr(held)[:120]}"})
                log.warning("vllm-patchkit: %s: declared copy %s holds a different object", rec.patch, spec)
        self.flush()

    def _apply_one(self, patch: Patch, v: Verified) -> None:
        rec = self.records[patch.id]
        rec.detail.pop("decided", None)
        try:
            if patch.kind is Kind.env_default:
                applied = Applied(patch)
                rec.detail["env"] = set_env_default(patch, applied)
            elif v.already:
                applied = None
                rec.detail["already"] = "the target already holds this patch; not stacked again"
            elif patch.kind is Kind.subclass:
                from vllm_patchkit.runtime import subclass

                count = patch.count_calls and os.environ.get("VLLM_PATCHKIT_COUNT_CALLS", "1") != "0"
                applied = subclass.install(patch, v.impl, v.selection, count)
                rec.detail.update(subclass.describe(patch, v.selection))
            elif patch.kind in (Kind.wrap, Kind.replace, Kind.set):
                count = patch.count_calls and os.environ.get("VLLM_PATCHKIT_COUNT_CALLS", "1") != "0"
                ctx = (PatchContext(patch, record=rec, flush=self.flush)
                       if patch.kind is Kind.wrap and patch.implementation is not None else None)
                applied = install(patch, v.place, v.copies, v.impl, count, ctx)
                rec.detail["places"] = [pl.spec for pl, _ in applied.places]
            else:
                applied = Applied(patch)
        except Exception as exc:  # an install error is recorded, never swallowed
            if patch.required:
                self._required_failed(patch, "apply", f"{type(exc).__name__}: {exc}")
            else:
                rec.set(FAILED, "apply", f"{type(exc).__name__}: {exc}")
            return
        if applied is not None:
            self.applied[patch.id] = applied
        rec.set(APPLIED)
        if applied is not None and patch.target and patch.kind in (Kind.wrap, Kind.replace):
            self._record_stack(patch)

    def _record_stack(self, patch: Patch) -> None:
        """Several patches on one target: every one of them records the order (innermost first)."""
        stack = self.stacks.setdefault(patch.target, [])
        stack.append(patch.key)
        if len(stack) > 1:
            for key in stack:
                self.records[key.split("@")[0]].detail["stack"] = (
                    f"{len(stack)} patches on {patch.target}, innermost first: {' < '.join(stack)}")

    def _watch_stale(self, patch: Patch, place: Any) -> Optional[int]:
        """Remember an applied (or about to be) function patch's original for the stale-copy searches."""
        from vllm_patchkit.runtime.apply import function_of

        if place is None or place.owner_is_class or patch.kind not in (Kind.wrap, Kind.replace):
            return None
        declared = {patch.target, *patch.copies}
        original = function_of(place.get_raw())
        self.stale_watch[id(original)] = (patch.id, declared, original)
        return id(original)

    def _watch_stale_applied(self, patch: Patch, applied: Applied) -> None:
        """A patch applied lazily: its original is known from the install (the target holds the wrapper now)."""
        place = applied.places[0][0]
        if applied.original is not None and not place.owner_is_class and patch.kind in (Kind.wrap, Kind.replace):
            self.stale_watch[id(applied.original)] = (patch.id, {patch.target, *patch.copies}, applied.original)

    def _stale_findings(self, found: dict[str, list[str]]) -> int:
        new = 0
        for pid, places in found.items():
            rec = self.records[pid]
            seen = {f.get("where") for f in rec.findings if f.get("code") == "stale_copy"}
            for where in places:
                if where in seen:
                    continue
                rec.findings.append({"code": "stale_copy", "where": where,
                                     "reason": f"{where} holds the original by value and is not a declared copy; "
                                               "calls through it bypass the patch"})
                log.warning("vllm-patchkit: %s: stale copy at %s (not declared in `copies`)", rec.patch, where)
                new += 1
        return new

    def _originals(self, ids) -> dict[int, tuple[str, set[str]]]:
        out = {}
        for key in ids:
            pid, declared, _ = self.stale_watch[key]
            out[key] = (pid, declared | set(main_aliases(declared)))  # `python -m` runs a module as __main__
        return out

    def _report_stale(self, decisions: list[tuple[Patch, Verified]]) -> None:
        """At a stage: the by-name search (every name in vLLM's modules, the target's own name elsewhere)."""
        names: dict[str, list[int]] = {}
        for patch, v in decisions:
            key = self._watch_stale(patch, v.place)
            if key is not None:
                names.setdefault(v.place.attr, []).append(key)
        keys = [k for ks in names.values() for k in ks]
        self._stale_findings(stale_copies(self._originals(keys), names))

    def rescan_stale(self) -> int:
        """Every name of every module, for every applied function patch: the copies bound after start-up (the
        plugin's own modules, model code, targets applied lazily) and under other names (`from x import f as
        g`). The flusher runs it off the start-up path (~30 ms with vLLM's engine loaded); returns the new
        findings."""
        live = [k for k, (pid, _, _) in self.stale_watch.items() if pid in self.applied]
        if not live:
            return 0
        return self._stale_findings(stale_copies(self._originals(live)))

    def _fail_closed(self) -> None:
        bad = [r for r in self.records.values() if r.required and r.state == FAILED]
        for r in self.records.values():
            if r.state == FAILED and not r.required and r.warning is None:
                self._warn(r, f"optional patch {r.patch} failed ({r.code}): {r.reason}; "
                              f"expected {r.expected}, found {r.found}")
        if bad:
            exc = RequiredPatchFailed(bad[0])
            self.process.error = str(exc)
            self.flush()
            raise exc

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
        steps = None
        for pid, applied in self.applied.items():
            calls = applied.counter.calls
            self.records[pid].calls = calls
            if applied.patch.instances:
                self.records[pid].detail["objects"] = (len(applied.instances) if applied.instances != () else
                                                       "not tracked (the class takes no weak references)")
            total += calls
            if applied.patch.counts_steps:
                steps = (steps or 0) + calls
            if applied.ctx is not None:  # the implementation's own counters (PatchContext.count)
                applied.ctx.publish(self.records[pid].detail)
        self.process.steps = steps
        self._report_not_built(steps)
        if self is runtime.current():  # the process's loader: the plugin components' counters are this process's
            counted, self.process.counters = runtime.counters()
            total += counted
        return total

    def _report_not_built(self, steps: Optional[int]) -> None:
        """A selected subclass of which vLLM built no object once the engine stepped: it changes nothing."""
        for pid, applied in self.applied.items():
            if applied.patch.kind is not Kind.subclass:
                continue
            rec = self.records[pid]
            rec.detail["built"] = applied.counter.calls if applied.places else "not counted"
            if (steps and applied.places and applied.counter.calls == 0
                    and not any(f.get("code") == "not_built" for f in rec.findings)):
                rec.findings.append({"code": "not_built", "where": applied.patch.implementation,
                                     "reason": f"{applied.patch.config_field} selects {applied.patch.implementation}, "
                                               f"but vLLM built none after {steps} steps: the overrides never run"})
                log.warning("vllm-patchkit: %s: %s is selected but vLLM never built it", rec.patch,
                            applied.patch.implementation)

    def check_in_place(self) -> int:
        """Every applied wrap/replace must still stand at its places: a plugin loaded after this loader ran may
        have put its own object there (`setattr`), and the patch then runs no more while its row said
        `applied`. Such a patch becomes a failure (`replaced_after_apply`, naming what stands there now); a
        required one is a problem for `status` (exit 1) unless VLLM_PATCHKIT_ALLOW_UNPATCHED names it. Run at
        every flush (the flusher's periodic tick, the stage ends, exit); a few attribute reads per patch.
        Returns the patches newly found replaced."""
        from vllm_patchkit.runtime.apply import MARK, function_of

        new = 0
        for pid, applied in list(self.applied.items()):
            rec = self.records.get(pid)
            if (rec is None or rec.state != APPLIED or applied.installed is None
                    or applied.patch.kind not in (Kind.wrap, Kind.replace)):
                continue
            for place, original in list(applied.places):
                try:
                    now = function_of(place.get_raw())
                except Exception:
                    continue
                obj, seen = now, set()
                while obj is not applied.installed and hasattr(obj, "__wrapped__") and id(obj) not in seen:
                    seen.add(id(obj))  # a layer stacked on ours (another patch, a decorator) still calls ours
                    obj = obj.__wrapped__
                if obj is applied.installed or self.applied.get(pid) is not applied:
                    continue  # in place; or unpatched meanwhile (popped before its places are put back)
                from vllm_patchkit.runtime.verify import replaced_in_place

                site = replaced_in_place(now)
                applied.places.remove((place, original))  # never put vLLM's original back over that object
                reason = (f"{place.spec} no longer holds this patch's {'wrapper' if applied.patch.kind is Kind.wrap else 'replacement'}: "
                          f"after it was applied, something replaced it with {site} (a plugin loaded later, a "
                          f"`setattr`), so the patch no longer runs there ({applied.counter.calls} call(s) before "
                          "it was noticed)")
                expected = f"{applied.patch.key} installed at {place.spec}"
                found = site if getattr(now, MARK, None) is None else f"{site} (another patch: {getattr(now, MARK)})"
                if applied.patch.required:
                    self._required_failed(applied.patch, "replaced_after_apply", reason, expected, found)
                else:
                    rec.set(FAILED, "replaced_after_apply", reason, expected, found)
                    self._warn(rec, f"optional patch {rec.patch} failed (replaced_after_apply): {reason}")
                if rec.state == FAILED:
                    log.error("vllm-patchkit: %s: %s", rec.patch, reason)
                new += 1
                break
        return new

    def flush(self) -> Optional[Path]:
        """Write this process's records; a failure to write is a warning, never fatal."""
        if not self.write_records:
            return None
        self.check_in_place()
        self.sync_calls()
        self.process.updated = time.time()
        self.process.patches = list(self.records.values())
        try:
            path = process_file(self.status_dir or default_status_dir(), self.process)
        except RuntimeError as exc:  # Path.home() with no home directory (arbitrary uid in a container)
            log.warning("vllm-patchkit: no status directory (%s); set VLLM_PATCHKIT_STATUS_DIR", exc)
            return None
        try:
            write_atomic(path, self.process.to_json())
        except OSError as exc:
            log.warning("vllm-patchkit: cannot write records to %s: %s", path, exc)
            return None
        return path

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

    # -- undo ---------------------------------------------------------------
    def unpatch(self) -> None:
        """Put back the exact original objects, newest first; drop the hooks still waiting for an import."""
        if self.waiting_on or self.lazy:
            from vllm_patchkit.runtime.lazy import HOOK

            HOOK.forget(self)
        for pid in list(self.waiting_on):
            self.records[pid].set(PENDING, None, "unpatched")
        self.waiting_on.clear()
        self.stale_watch.clear()
        for pid in reversed(list(self.applied)):
            self.applied.pop(pid).undo()
            self.records[pid].set(PENDING, None, "unpatched")
            self.records[pid].detail.pop("stack", None)
        self.stacks.clear()

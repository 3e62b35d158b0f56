"""PatchLifecycle: import / patch / unpatch permutations of one patch, in a fresh process.

After ddtrace's `PatchTestCase`: every patch of a set goes through the same
permutations, so a new patch gets them without writing a test. One case is one
(patch, process role, import order) in a process where none of the patch's
target modules was imported yet:

- order "import-before": the modules of every target, copy and used callable
  are imported before the loader exists (what EngineCore and workers see: vLLM
  imported its own modules before it loads plugins);
- order "import-after": nothing is imported before the loader; verifying
  imports the targets itself, and declared copies whose module is not imported
  yet are imported *after* the first patch (they take the patched object by value).

Steps, each followed by checks:
  patch                 a loader for the patch and what it `requires` runs its stages
                        (config-stage patches with a real VllmConfig of a tiny model; see
                        recipe.py) -> applied (or refused), exactly one `__vllm_patchkit__`
                        layer over the original at the target and every declared copy,
                        record and status file agree;
  unpatch               every target and copy holds the original object again (identity),
                        env defaults undone, records say pending;
  patch twice           the same loader's stages again, then a second loader in the same
                        process: one layer, the second says "already"; unpatching the second
                        changes nothing, the first restores;
  patch-unpatch-patch   the same loader re-applies after its unpatch, and a new loader
                        applies after that; one layer each time, originals restored at the end.

Everything goes through the Loader API (never an implementation's signature). Runs
inside the children of runner.py; it must not import vLLM's target modules at import time.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import msgspec

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.testing.places import check_patched, check_restored, expected_state, specs
from vllm_patchkit.tools.testing.recipe import DEFAULT_ARCH, STANDIN, recipe_for
from vllm_patchkit.tools.testing.snapshot import Checks, ImportSnapshot

ORDERS = ("import-before", "import-after")
STEPS = ("patch", "unpatch", "patch twice", "patch-unpatch-patch")


def load_sets(sets, manifest_dirs: Optional[dict] = None):
    """(patch set, manifests) of the named sets (the framework's always), a set's manifests
    folder replaced where `manifest_dirs` names one."""
    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.declaration.declare import manifest_dirs as dirs_of
    from vllm_patchkit.declaration.manifest import load_manifests
    from vllm_patchkit.declaration.patchsets import discover

    sources = [msgspec.structs.replace(s, manifests=Path(manifest_dirs[s.name]))
               if manifest_dirs and s.name in manifest_dirs else s
               for s in discover(sets, with_env=False)]
    ps = load_patch_set(sources)
    return ps, load_manifests(dirs_of(sources), ps)


def newest(ps, patch_id: str, vllm_version: str | None = None):
    """The newest version of the patch whose `when.vllm` admits the installed vLLM (the one a loader there
    uses); the newest of all only when none admits it (its cases then report why)."""
    from vllm_patchkit.declaration.preconditions import version_matches

    if vllm_version is None:
        import vllm

        vllm_version = vllm.__version__
    versions = ps.by_id(patch_id)
    admitted = [p for p in versions if version_matches(p.when, vllm_version)]
    return max(admitted or versions, key=lambda p: p.version)


def closure_of(ps, patch) -> list:
    """The patch and everything it requires (stated or implied by its stage)."""
    out, todo = [], [patch]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo += [newest(ps, r) for r in ps.requires_of(p)]
    return out


class PatchLifecycle:
    """The permutations for one patch of a patch set, run in this (fresh) process."""

    def __init__(self, case: dict, job: dict, status_dir: str):
        self.ps, self.manifests = load_sets(job["sets"], job.get("manifest_dirs"))
        self.patch = self.ps.patches[case["key"]] if case.get("key") else newest(self.ps, case["patch"])
        self.role, self.order = case["role"], case["order"]
        self.checkpoints: dict[str, str] = job["checkpoints"]
        self.standin = job.get("standin") or STANDIN
        self.status_dir = Path(status_dir)
        self.closure = closure_of(self.ps, self.patch)
        self.recipe = recipe_for(self.closure)
        overrides = _overrides(job.get("overrides"))
        if self.patch.id in overrides:
            overrides[self.patch.id](self.recipe)
        self.needs_config = any(p.stage == "config" for p in self.closure)
        self.check = Checks()
        self.notes: list[str] = list(self.recipe.notes)
        self.cfg = None
        self.cfg_via = None

    def loader(self):
        """A new Loader holding only the patch, what it requires, and their manifest entries."""
        from vllm_patchkit.declaration.patchsets import PatchSet
        from vllm_patchkit.runtime.loader import Loader, installed_vllm_version
        from vllm_patchkit.declaration.manifest import select

        keys, ids = {p.key for p in self.closure}, {p.id for p in self.closure}
        ps = PatchSet({k: v for k, v in self.ps.patches.items() if k in keys},
                      {k: v for k, v in self.ps.files.items() if k in keys},
                      {k: v for k, v in self.ps.set_of.items() if k in keys})
        loaded, _ = select(self.manifests, installed_vllm_version(), "error")
        m = loaded.manifest
        sub = msgspec.structs.replace(m, patches=[e for e in m.patches if e.patch in keys],
                                      not_applicable=[n for n in m.not_applicable if n.patch in ids])
        kw = {"platform": self.recipe.platform} if self.recipe.platform else {}
        return Loader(ps, {m.vllm: type(loaded)(sub, loaded.path)}, role=self.role, status_dir=self.status_dir, **kw)

    # -- configuration -------------------------------------------------------------------------
    def _prepare_process(self) -> None:
        for name, value in self.recipe.env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.recipe.forced_facts:
            import vllm_patchkit.runtime.loader as loader_mod

            real, forced = loader_mod.config_facts, dict(self.recipe.forced_facts)
            loader_mod.config_facts = lambda cfg: {**real(cfg), **forced}
            self.notes.append(f"forced config facts: {forced}")

    def build_config(self):
        from vllm.engine.arg_utils import EngineArgs

        arch = self.recipe.architecture or DEFAULT_ARCH
        if self.recipe.standin and self.recipe.architecture:
            # Registered as a class: vLLM then inspects it in this process instead of a new
            # interpreter (seconds per case). Done at the first config, after the import stage,
            # so nothing is imported early in "import-after".
            from vllm import ModelRegistry

            module, name = Target.parse(self.standin)
            ModelRegistry.register_model(arch, getattr(importlib.import_module(module), name))
        cfg = EngineArgs(model=self.checkpoints[arch], max_model_len=512, dtype="float32",
                         **self.recipe.engine_kwargs).create_engine_config()
        for name, value in self.recipe.env_after_build.items():
            os.environ[name] = value
        return cfg

    def run_stages(self, loader):
        """Import stage, then (if needed) the config stage: in the front end through vLLM's own
        VllmConfig.__post_init__ (the config-ready hook) the first time, directly otherwise."""
        from vllm_patchkit.runtime import state as runtime
        from vllm_patchkit.declaration.errors import Refusal

        runtime.install(loader)
        try:
            loader.run_import_stage()
            if not self.needs_config:
                return None
            if self.cfg is None:
                try:
                    self.cfg = self.build_config()
                    self.cfg_via = "built after the import stage"
                except Exception as exc:  # a refusal raised inside __post_init__ arrives wrapped by pydantic
                    if "vllm-patchkit" not in str(exc):
                        raise
                    self.cfg_via = "refused inside VllmConfig.__post_init__ (config-ready hook)"
                    runtime.reset()
                    self.cfg = self.build_config()  # a config for the later loaders' direct calls
                    return exc
            if runtime._config_done:
                self.notes.append(f"{self.role}: config stage ran from vLLM's config-ready hook")
                return None
            loader.run_config_stage(self.cfg)
        except Refusal as exc:
            return exc
        finally:
            runtime.reset()
        return None

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        result = {"patch": self.patch.key, "role": self.role, "order": self.order, "kind": self.patch.kind.value,
                  "stage": self.patch.stage, "closure": [p.key for p in self.closure]}
        try:
            self._run(result)
        except BaseException as exc:  # noqa: BLE001 - reported as a failed check
            tb = "".join(traceback.format_exception(exc))[-3000:]
            self.check(False, "lifecycle ran to the end", f"{type(exc).__name__}: {exc}\n{tb}", code="crashed")
        result["checks"] = self.check.items
        result["notes"] = self.notes
        return result

    def _patched(self, loaders, snap, outcome, refusal_raised: bool = True) -> None:
        check_patched(self, loaders, snap, outcome, refusal_raised)

    def _restored(self, snap, env_before, loaders=(), label="originals restored") -> None:
        check_restored(self, snap, env_before, loaders, label)

    def _run(self, result: dict) -> None:
        all_specs = sorted({s for p in self.closure for s in specs(p)})
        modules = sorted({Target.parse(s).module for s in all_specs})
        result["imported_before_loader"] = {m: m in sys.modules for m in modules}
        snap = ImportSnapshot(all_specs).install()
        self._prepare_process()
        copy_modules = sorted({Target.parse(c).module for p in self.closure for c in p.copies})
        if self.order == "import-before":
            for m in modules:
                importlib.import_module(m)
        env_names = {p.env_default.name for p in self.closure if p.env_default is not None}
        env_before = {n: os.environ.get(n) for n in env_names}
        c = self.check

        c.step = "patch"
        l1 = self.loader()
        outcome = self.run_stages(l1)
        result["config"] = self.cfg_via
        if self.order == "import-after":
            for m in copy_modules:  # e.g. vllm.v1.engine.core, imported after the plugin patched
                if m not in sys.modules:
                    snap.imported_by[m] = "after-patch (lifecycle)"
                    importlib.import_module(m)
        result["imported_by"] = dict(snap.imported_by)
        if self.order == "import-after":
            for p in self.closure:  # the import-stage targets this role patches (another role's are not its doing)
                if p.stage == "import" and p.target and self.role in [x.value for x in p.processes]:
                    mod = Target.parse(p.target).module
                    c("vllm_patchkit/" in snap.imported_by.get(mod, ""),
                      f"import-after: the loader itself imported {mod} (import-stage target)", snap.imported_by.get(mod))
        self._patched([l1], snap, outcome)

        c.step = "unpatch"
        l1.unpatch()
        self._restored(snap, env_before, [l1])

        c.step = "patch twice"
        l2 = self.loader()
        outcome = self.run_stages(l2)
        self.run_stages(l2)  # the same loader again: nothing pending, nothing re-done
        self._patched([l2], snap, outcome)
        l3 = self.loader()
        outcome3 = self.run_stages(l3)
        rec3 = l3.records[self.patch.id]
        want = expected_state(self.patch)
        c(rec3.state == want, f"second loader: {self.patch.key} is {want}", {"state": rec3.state, "reason": rec3.reason})
        if traits(self.patch).installs_function and rec3.state == "applied":
            c("already" in rec3.detail, "second loader says the target already holds the patch", rec3.detail)
        if want == "refused":
            c(outcome3 is not None, "second loader refuses too", str(outcome3))
        self._patched([l2], snap, outcome)  # still exactly one layer
        l3.unpatch()
        self._patched([l2], snap, outcome)  # the second loader's unpatch took nothing away
        l2.unpatch()
        self._restored(snap, env_before, [l2])

        c.step = "patch-unpatch-patch"
        l4 = self.loader()
        outcome = self.run_stages(l4)
        l4.unpatch()
        self._restored(snap, env_before, [l4], label="after the first unpatch")
        outcome = self.run_stages(l4)  # same loader, again (a refusal is final: nothing is re-judged)
        self._patched([l4], snap, outcome, refusal_raised=False)
        l4.unpatch()
        l5 = self.loader()
        outcome = self.run_stages(l5)
        self._patched([l5], snap, outcome)
        l5.unpatch()
        self._restored(snap, env_before, [l4, l5])


def _overrides(spec: Optional[str]) -> dict:
    """A set's own recipe adjustments (`module:NAME`, a dict patch id -> function(recipe))."""
    if not spec:
        return {}
    module, name = Target.parse(spec)
    return getattr(importlib.import_module(module), name)

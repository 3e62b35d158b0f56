"""PatchLifecycle: import / patch / unpatch permutations of one patch, in a fresh process.

After ddtrace's `PatchTestCase`: every patch of the set goes through the same
permutations, so a new patch gets them without writing a test. One run is one
(patch, process role, import order) in a process where none of the patch's
target modules was imported yet:

- order "import-before": the modules of every target, copy and used callable
  are imported before the loader exists (what EngineCore and workers see: vLLM
  imported its own modules before it loads plugins);
- order "import-after": nothing is imported before the loader; verifying
  imports the targets itself, and declared copies whose module is not imported
  yet are imported *after* the first patch (they take the patched object by
  value).

Steps, each followed by checks:
  patch                 a loader for the patch and what it `requires` runs its
                        stages (config-stage patches with a real VllmConfig of a
                        tiny model; see Recipe) -> applied (or refused), exactly
                        one `__vllm_patchkit__` layer over the original at the
                        target and at every declared copy, record and status file agree;
  unpatch               every target and copy holds the original object again
                        (identity), env defaults undone, records say pending;
  patch twice           the same loader's stages again, then a second loader in
                        the same process: one layer, the second says "already";
                        unpatching the second changes nothing, the first restores;
  patch-unpatch-patch   the same loader re-applies after its unpatch, and a new
                        loader applies after that; one layer each time, originals
                        restored at the end.

Originals are captured by an import hook at the moment each watched module
finishes executing, so "import-after" is checked by identity too, without
importing anything early.

This module runs inside the children of lifecycle_runner.py; it must not import
vLLM's target modules at import time.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ORDERS = ("import-before", "import-after")
STEPS = ("patch", "unpatch", "patch twice", "patch-unpatch-patch")
STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"
MARK = "__vllm_patchkit__"

# Checks that fail because of a framework bug reported (not fixed) by the reliability suite.
# The pytest side turns a case failing only on these into a strict xfail, and fails when an
# entry no longer matches anything (the bug was fixed: remove the entry).


@dataclass(frozen=True)
class KnownBug:
    key: str
    reason: str
    matches: Any  # check dict -> bool
    cascades: bool = False  # the patch never applies: every later check of the case fails with it


KNOWN_BUGS: list[KnownBug] = []  # late-copy: fixed (apply.Applied.undo restores declared copies imported after install)


# ---------------------------------------------------------------------------------------------
# What a patch's preconditions need, and how they are met.


@dataclass
class Recipe:
    """How to make this process meet a patch's preconditions: really where possible, forced where not."""

    architecture: Optional[str] = None  # config.json architecture of the tiny checkpoint
    standin: bool = False  # register the out-of-tree stand-in class for `architecture`
    engine_kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # before the config is built (None: unset)
    env_after_build: dict = field(default_factory=dict)  # vLLM reads these live (runner choice)
    forced_facts: dict = field(default_factory=dict)  # config facts no config here can have
    platform: Optional[str] = None  # Loader(platform=...) when the patch excludes this one
    notes: list = field(default_factory=list)


# patch id -> function(recipe) adjusting what recipe_for derived, for a precondition it cannot meet
# (say so in recipe.notes; results carry the notes). Empty: every shipped patch's `when` is met by
# recipe_for, with a real config (runner v2 only as vLLM's live rule allows on a CPU, see there).
OVERRIDES: dict = {}


def recipe_for(patches) -> Recipe:
    """Derived from the patches' `when`: a new precondition value gets a real config here, or is forced."""
    r = Recipe()
    for p in patches:
        w = p.when
        if w.architectures:
            r.architecture = r.architecture or w.architectures[0]
        if w.served_by == "out_of_tree":
            r.standin = True
        elif w.served_by not in (None, "vllm"):
            r.forced_facts["served_by"] = {(r.architecture or "LlamaForCausalLM"): w.served_by}
            r.notes.append(f"served_by {w.served_by!r} forced: no such module here")
        if w.served_by == "out_of_tree" and not w.architectures:
            r.architecture = r.architecture or "DeepseekV4ForCausalLM"
        if w.runner == "v1":
            r.env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        elif w.runner == "v2":
            r.env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
            r.env_after_build["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            r.notes.append("runner v2: config built with V1 (the CPU build refuses V2: needs Triton), then "
                           "VLLM_USE_V2_MODEL_RUNNER=1, which VllmConfig.use_v2_model_runner reads live")
        if w.prefix_caching is not None:
            r.engine_kwargs["enable_prefix_caching"] = w.prefix_caching
        if w.speculative:
            r.engine_kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 2,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        if w.cudagraph_mode:
            r.forced_facts["cudagraph_mode"] = w.cudagraph_mode[0]
            r.notes.append(f"cudagraph_mode {w.cudagraph_mode[0]} forced (CPU has no CUDA graphs)")
        for name, value in (w.env or {}).items():
            r.env[name] = value
        if w.platform and "cpu" not in w.platform:
            r.platform = w.platform[0]
            r.notes.append(f"platform {w.platform[0]} forced (this machine is cpu)")
        if p.env_default is not None:
            r.env.setdefault(p.env_default.name, None)  # the default is only set when unset
    return r


# ---------------------------------------------------------------------------------------------
# Originals, captured when each watched module finishes executing.


class ImportSnapshot:
    """A meta-path hook recording, for watched `module:Qualname` places, the object each held
    right after its module executed (or now, for modules already imported), and who imported it."""

    def __init__(self, specs):
        self.by_module: dict[str, list[str]] = {}
        for s in specs:
            self.by_module.setdefault(s.partition(":")[0], []).append(s)
        self.originals: dict[str, Any] = {}
        self.imported_by: dict[str, str] = {}
        for mod in self.by_module:
            if mod in sys.modules:
                self._record(mod, "before the hook")

    def _record(self, mod: str, who: str) -> None:
        from vllm_patchkit.targets import TargetError, resolve

        self.imported_by.setdefault(mod, who)
        for spec in self.by_module[mod]:
            try:
                self.originals.setdefault(spec, resolve(spec, import_module=False).get_raw())
            except TargetError:
                self.originals.setdefault(spec, None)

    def find_spec(self, name, path=None, target=None):
        if name not in self.by_module:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        real = spec.loader.exec_module
        snapshot = self

        def exec_module(module):
            real(module)
            snapshot._record(name, _importer())

        spec.loader.exec_module = exec_module
        return spec

    def install(self) -> "ImportSnapshot":
        sys.meta_path.insert(0, self)
        return self


def _importer() -> str:
    """Who caused the import: the first frame outside importlib and this hook, and the
    framework frame further out when the framework started it ("... <- vllm_patchkit/...")."""
    frame, first = sys._getframe(2), None
    while frame is not None:
        f = frame.f_code.co_filename
        where = f"{Path(f).parent.name}/{Path(f).name}:{frame.f_code.co_name}"
        if not ("importlib" in f or f.endswith("lifecycle.py") or f.startswith("<frozen")):
            first = first or where
            if f"{os.sep}vllm_patchkit{os.sep}" in f:
                return first if first == where else f"{first} <- {where}"
        frame = frame.f_back
    return first or "?"


# ---------------------------------------------------------------------------------------------
# One patch through the permutations.


class Checks:
    def __init__(self):
        self.items: list[dict] = []
        self.step = ""

    def __call__(self, ok: bool, name: str, detail: Any = "", code: str = "") -> bool:
        self.items.append({"step": self.step, "name": name, "ok": bool(ok), "detail": _plain(detail),
                           "code": code or name})
        return ok


def _plain(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return repr(x)[:400]


def layers(raw) -> int:
    """How many of our wrapper layers stand at a place (following `__wrapped__`)."""
    f = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    n, seen = 0, set()
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        if MARK in getattr(f, "__dict__", {}):
            n += 1
        f = getattr(f, "__wrapped__", None)
    return n


def _func(raw):
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


class PatchLifecycle:
    """The permutations for one patch of a patch set, run in this (fresh) process."""

    def __init__(self, patch_id: str, role: str, order: str, checkpoints: dict[str, str], status_dir: str):
        from vllm_patchkit.declare import builtin_patch_dirs, load_patch_set, manifest_dirs
        from vllm_patchkit.manifest import load_manifests

        self.ps = load_patch_set(builtin_patch_dirs())
        self.manifests = load_manifests(manifest_dirs(builtin_patch_dirs()), self.ps)
        self.patch = max(self.ps.by_id(patch_id), key=lambda p: p.version)
        self.role, self.order = role, order
        self.checkpoints = checkpoints
        self.status_dir = Path(status_dir)
        self.closure = self._closure()
        self.recipe = recipe_for(self.closure)
        if patch_id in OVERRIDES:
            OVERRIDES[patch_id](self.recipe)
        self.needs_config = any(p.stage == "config" for p in self.closure)
        self.check = Checks()
        self.notes: list[str] = list(self.recipe.notes)
        self.cfg = None
        self.cfg_via = None

    # -- the patch set under test: the patch and everything it requires ---------------------
    def _closure(self):
        out, todo = [], [self.patch]
        while todo:
            p = todo.pop()
            if p in out:
                continue
            out.append(p)
            todo += [max(self.ps.by_id(r), key=lambda q: q.version) for r in self.ps.requires_of(p)]
        return out

    def specs(self, p) -> list[str]:
        extra = list(getattr(p, "uses", []) or [])
        return ([p.target] if p.target else []) + list(p.copies) + extra

    def loader(self):
        from vllm_patchkit.declare import PatchSet
        from vllm_patchkit.loader import Loader, installed_vllm_version
        from vllm_patchkit.manifest import select

        keys = {p.key for p in self.closure}
        ps = PatchSet({k: v for k, v in self.ps.patches.items() if k in keys},
                      {k: v for k, v in self.ps.files.items() if k in keys})
        loaded, _ = select(self.manifests, installed_vllm_version(), "error")
        m = loaded.manifest
        sub = m.model_copy(update={"patches": [e for e in m.patches if e.patch in keys],
                                   "not_applicable": [n for n in m.not_applicable if n.patch in {p.id for p in self.closure}]})
        ms = {m.vllm: type(loaded)(sub, loaded.path)}
        kw = {"platform": self.recipe.platform} if self.recipe.platform else {}
        return Loader(ps, ms, role=self.role, status_dir=self.status_dir, **kw)

    # -- configuration -------------------------------------------------------------------------
    def _prepare_process(self) -> None:
        for name, value in self.recipe.env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.recipe.forced_facts:
            import vllm_patchkit.loader as loader_mod

            real, forced = loader_mod.config_facts, dict(self.recipe.forced_facts)
            loader_mod.config_facts = lambda cfg: {**real(cfg), **forced}
            self.notes.append(f"forced config facts: {forced}")

    def build_config(self):
        from vllm.engine.arg_utils import EngineArgs

        arch = self.recipe.architecture or "LlamaForCausalLM"
        if self.recipe.standin and self.recipe.architecture:
            # Registered as a class (the stand-in plugin registers the string form): vLLM then inspects
            # it in this process instead of a new interpreter, which saves seconds per case. Done at the
            # first config, after the import stage, so nothing is imported early in "import-after".
            from vllm import ModelRegistry

            module, _, name = STANDIN.partition(":")
            ModelRegistry.register_model(arch, getattr(importlib.import_module(module), name))
        cfg = EngineArgs(model=self.checkpoints[arch], max_model_len=512, dtype="float32",
                         **self.recipe.engine_kwargs).create_engine_config()
        for name, value in self.recipe.env_after_build.items():
            os.environ[name] = value
        return cfg

    def run_stages(self, loader):
        """Import stage, then (if needed) the config stage: in the front end through vLLM's own
        VllmConfig.__post_init__ (the config-ready hook) the first time, directly otherwise."""
        from vllm_patchkit import runtime
        from vllm_patchkit.errors import Refusal

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

    # -- checks --------------------------------------------------------------------------------
    def expected_state(self, p) -> str:
        return "refused" if p.kind.value == "refuse" else "applied"

    def check_patched(self, loaders, snap: ImportSnapshot, outcome, refusal_raised: bool = True) -> None:
        c = self.check
        rec = loaders[-1].records[self.patch.id]
        want = self.expected_state(self.patch)
        if not c(rec.state == want, f"{self.patch.key} is {want}",
                 {"state": rec.state, "code": rec.code, "reason": rec.reason, "expected": rec.expected, "found": rec.found}):
            return
        if want == "refused" and refusal_raised:
            c(outcome is not None and self.patch.key in str(outcome), "start-up refused naming the patch", str(outcome))
        for p in self.closure:
            prec = loaders[-1].records[p.id]
            if p is not self.patch:
                c(prec.state in ("applied", "refused"), f"required {p.key} is {prec.state}", prec.reason)
            self._check_places(p, prec, snap, patched=prec.state == "applied")
        self._check_status_file(loaders[-1])

    def _check_places(self, p, rec, snap: ImportSnapshot, patched: bool) -> None:
        from vllm_patchkit.targets import TargetError, resolve

        c = self.check
        wraps = p.kind.value in ("wrap", "replace") and patched
        if p.target is None:
            return
        original = snap.originals.get(p.target)
        target_raw = resolve(p.target, import_module=False).get_raw()
        if not wraps:
            c(target_raw is original, f"{p.target} untouched ({p.kind.value})", repr(target_raw)[:120])
            if p.env_default is not None and patched:
                c(os.environ.get(p.env_default.name) == p.env_default.value,
                  f"{p.env_default.name}={p.env_default.value} set", os.environ.get(p.env_default.name))
            return
        n = layers(target_raw)
        c(n == 1, f"{p.target}: exactly one {MARK} layer", n, code="one_layer")
        c(getattr(_func(target_raw), MARK, None) == p.key, f"{p.target}: the layer is {p.key}",
          getattr(_func(target_raw), MARK, None))
        c(getattr(_func(target_raw), "__wrapped__", None) is _func(original), f"{p.target}: wraps the original by identity",
          repr(getattr(_func(target_raw), "__wrapped__", None))[:120])
        c(type(target_raw) is type(original), f"{p.target}: descriptor kind kept", type(target_raw).__name__)
        places = rec.detail.get("places") or []
        c(p.target in places, f"{p.key} record lists its places", places)
        for spec in p.copies:
            mod = spec.partition(":")[0]
            if mod not in sys.modules:
                self.notes.append(f"{spec}: module not imported at this point (it takes the patched object when it imports)")
                continue
            try:
                held = resolve(spec, import_module=False).get_raw()
            except TargetError as exc:
                c(False, f"copy {spec} resolvable", str(exc))
                continue
            late = snap.imported_by.get(mod, "").startswith("after-patch")
            c(held is target_raw, f"copy {spec} holds the patched object" + (" (imported after the first patch)" if late else ""),
              repr(held)[:120], code="late_copy_repatched" if late else "copy_patched")
            c(layers(held) == 1, f"copy {spec}: exactly one layer", layers(held), code="one_layer")

    def _check_status_file(self, loader) -> None:
        path = loader.flush()
        if not self.check(path is not None and path.is_file(), "status record written", str(path)):
            return
        data = json.loads(path.read_text())
        on_disk = {r["patch"]: r["state"] for r in data["patches"]}
        in_memory = {r.patch: r.state for r in loader.records.values()}
        self.check(on_disk == in_memory, "status file agrees with the records", {"disk": on_disk, "memory": in_memory})

    def check_restored(self, snap: ImportSnapshot, env_before: dict, loaders=(), label="originals restored") -> None:
        from vllm_patchkit.targets import TargetError, resolve

        c = self.check
        for p in self.closure:
            for spec in self.specs(p):
                mod = spec.partition(":")[0]
                if mod not in sys.modules:
                    continue
                want = snap.originals.get(p.target) if spec in p.copies else snap.originals.get(spec)
                try:
                    raw = resolve(spec, import_module=False).get_raw()
                except TargetError as exc:
                    c(False, f"{label}: {spec} resolvable", str(exc))
                    continue
                late_copy = spec in p.copies and snap.imported_by.get(mod, "").startswith("after-patch")
                code = "late_copy_restored" if late_copy else "restored"
                c(raw is want, f"{label}: {spec} holds the original" + (" (copy imported after patching)" if late_copy else ""),
                  {"layers": layers(raw), "held": repr(raw)[:100]}, code=code)
        for name, value in env_before.items():
            c(os.environ.get(name) == value, f"{label}: env {name} back to {value!r}", os.environ.get(name))
        for loader in loaders:
            for p in self.closure:
                rec = loader.records[p.id]
                if p.kind.value in ("wrap", "replace", "set", "env_default") and rec.state != "skipped":
                    c(rec.state == "pending" and rec.reason == "unpatched", f"{label}: {p.key} record says unpatched",
                      {"state": rec.state, "reason": rec.reason})

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        result = {"patch": self.patch.key, "role": self.role, "order": self.order, "kind": self.patch.kind.value,
                  "stage": self.patch.stage, "closure": [p.key for p in self.closure]}
        try:
            self._run(result)
        except BaseException as exc:  # noqa: BLE001 - reported as a failed check
            self.check(False, "lifecycle ran to the end", "".join(traceback.format_exception(exc))[-3000:],
                       code="crashed")
        result["checks"] = self.check.items
        result["notes"] = self.notes
        return result

    def _run(self, result: dict) -> None:
        specs = sorted({s for p in self.closure for s in self.specs(p)})
        modules = sorted({s.partition(":")[0] for s in specs})
        result["imported_before_loader"] = {m: m in sys.modules for m in modules}
        snap = ImportSnapshot(specs).install()
        self._prepare_process()
        copy_modules = sorted({c.partition(":")[0] for p in self.closure for c in p.copies})
        if self.order == "import-before":
            for m in modules:
                importlib.import_module(m)
        env_names = {p.env_default.name for p in self.closure if p.env_default is not None}
        env_before = {n: os.environ.get(n) for n in env_names}
        c = self.check

        # patch
        c.step = "patch"
        l1 = self.loader()
        outcome = self.run_stages(l1)
        result["config"] = self.cfg_via
        if self.order == "import-after":
            for m in copy_modules:  # e.g. vllm.v1.engine.core, imported after the plugin patched
                if m not in sys.modules:
                    snap.imported_by[m] = "after-patch (lifecycle)"
                    importlib.import_module(m)
                    snap.imported_by[m] = "after-patch (lifecycle)"
        result["imported_by"] = dict(snap.imported_by)
        if self.order == "import-after":
            for p in self.closure:
                if p.stage == "import" and p.target:
                    mod = p.target.partition(":")[0]
                    c("vllm_patchkit/" in snap.imported_by.get(mod, ""),
                      f"import-after: the loader itself imported {mod} (import-stage target)", snap.imported_by.get(mod))
        self.check_patched([l1], snap, outcome)

        # unpatch
        c.step = "unpatch"
        l1.unpatch()
        self.check_restored(snap, env_before, [l1])

        # patch twice
        c.step = "patch twice"
        l2 = self.loader()
        outcome = self.run_stages(l2)
        self.run_stages(l2)  # the same loader again: nothing pending, nothing re-done
        self.check_patched([l2], snap, outcome)
        l3 = self.loader()
        outcome3 = self.run_stages(l3)
        rec3 = l3.records[self.patch.id]
        want = self.expected_state(self.patch)
        c(rec3.state == want, f"second loader: {self.patch.key} is {want}", {"state": rec3.state, "reason": rec3.reason})
        if self.patch.kind.value in ("wrap", "replace") and rec3.state == "applied":
            c("already" in rec3.detail, "second loader says the target already holds the patch", rec3.detail)
        if want == "refused":
            c(outcome3 is not None, "second loader refuses too", str(outcome3))
        self.check_patched([l2], snap, outcome)  # still exactly one layer
        l3.unpatch()
        self.check_patched([l2], snap, outcome)  # the second loader's unpatch took nothing away
        l2.unpatch()
        self.check_restored(snap, env_before, [l2])

        # patch-unpatch-patch
        c.step = "patch-unpatch-patch"
        l4 = self.loader()
        outcome = self.run_stages(l4)
        l4.unpatch()
        self.check_restored(snap, env_before, [l4], label="after the first unpatch")
        outcome = self.run_stages(l4)  # same loader, again (a refusal is final: nothing is re-judged)
        self.check_patched([l4], snap, outcome, refusal_raised=False)
        l4.unpatch()
        l5 = self.loader()
        outcome = self.run_stages(l5)
        self.check_patched([l5], snap, outcome)
        l5.unpatch()
        self.check_restored(snap, env_before, [l4, l5])

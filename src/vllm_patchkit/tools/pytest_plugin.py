"""vllm-patchkit's pytest plugin: contract and lifecycle tests of patch sets, off unless enabled.

Registered as the `pytest11` entry point `vllm_patchkit`, so pytest loads it in
every project that has vllm-patchkit installed; it does nothing (no vLLM import,
no items) unless enabled. A patch set's whole test configuration is one line:

    patchkit_sets = other                      # ini file; or: pytest --patchkit-set other

For each named set (its entry-point name in `vllm_patchkit.patch_sets`) it adds:
- lifecycle items (mark `patchkit_lifecycle`): for each patch of the set that the installed
  vLLM's manifest lists, each process role and import order (before / after the loader), one
  item per step (patch, unpatch, patch twice, patch-unpatch-patch); each (patch, role, order)
  runs in a fresh forked process (vllm_patchkit.tools.testing), all of them once, when the first
  selected lifecycle item runs;
- contract items (mark `patchkit_contract`): one per pinned place of the set's manifest for
  the installed vLLM (the place exists, its live fingerprint equals the pin), and one saying
  the manifest lists (or marks not applicable) every patch of the set.
`--patchkit-manifest-dir DIR` replaces the named set's manifests folder (one set only).

Without sets, `--patchkit-contracts` (ini `patchkit_contracts = true`) adds the contract
items of every installed set, merged, or of `--patchkit-patch-dir` folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

MARK = "patchkit_contract"
LIFECYCLE = "patchkit_lifecycle"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-patchkit", "vllm-patchkit contract and lifecycle tests")
    group.addoption("--patchkit-set", action="append", default=None, metavar="NAME",
                    help="test this patch set (entry-point name; repeatable): lifecycle permutations and contracts")
    group.addoption("--patchkit-contracts", action="store_true", default=None,
                    help="add one test per manifest pin of the installed vLLM (target exists, fingerprint equal)")
    group.addoption("--patchkit-patch-dir", action="append", default=None, metavar="DIR",
                    help="patch folder (repeatable; default: the patch set shipped with vllm-patchkit)")
    group.addoption("--patchkit-manifest-dir", default=None, metavar="DIR",
                    help="manifest folder (default: the set's own; with --patchkit-set it replaces that set's)")
    parser.addini("patchkit_sets", "patch sets to test (entry-point names): lifecycle and contract items",
                  type="args", default=[])
    parser.addini("patchkit_contracts", "enable the vllm-patchkit contract tests", type="bool", default=False)
    parser.addini("patchkit_patch_dirs", "patch folders for the contract tests", type="paths", default=[])
    parser.addini("patchkit_manifest_dir", "manifest folder for the contract tests", default="")


def _enabled(config: pytest.Config) -> bool:
    opt = config.getoption("patchkit_contracts")
    return bool(opt) if opt is not None else bool(config.getini("patchkit_contracts"))


def _sets(config: pytest.Config) -> list[str]:
    return list(dict.fromkeys(config.getoption("patchkit_set") or config.getini("patchkit_sets") or []))


def _manifest_dir(config: pytest.Config) -> Optional[str]:
    return config.getoption("patchkit_manifest_dir") or config.getini("patchkit_manifest_dir") or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: a vllm-patchkit contract test (patchkit_sets, --patchkit-contracts)")
    config.addinivalue_line("markers", f"{LIFECYCLE}: a vllm-patchkit lifecycle permutation (patchkit_sets)")


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so those select our items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    sets = _sets(config)
    collectors = []
    if _enabled(config):
        collectors.append(ContractCollector.from_parent(session, name="vllm-patchkit", nodeid="vllm-patchkit"))
    for name in sets:
        collectors.append(SetCollector.from_parent(session, name=f"vllm-patchkit::{name}",
                                                   nodeid=f"vllm-patchkit::{name}", set_name=name, many=len(sets) > 1))
    added = []
    for collector in collectors:
        got = collector.collect()
        config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, got))
        added += got
    items[:0] = added


class ContractFailure(AssertionError):
    """A failure said as lines, without a traceback: what broke and what to do."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


def contract_items(parent, ps, manifests, only: Optional[set] = None) -> list:
    """The pin items of the installed vLLM's manifest and its completeness item (for `only` sets)."""
    from vllm_patchkit.declaration.errors import PatchkitError
    from vllm_patchkit.declaration.manifest import select
    from vllm_patchkit.tools.releases import installed_version

    version = installed_version()
    if version is None:
        raise PatchkitError("vLLM is not installed")
    chosen, note = select(manifests, version, "skip")
    if chosen is None:
        return [ErrorItem.from_parent(parent, name=f"vllm-{version}", message=note)]
    m = chosen.manifest
    stem = Path(chosen.path).name
    out: list = [CompleteItem.from_parent(parent, name=f"{stem}::complete", manifest=m, patch_set=ps,
                                          only=only, path_=chosen.path)]
    for entry in m.patches:
        patch = ps.patches[entry.patch]
        for spec, pin in entry.targets.items():
            out.append(PinItem.from_parent(parent, name=f"{stem}::{entry.patch}::{spec}", patch=patch, spec=spec,
                                           pin=pin, pins=dict(entry.targets), path_=chosen.path))
    for item in out:
        item.add_marker(MARK)
    return out


class ContractCollector(pytest.Collector):
    """Reads the patch set and the manifest of the installed vLLM; yields the items."""

    def _dirs(self) -> tuple[list, list[Path]]:
        from vllm_patchkit.declaration.declare import manifest_dirs
        from vllm_patchkit.declaration.patchsets import discover

        cfg = self.config
        patch_dirs = [Path(d) for d in (cfg.getoption("patchkit_patch_dir") or cfg.getini("patchkit_patch_dirs") or [])]
        mdir = _manifest_dir(cfg)
        if patch_dirs:
            return patch_dirs, [Path(mdir)] if mdir else []
        sources = discover(with_env=False)
        return sources, [Path(mdir)] if mdir else manifest_dirs(sources)

    def collect(self) -> list:
        from vllm_patchkit.declaration.declare import load_patch_set
        from vllm_patchkit.declaration.manifest import load_manifests

        try:
            patch_dirs, mdirs = self._dirs()
            ps = load_patch_set(patch_dirs)
            return contract_items(self, ps, load_manifests(mdirs, ps))
        except Exception as exc:  # a broken patch set or manifest is a failing test, not a crash
            return [ErrorItem.from_parent(self, name="setup", message=f"{type(exc).__name__}: {exc}")]


class SetCollector(pytest.Collector):
    """One named patch set: its lifecycle items, then its contract items (manifest of this release)."""

    def __init__(self, *, set_name: str, many: bool = False, **kw):
        super().__init__(**kw)
        self.set_name, self.many = set_name, many

    def manifest_dirs(self) -> dict:
        mdir = _manifest_dir(self.config)
        if mdir and self.many:
            raise pytest.UsageError("--patchkit-manifest-dir replaces one set's manifests: name one set")
        return {self.set_name: str(Path(mdir).resolve())} if mdir else {}

    def collect(self) -> list:
        from vllm_patchkit.declaration.declare import manifest_dirs
        from vllm_patchkit.declaration.manifest import load_manifests
        from vllm_patchkit.declaration.patchsets import discover
        from vllm_patchkit.tools.testing import STEPS, lifecycle_cases
        from vllm_patchkit.tools.testing.lifecycle import load_sets

        overrides = self.manifest_dirs()
        try:
            ps, _ = load_sets([self.set_name], overrides)
            own = [s for s in discover([self.set_name], with_env=False) if s.name == self.set_name]
            mdirs = [Path(overrides[self.set_name])] if overrides else manifest_dirs(own)
            contracts = contract_items(self, ps, load_manifests(mdirs, ps), only={self.set_name})
            cases = lifecycle_cases([self.set_name], overrides)
        except Exception as exc:  # an unknown set, a broken patch or manifest: one failing item, said once
            return [ErrorItem.from_parent(self, name="setup", message=f"{type(exc).__name__}: {exc}")]
        lifecycle = [LifecycleItem.from_parent(self, name=f"lifecycle::{case.id}::{step}", case=case, step=step)
                     for case in cases for step in STEPS]
        for item in lifecycle:
            item.add_marker(LIFECYCLE)
        return lifecycle + contracts


_RELEASE: dict[str, Any] = {}


def _installed():
    from vllm_patchkit.tools.releases import installed_static

    if "installed" not in _RELEASE:
        _RELEASE["installed"] = installed_static()
    return _RELEASE["installed"]


class _Item(pytest.Item):
    def __init__(self, *, path_: Optional[str] = None, **kw):
        super().__init__(**kw)
        self._manifest_path = path_

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ContractFailure):
            return "\n".join(excinfo.value.lines)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self._manifest_path or "vllm-patchkit", None, self.name


class PinItem(_Item):
    """The installed vLLM still has this target, with the pinned fingerprint: judged as `vllm-patchkit check`
    judges it (`check.examine`, the installed release read statically: nothing of vLLM is imported, so a target
    in another platform's module is checked like any other), the findings at this place."""

    def __init__(self, *, patch, spec: str, pin, pins: Optional[dict] = None, **kw):
        super().__init__(**kw)
        self.patch, self.spec, self.pin = patch, spec, pin
        self.pins = pins if pins is not None else {spec: pin}

    def runtest(self) -> None:
        from vllm_patchkit.tools.examine import examine

        release = _installed()
        key = (self.patch.key, tuple(sorted(self.pins)))
        if key not in _EXAMINED:
            _EXAMINED[key] = examine(release, self.patch, self.pins, release)[1]
        # against the release's own manifest every difference fails, compatible ones too (check's `stale`):
        # the loader compares pins exactly
        breakages = [b for b in _EXAMINED[key] if b.target == self.spec]
        if breakages:
            raise ContractFailure([f"{self.patch.key} on vLLM {release.version()}:"] +
                                  [f"  [{b.kind.value}] {b.explain()}" for b in breakages])


_EXAMINED: dict = {}


class CompleteItem(_Item):
    """Every patch of the set is listed in the manifest or marked not applicable there."""

    def __init__(self, *, manifest, patch_set, only: Optional[set] = None, **kw):
        super().__init__(**kw)
        self.manifest, self.patch_set, self.only = manifest, patch_set, only

    def runtest(self) -> None:
        from vllm_patchkit.declaration.names import PatchKey

        known = {PatchKey.parse(e.patch).id for e in self.manifest.patches} | {n.patch for n in self.manifest.not_applicable}
        ps = self.patch_set
        ids = {p.id for k, p in ps.patches.items() if self.only is None or ps.set_of.get(k) in self.only}
        missing = sorted(ids - known)
        if missing:
            raise ContractFailure([f"manifest for vLLM {self.manifest.vllm} neither lists nor marks not applicable: "
                                   f"{', '.join(missing)} (run `vllm-patchkit pin --vllm {self.manifest.vllm}`)"])


class ErrorItem(_Item):
    """The contract tests could not be set up; that is a failure, said once."""

    def __init__(self, *, message: str, **kw):
        super().__init__(**kw)
        self.message = message

    def runtest(self) -> None:
        raise ContractFailure([f"vllm-patchkit contracts: {self.message}"])


_RUNS = pytest.StashKey[dict]()


class LifecycleItem(_Item):
    """One step of one (patch, role, import order) case; the case ran in a fresh forked process."""

    def __init__(self, *, case, step: str, **kw):
        super().__init__(**kw)
        self.case, self.step = case, step

    def reportinfo(self):
        return f"vllm-patchkit::{self.case.set}", None, self.name

    def runtest(self) -> None:
        run = _lifecycle_run(self)
        problems = run.problems(self.case.id, self.step)
        if problems:
            raise ContractFailure([f"{self.case.key} ({self.case.set}) in {self.case.role}, {self.case.order}, "
                                   f"step {self.step!r}:"] + [f"  {line}" for line in problems])


def _lifecycle_run(item: LifecycleItem):
    """Run, once per set, every case a selected lifecycle item of that set needs (after -k / -m)."""
    import shutil
    import tempfile

    from vllm_patchkit.tools.testing import run_lifecycle

    runs = item.config.stash.setdefault(_RUNS, {})
    name = item.case.set
    if name not in runs:
        cases = list(dict.fromkeys(i.case for i in item.session.items
                                   if isinstance(i, LifecycleItem) and i.case.set == name))
        work = tempfile.mkdtemp(prefix=f"vllm-patchkit-lifecycle-{name}-")
        item.config.add_cleanup(lambda: shutil.rmtree(work, ignore_errors=True))
        runs[name] = run_lifecycle(cases, [name], Path(work), manifest_dirs=item.parent.manifest_dirs())
    return runs[name]

"""Contract tests as pytest items: every pin of the installed vLLM's manifest is one test.

Registered as the `pytest11` entry point `vllm_patchkit`, so pytest loads it in
every project that has vllm-patchkit installed; it does nothing (no vLLM import,
no items) unless enabled:

    pytest --patchkit-contracts                # or, in the ini file: patchkit_contracts = true
    pytest --patchkit-contracts -m patchkit_contract     # only the contract items

Enabled, it adds, for the manifest that pins the installed vLLM:
- one item per pinned place of every listed patch (its target, declared copies and
  the upstream callables it uses): the place exists and its live fingerprint equals
  the pin (a copy must also still hold the target's function);
- one item saying the manifest is complete: every patch is listed or marked not
  applicable.
A plugin with its own patch set points it there with `--patchkit-patch-dir`
(repeatable) and `--patchkit-manifest-dir`, or the ini options of the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

MARK = "patchkit_contract"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-patchkit", "vllm-patchkit contract tests")
    group.addoption("--patchkit-contracts", action="store_true", default=None,
                    help="add one test per manifest pin of the installed vLLM (target exists, fingerprint equal)")
    group.addoption("--patchkit-patch-dir", action="append", default=None, metavar="DIR",
                    help="patch folder (repeatable; default: the patch set shipped with vllm-patchkit)")
    group.addoption("--patchkit-manifest-dir", default=None, metavar="DIR",
                    help="manifest folder (default: the manifests shipped with vllm-patchkit)")
    parser.addini("patchkit_contracts", "enable the vllm-patchkit contract tests", type="bool", default=False)
    parser.addini("patchkit_patch_dirs", "patch folders for the contract tests", type="paths", default=[])
    parser.addini("patchkit_manifest_dir", "manifest folder for the contract tests", default="")


def _enabled(config: pytest.Config) -> bool:
    opt = config.getoption("patchkit_contracts")
    return bool(opt) if opt is not None else bool(config.getini("patchkit_contracts"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: a vllm-patchkit contract test (added by --patchkit-contracts)")


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so those select contract items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if not _enabled(config):
        return
    collector = ContractCollector.from_parent(session, name="vllm-patchkit", nodeid="vllm-patchkit")
    added = collector.collect()
    config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, added))
    items[:0] = added


class ContractFailure(AssertionError):
    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


class ContractCollector(pytest.Collector):
    """Reads the patch set and the manifest of the installed vLLM; yields the items."""

    def _dirs(self) -> tuple[list, list[Path]]:
        from .declare import manifest_dirs
        from .patchsets import discover

        cfg = self.config
        patch_dirs = [Path(d) for d in (cfg.getoption("patchkit_patch_dir") or cfg.getini("patchkit_patch_dirs") or [])]
        mdir = cfg.getoption("patchkit_manifest_dir") or cfg.getini("patchkit_manifest_dir")
        if patch_dirs:
            return patch_dirs, [Path(mdir)] if mdir else []
        sources = discover(with_env=False)
        return sources, [Path(mdir)] if mdir else manifest_dirs(sources)

    def collect(self) -> list:
        from .contracts import installed_version
        from .declare import load_patch_set
        from .errors import PatchkitError
        from .manifest import load_manifests, select

        patch_dirs, mdirs = self._dirs()
        try:
            ps = load_patch_set(patch_dirs)
            loaded = load_manifests(mdirs, ps)
            version = installed_version()
            if version is None:
                raise PatchkitError("vLLM is not installed")
            chosen, note = select(loaded, version, "skip")
        except Exception as exc:  # a broken patch set or manifest is a failing test, not a crash
            return [ErrorItem.from_parent(self, name="setup", message=f"{type(exc).__name__}: {exc}")]
        if chosen is None:
            return [ErrorItem.from_parent(self, name=f"vllm-{version}", message=note)]
        m = chosen.manifest
        stem = Path(chosen.path).name
        out: list = [CompleteItem.from_parent(self, name=f"{stem}::complete", manifest=m, patch_set=ps,
                                              path_=chosen.path)]
        for entry in m.patches:
            patch = ps.patches[entry.patch]
            for spec, pin in entry.targets.items():
                out.append(PinItem.from_parent(self, name=f"{stem}::{entry.patch}::{spec}", patch=patch, spec=spec,
                                               pin=pin, path_=chosen.path))
        for item in out:
            item.add_marker(MARK)
        return out


_RELEASE: dict[str, Any] = {}


def _live():
    from .contracts import LiveRelease

    if "live" not in _RELEASE:
        _RELEASE["live"] = LiveRelease()
    return _RELEASE["live"]


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
    """The installed vLLM still has this target, with the pinned fingerprint."""

    def __init__(self, *, patch, spec: str, pin, **kw):
        super().__init__(**kw)
        self.patch, self.spec, self.pin = patch, spec, pin

    def runtest(self) -> None:
        from .contracts import Breakage, BreakageKind, compare

        release = _live()
        is_copy = self.spec in self.patch.copies and self.spec != self.patch.target
        found = release.lookup(self.spec, with_digest=self.pin.source_digest is not None)
        breakages = compare(self.patch.key, self.spec, self.pin, found, copy=is_copy)
        if is_copy and not breakages and self.patch.target:
            held, target = release.identity(self.spec), release.identity(self.patch.target)
            if held and target and held[0] != target[0]:
                breakages.append(Breakage(BreakageKind.copy_differs, self.patch.key, self.spec, old=target[1], new=held[1]))
        if breakages:
            raise ContractFailure([f"{self.patch.key} on vLLM {release.version()}:"] +
                                  [f"  [{b.kind.value}] {b.explain()}" for b in breakages])


class CompleteItem(_Item):
    """Every patch of the set is listed in the manifest or marked not applicable there."""

    def __init__(self, *, manifest, patch_set, **kw):
        super().__init__(**kw)
        self.manifest, self.patch_set = manifest, patch_set

    def runtest(self) -> None:
        known = {e.patch.split("@")[0] for e in self.manifest.patches} | {n.patch for n in self.manifest.not_applicable}
        missing = sorted({p.id for p in self.patch_set.patches.values()} - known)
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

"""Against the installed vLLM, whichever release it is: the static reader agrees with the live one, `check`
passes, and `pin` reproduces the committed manifests for it.

Both paths read the same installed package: live by import (what the loader
sees), static from the package folder as if it were an unpacked source tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from packaging.version import Version
import msgspec


from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.manifest_files import read_manifests
from vllm_patchkit.tools.releases import LiveRelease
from vllm_patchkit.upstream.installed import installed_root, installed_version
from patchkit_deepseek_v4 import MANIFESTS as V4_MANIFESTS
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set, manifest_dirs, parse_manifest
from vllm_patchkit.tools.pin import pin_release
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.static_source import DirSource
from vllm_patchkit.upstream.targets import resolve
from vllm_patchkit.tools.manifest_files import dump_fingerprint

pytestmark = pytest.mark.skipif(installed_root() is None, reason="vLLM is not installed")

RELEASE = installed_version() or "none"
MANIFESTS = [d / f"vllm-{RELEASE}.yaml" for d in manifest_dirs(installed_sources())]  # every set's, for this release
MANIFEST = V4_MANIFESTS / f"vllm-{RELEASE}.yaml"
PINS = sorted({(spec, yaml.safe_dump(pin)) for m in MANIFESTS if m.is_file()
               for e in yaml.safe_load(m.read_text())["patches"] for spec, pin in e["targets"].items()})
SPECS = sorted({spec for spec, _ in PINS})

# Modules swept def by def (every function, class and method): static must equal live.
SWEEP = [
    "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.worker_base", "vllm.v1.worker.cpu_model_runner", "vllm.v1.engine.core",
    "vllm.v1.executor.abstract", "vllm.v1.core.kv_cache_utils", "vllm.v1.core.block_pool",
    "vllm.v1.core.sched.scheduler", "vllm.config.vllm", "vllm.config.model", "vllm.config.compilation",
]


@pytest.fixture(scope="module")
def live():
    if not MANIFEST.is_file():
        pytest.skip(f"no manifest pins the installed vLLM {RELEASE}")
    return LiveRelease()


@pytest.fixture(scope="module")
def static(live):
    return StaticRelease(DirSource(installed_root()), RELEASE)


@pytest.mark.parametrize("spec", SPECS)
def test_static_equals_live_for_every_pinned_target(spec, live, static):
    with_digest = any(yaml.safe_load(p).get("source_digest") for s, p in PINS if s == spec)
    got_static, got_live = static.lookup(spec, with_digest), live.lookup(spec, with_digest)
    assert not isinstance(got_static, Missing), got_static
    assert got_static == got_live
    for s, p in PINS:
        if s == spec:
            assert dump_fingerprint(got_static) == {
                k: v for k, v in yaml.safe_load(p).items() if v not in (None, [])}


@pytest.mark.parametrize("module", SWEEP)
def test_static_equals_live_for_every_def_of_a_module(module, live, static):
    import importlib

    importlib.import_module(module)
    specs = _module_defs(static, module)
    assert specs
    differ = []
    for spec in specs:
        place = resolve(spec)
        raw = place.get_raw()
        want = fp.live(raw, place.owner_is_class, True)
        want = msgspec.structs.replace(want, wrappers=layers.wrapper_layers(raw))
        if static.lookup(spec, True) != want:
            differ.append(spec)
    assert differ == []


def _module_defs(static: StaticRelease, module: str) -> list[str]:
    import ast

    mod = static.module(module)
    out = []
    for name, b in mod.scope.names.items():
        if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(f"{module}:{name}")
        if isinstance(b, ast.ClassDef):
            for m, mb in static._class_scope(b, mod.package).names.items():
                if isinstance(mb, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append(f"{module}:{name}.{m}")
    return out


def test_names_imported_by_value_and_constants(live, static):
    for spec in ("vllm.v1.engine.core:get_kv_cache_configs", "vllm.envs:environment_variables",
                 "vllm.v1.worker.gpu_model_runner:GPUModelRunner._is_uniform_decode",
                 "vllm.v1.core.block_pool:BlockPool", "vllm.config.vllm:VllmConfig.__post_init__"):
        assert static.lookup(spec) == live.lookup(spec), spec
    home = "kv_cache_planning" if Version(RELEASE) >= Version("0.33") else "kv_cache_utils"
    assert static.resolve("vllm.v1.engine.core:get_kv_cache_configs").where == \
        f"vllm.v1.core.{home}:get_kv_cache_configs"


def test_missing_target_live_says_where_it_is(live):
    got = live.lookup("vllm.v1.worker.cpu_model_runner:CPUModelRunner.execute_model")
    assert isinstance(got, Missing)
    assert "inherited from vllm.v1.worker.gpu_model_runner:GPUModelRunner" in got.reason
    assert got.moved_to == ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",)


def test_check_against_the_installed_vllm_exits_zero(live, capsys):
    """`check` reads the installed release statically by default (nothing of vLLM imported for it)."""
    assert main(["check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert f"installed vLLM {RELEASE} (static" in out and " 0 stale, 0 broken, 0 unpinned, 0 not applicable" in out


def test_check_live_runs_in_a_child_and_agrees(capsys):
    """`check --live` reads by import in a child process; its verdicts equal the static reading's."""
    import subprocess
    import sys

    live_run = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "check", "--live"],
                              capture_output=True, text=True, timeout=600)
    static_run = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "check"],
                                capture_output=True, text=True, timeout=600)
    assert live_run.returncode == static_run.returncode == 0, live_run.stderr + static_run.stderr
    assert f"installed vLLM {RELEASE} (by import" in live_run.stdout
    assert live_run.stdout.splitlines()[1:] == static_run.stdout.splitlines()[1:]


def test_pin_live_and_static_reproduce_the_committed_manifest(live):
    """The shipped manifest of the installed release is current, and pinning by import or from the tree gives
    the same pins."""
    ps = load_patch_set(installed_sources())
    committed = read_manifests(manifest_dirs(installed_sources()), ps)[0][RELEASE]  # every set's, merged
    from vllm_patchkit.tools.releases import StaticView

    by_import = pin_release(live, ps, {RELEASE: committed}, generated_by="test").manifest
    statically = pin_release(StaticView(StaticRelease(DirSource(installed_root()), RELEASE)), ps,
                             {RELEASE: committed}, generated_by="test").manifest
    def key(m):
        return sorted(m.patches, key=lambda e: e.patch)

    assert key(by_import) == key(committed)
    assert key(statically) == key(committed)
    assert by_import.not_applicable == statically.not_applicable == committed.not_applicable


def test_installed_version_without_import():
    assert installed_version() == __import__("vllm").__version__
    assert (installed_root() / "vllm" / "__init__.py").is_file()
    assert Path(MANIFEST).is_file()

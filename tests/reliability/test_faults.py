"""Fault injection: broken implementations, vanished or replaced targets, unwritable or full status storage.

For each fault: the record's state and code, a message that says what happened,
and the process's fate — an optional patch's failure never stops vLLM (the
loader stage returns, a healthy patch beside it still applies), a required one
stops start-up with RequiredPatchFailed naming patch, target, expected and found,
before anything is applied. Storage faults never stop vLLM: records stay right
in memory, a warning names the path and the error, and no torn or temporary file
is left behind.

Status storage is made read-only / full with a real tmpfs mount where this
process may mount (root in a VM here), and by injecting the OSError at the
write everywhere (root ignores permission bits, so chmod cannot be used).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.runtime import record as record_mod
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import PatchSetErrors, RequiredPatchFailed
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests

from ..framework.helpers import live_pin, patch_doc
from .conftest import COUNTS, OPS

POOL = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"  # a module-level function
BATCH_Q = "vllm.v1.engine.core:EngineCore.step_with_batch_queue"  # a method
STEP = "vllm.v1.engine.core:EngineCore.step"  # the healthy neighbour
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _count(request):
    yield
    COUNTS["fault"] += 1
    OPS["fault"][request.node.originalname] += 1
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        COUNTS["fault:failures"] += 1


@pytest.fixture
def vllm_modules():
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.engine.core as core

    saved = (kvu.__dict__.get("_pool_bytes_per_block"), {k: core.EngineCore.__dict__[k] for k in ("step", "step_with_batch_queue")})
    yield kvu, core
    kvu._pool_bytes_per_block = saved[0]
    for k, v in saved[1].items():
        setattr(core.EngineCore, k, v)


def build_loader(tmp: Path, faulty: dict, *, pins: dict[str, dict], status_dir: Path, role="engine_core") -> Loader:
    """The faulty patch plus a healthy neighbour, as a plugin would ship them."""
    pdir, mdir = tmp / "patches", tmp / "manifests"
    pdir.mkdir(parents=True, exist_ok=True)
    mdir.mkdir(parents=True, exist_ok=True)
    healthy = patch_doc(id="healthy", kind="wrap", target=STEP, processes=[role])
    (pdir / "faulty.yaml").write_text(yaml.safe_dump(faulty))
    (pdir / "healthy.yaml").write_text(yaml.safe_dump(healthy))
    entries = [{"patch": "faulty@1", "targets": {faulty["target"]: pins[faulty["target"]]}},
               {"patch": "healthy@1", "targets": {STEP: live_pin(STEP)}}]
    (mdir / "vllm-0.31.0.yaml").write_text(yaml.safe_dump({"vllm": "0.31.0", "generated_by": "test", "patches": entries}))
    ps = load_patch_set([pdir])
    return Loader(ps, load_manifests([mdir], ps), role=role, vllm_version="0.31.0", status_dir=status_dir)


def run(loader: Loader, required: bool):
    """Run the import stage as the plugin entry point does; (exception or None)."""
    try:
        loader.run_import_stage()
    except RequiredPatchFailed as exc:
        assert required, f"an optional patch stopped start-up: {exc}"
        return exc
    assert not required, "a required patch failed and start-up went on"
    return None


def check_failed(loader: Loader, exc, *, required: bool, code: str, words: str, expected, found, target: str,
                 untouched, log) -> None:
    from vllm.v1.engine.core import EngineCore

    rec = loader.records["faulty"]
    assert (rec.state, rec.code) == ("failed", code), rec
    assert words in rec.reason, rec.reason
    assert rec.expected == expected and (found(rec.found) if callable(found) else rec.found == found), rec
    assert untouched(), "the faulty target was changed"
    on_disk = json.loads(next(Path(loader.status_dir).rglob("*.json")).read_text())
    assert {p["patch"]: (p["state"], p["code"]) for p in on_disk["patches"]}["faulty@1"] == ("failed", code)
    healthy = loader.records["healthy"]
    if required:
        msg = str(exc)
        for part in ("faulty@1", target, f"expected {expected!r}", f"found {rec.found!r}", words):
            assert part in msg, f"{part!r} not in {msg!r}"
        assert healthy.state == "pending" and "__vllm_patchkit__" not in vars(EngineCore.__dict__["step"])
    else:
        assert healthy.state == "applied"
        warned = [r.getMessage() for r in log.records if "optional patch faulty@1 failed" in r.getMessage()]
        assert len(warned) == 1 and code in warned[0] and words in warned[0], warned
    loader.unpatch()


REQUIRED = pytest.mark.parametrize("required", [False, True], ids=["optional", "required"])


# -- an implementation that cannot be imported ------------------------------------------------------
@REQUIRED
@pytest.mark.parametrize("error", ["ImportError", "RuntimeError"])
def test_implementation_raising_at_import(tmp_path, monkeypatch, vllm_modules, patchkit_log, required, error):
    kvu, _ = vllm_modules
    name = f"patchkit_fault_impl_{error.lower()}_{'req' if required else 'opt'}"
    (tmp_path / f"{name}.py").write_text(f"raise {error}(\"No module named 'atom_kernels' (simulated)\")\n"
                                         "def wrap(wrapped, instance, args, kwargs):\n    return wrapped(*args, **kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = kvu._pool_bytes_per_block
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, implementation=f"{name}:wrap", processes=["engine_core"],
                    required=required)
    loader = build_loader(tmp_path, doc, pins={POOL: live_pin(POOL)}, status_dir=tmp_path / "status")
    exc = run(loader, required)
    check_failed(loader, exc, required=required, code="implementation", words=f"{error}: No module named 'atom_kernels'",
                 expected="importable", found="error", target=POOL, untouched=lambda: kvu._pool_bytes_per_block is before,
                 log=patchkit_log)


def test_implementation_package_raising_importerror_is_a_recorded_failure(tmp_path, monkeypatch, vllm_modules):
    pkg = tmp_path / "patchkit_fault_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError(\"No module named 'atom_kernels' (simulated)\")\n")
    (pkg / "impl.py").write_text("def wrap(wrapped, instance, args, kwargs):\n    return wrapped(*args, **kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, implementation="patchkit_fault_pkg.impl:wrap",
                    processes=["engine_core"], required=False)
    loader = build_loader(tmp_path, doc, pins={POOL: live_pin(POOL)}, status_dir=tmp_path / "status")
    loader.run_import_stage()
    rec = loader.records["faulty"]
    assert (rec.state, rec.code) == ("failed", "implementation") and "atom_kernels" in rec.reason


# -- a target that is gone -----------------------------------------------------------------------------
@REQUIRED
@pytest.mark.parametrize("target", [POOL, BATCH_Q], ids=["function", "method"])
def test_target_removed(tmp_path, vllm_modules, patchkit_log, required, target):
    kvu, core = vllm_modules
    pin = live_pin(target)
    if target == POOL:
        del kvu._pool_bytes_per_block
    else:
        del core.EngineCore.step_with_batch_queue
    owner, attr = (kvu, "_pool_bytes_per_block") if target == POOL else (core.EngineCore, "step_with_batch_queue")
    doc = patch_doc(id="faulty", kind="wrap", target=target, processes=["engine_core"], required=required)
    loader = build_loader(tmp_path, doc, pins={target: pin}, status_dir=tmp_path / "status")
    exc = run(loader, required)
    check_failed(loader, exc, required=required, code="target", words="target moved or removed", expected=target,
                 found="missing", target=target, untouched=lambda: attr not in vars(owner), log=patchkit_log)


# -- a target replaced by a plain setattr --------------------------------------------------------------
@REQUIRED
@pytest.mark.parametrize("target", [POOL, BATCH_Q], ids=["function", "method"])
def test_target_replaced_with_another_signature(tmp_path, vllm_modules, patchkit_log, required, target):
    kvu, core = vllm_modules
    pin = live_pin(target)

    def replacement(kv_cache_groups, block_size, extra=None):  # someone else's function, no __wrapped__
        return 0

    def method_replacement(self, batch, *, wait=True):
        return None

    if target == POOL:
        kvu._pool_bytes_per_block = replacement
        untouched, found = (lambda: kvu._pool_bytes_per_block is replacement), "(kv_cache_groups, block_size, extra=None)"
    else:
        core.EngineCore.step_with_batch_queue = method_replacement
        untouched = lambda: core.EngineCore.__dict__["step_with_batch_queue"] is method_replacement  # noqa: E731
        found = "(self, batch, *, wait=True)"
    doc = patch_doc(id="faulty", kind="wrap", target=target, processes=["engine_core"], required=required)
    loader = build_loader(tmp_path, doc, pins={target: pin}, status_dir=tmp_path / "status")
    exc = run(loader, required)
    # someone else's code at the target is a conflict naming its file and line, not a fingerprint to re-pin
    # (issue 21; it was "fingerprint: required parameter ..." with the remedy to re-pin the release)
    check_failed(loader, exc, required=required, code="conflict", words="was replaced by code outside vLLM",
                 expected=f"vLLM's {target}", found=lambda f: f"{Path(__file__)}:" in f and found not in f,
                 target=target, untouched=untouched, log=patchkit_log)


def test_target_replaced_with_same_signature_is_noticed(tmp_path, vllm_modules):
    kvu, _ = vllm_modules
    pin = live_pin(POOL)

    def _pool_bytes_per_block(kv_cache_groups):  # same name, same signature, defined here
        return 0

    kvu._pool_bytes_per_block = _pool_bytes_per_block
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=False)
    loader = build_loader(tmp_path, doc, pins={POOL: pin}, status_dir=tmp_path / "status")
    loader.run_import_stage()
    try:
        assert loader.records["faulty"].state == "failed"
    finally:
        loader.unpatch()


# -- status storage ------------------------------------------------------------------------------------
def _tmpfs(path: Path, *opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(path)], capture_output=True)
    except OSError:  # no mount(8) here
        return False
    return done.returncode == 0


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def storage(tmp_path, monkeypatch):
    """(status_dir, description) for each way the status storage can refuse writes."""
    mounted = []

    def make(kind: str) -> Path:
        if kind == "parent-is-a-file":
            (tmp_path / "blocker").write_text("a regular file where the status folder's parent should be")
            return tmp_path / "blocker" / "status"
        if kind == "read-only-tmpfs":
            if not _tmpfs(tmp_path / "ro", "ro", "size=16k"):
                pytest.skip("mount not permitted here (the injected EROFS variant covers this)")
            mounted.append(tmp_path / "ro")
            return tmp_path / "ro" / "status"
        if kind == "injected-EROFS":
            def replace(src, dst):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

            monkeypatch.setattr(record_mod.os, "replace", replace)
            return tmp_path / "status"
        raise AssertionError(kind)

    yield make
    for m in mounted:
        _umount(m)


UNWRITABLE = ["parent-is-a-file", "read-only-tmpfs", "injected-EROFS"]


def _healthy_only(tmp_path, status_dir, required=False):
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=required)
    return build_loader(tmp_path, doc, pins={POOL: live_pin(POOL)}, status_dir=status_dir)


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_unwritable_status_dir_never_stops_vllm(tmp_path, vllm_modules, storage, patchkit_log, kind):
    status_dir = storage(kind)
    loader = _healthy_only(tmp_path, status_dir, required=True)
    loader.run_import_stage()  # returns: a record that cannot be written is a warning, not a failure
    try:
        assert loader.records["faulty"].state == loader.records["healthy"].state == "applied"
        assert loader.flush() is None
        warned = [r.getMessage() for r in patchkit_log.records if "cannot write records to" in r.getMessage()]
        assert warned and str(status_dir) in warned[0] and ("Errno" in warned[0]), warned
        leftovers = [p for p in tmp_path.rglob(".*.json.*")]
        assert not leftovers, f"temporary files left behind: {leftovers}"
    finally:
        loader.unpatch()


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_unwritable_status_dir_does_not_mask_a_required_failure(tmp_path, vllm_modules, storage, kind):
    kvu, _ = vllm_modules
    status_dir = storage(kind)
    pin = live_pin(POOL)
    del kvu._pool_bytes_per_block
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=True)
    loader = build_loader(tmp_path, doc, pins={POOL: pin}, status_dir=status_dir)
    with pytest.raises(RequiredPatchFailed, match="required patch faulty@1 failed"):
        loader.run_import_stage()



class FullDisk:
    """The record file: part of the record reaches it, then the disk is full (ENOSPC)."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()
        return False

    def write(self, data):
        self.fh.write(data[:8])
        self.fh.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

def _fill(path: Path) -> None:
    """Write until the file system says ENOSPC."""
    with open(path / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 1024)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.parametrize("how", ["tmpfs-16k", "injected-ENOSPC"])
def test_full_disk_keeps_the_last_good_record(tmp_path, vllm_modules, monkeypatch, patchkit_log, how):
    """A record that fits is written; then the disk fills up; the next flush fails with a warning,
    the previous record is still whole and readable, and no temporary file is left."""
    if how == "tmpfs-16k":
        disk = tmp_path / "disk"
        if not _tmpfs(disk, "size=16k"):
            pytest.skip("mount not permitted here (the injected ENOSPC variant covers this)")
    else:
        disk = tmp_path / "disk"
        disk.mkdir()
    try:
        loader = _healthy_only(tmp_path, disk / "status")
        loader.run_import_stage()
        first = loader.flush()
        assert first is not None
        good = first.read_text()
        if how == "tmpfs-16k":
            _fill(disk)
        else:
            real_fdopen = os.fdopen


            monkeypatch.setattr(record_mod.os, "fdopen", lambda fd, *a, **kw: FullDisk(real_fdopen(fd, *a, **kw)))
        loader.records["healthy"].calls = 123  # something new to write
        loader.process.notes.append("x" * 20000)  # more than the disk has left
        assert loader.flush() is None  # the failure is a warning, not an exception
        warned = [r.getMessage() for r in patchkit_log.records if "cannot write records to" in r.getMessage()]
        assert warned and "No space left on device" in warned[-1], warned
        assert first.read_text() == good and json.loads(good)["patches"], "the last good record was damaged"
        assert not list(first.parent.glob(".*")), "temporary file left behind"
        loader.unpatch()
    finally:
        if how == "tmpfs-16k":
            _umount(disk)


def test_no_home_directory_never_stops_vllm(tmp_path, vllm_modules, monkeypatch):
    import pwd

    for var in ("VLLM_PATCHKIT_STATUS_DIR", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    doc = patch_doc(id="faulty", kind="wrap", target=POOL, processes=["engine_core"], required=False)
    pdir = tmp_path / "p"
    loader = build_loader(pdir, doc, pins={POOL: live_pin(POOL)}, status_dir=None)
    try:
        loader.run_import_stage()
    finally:
        loader.unpatch()


# -- the same faults through vLLM's own plugin loading, in a fresh process ------------------------------
ENTRY_POINT = textwrap.dedent("""
    import json, os, sys
    import vllm.plugins
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.executor.abstract as ex
    from vllm_patchkit.runtime import state as runtime
    from vllm_patchkit.declaration.errors import RequiredPatchFailed
    out = {}
    del kvu._pool_bytes_per_block              # optional pool-bytes-passthrough loses its target
    vllm.plugins.load_general_plugins()         # must return
    out["optional"] = {r.patch: [r.state, r.code, r.reason] for r in runtime.current().records.values()}
    ex.Executor.__init__ = lambda self, vllm_config, extra: None   # required core.config-ready.engine-core: replaced
    vllm.plugins.plugins_loaded = False
    runtime.reset()
    try:
        vllm.plugins.load_general_plugins()
        out["required"] = "returned"
    except RequiredPatchFailed as exc:
        out["required"] = str(exc)
    print("RESULT" + json.dumps(out))
""")


def test_faults_through_vllms_plugin_loading(tmp_path):
    """vLLM calls the entry point itself (load_general_plugins, VLLM_PLUGINS=vllm_patchkit) in an EngineCore
    role: an optional patch's missing target leaves vLLM running; a required hook replaced by a plain
    setattr stops it with RequiredPatchFailed raised out of vLLM's own plugin loading."""
    env = {**os.environ, "VLLM_PLUGINS": "vllm_patchkit", "VLLM_PATCHKIT_ROLE": "engine_core",
           "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status"), "VLLM_PATCHKIT_FLUSH_SECONDS": "0",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    env.pop("VLLM_PATCHKIT_RUN_ID", None)
    done = subprocess.run([sys.executable, "-c", ENTRY_POINT], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line is not None, done.stderr[-3000:]
    out = json.loads(line[len("RESULT"):])
    state, code, reason = out["optional"]["pool-bytes-passthrough@1"]
    assert (state, code) == ("failed", "target") and "_pool_bytes_per_block" in reason
    assert out["optional"]["core.config-ready.engine-core@1"][0] == "applied"
    msg = out["required"]
    assert msg != "returned"
    for part in ("core.config-ready.engine-core@1", "vllm.v1.executor.abstract:Executor.__init__",
                 "expected '(self, vllm_config)'", "found '(self, vllm_config, extra)'"):
        assert part in msg, (part, msg)

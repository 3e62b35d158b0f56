"""The start-up cache cannot lie (issue 21, item 3). Each test tampers with the real cache files on disk the way
the issue did, then starts a loader as a new process would (the module-level state of the caches reset; one
test runs real processes and reads `vllm-patchkit status --json`). Each failed before its fix: what happened
then is in its docstring."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from tests.probes import REGISTER
from vllm_patchkit.upstream import cache
from vllm_patchkit.upstream import cache_stamps
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.reporting import status
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors, RequiredPatchFailed
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.patchsets import EXTRA_ENV
from vllm_patchkit.tools.releases import installed_version

from ..framework.helpers import patch_doc, write_patch

INSTALLED = installed_version() or "0.31.0"  # the sets' manifests are written for the release installed here


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(folder))
    new_process(monkeypatch)
    return folder


def new_process(monkeypatch) -> None:
    """What a new vLLM process starts with: no cache read yet, no record attached."""
    monkeypatch.setattr(fp, "_fp_cache", None)
    monkeypatch.setattr(cache_stamps, "_INSTALLATION", None)
    monkeypatch.setattr(cache, "_sink", None)
    monkeypatch.setattr(cache, "_pending", [])
    monkeypatch.setattr(cache, "_logged", set())


@pytest.fixture
def victim(tmp_path, monkeypatch):
    """A module whose `f` a third party wrapped (functools.wraps, code outside vLLM): a conflict for a wrap
    pinned without that layer."""
    name = f"victim_{uuid.uuid4().hex[:8]}"
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{name}_thirdparty.py").write_text(textwrap.dedent("""\
        import functools

        def deco(fn):
            @functools.wraps(fn)
            def inner(*a, **k):
                return fn(*a, **k)
            return inner
        """))
    (mods / f"{name}.py").write_text(textwrap.dedent(f"""\
        from {name}_thirdparty import deco

        @deco
        def f(a, b=1):
            return a

        def g(a, b=1):
            return a
        """))
    monkeypatch.syspath_prepend(str(mods))
    __import__(name)
    yield name
    for m in (name, f"{name}_thirdparty"):
        sys.modules.pop(m, None)


def extra_set(tmp_path, monkeypatch, victim: str, *, required=True, target="f", signature="(a, b=1)") -> Path:
    """An extra folder (its own manifests/) with one required wrap of `victim:<target>`, pinned without wrappers."""
    folder = tmp_path / "guard"
    write_patch(folder, "guard", patch_doc(id="guard", kind="wrap", target=f"{victim}:{target}",
                                           processes=["frontend"], required=required))
    (folder / "manifests").mkdir(exist_ok=True)
    (folder / "manifests" / f"vllm-{INSTALLED}.yaml").write_text(yaml.safe_dump({
        "vllm": INSTALLED, "generated_by": "test",
        "patches": [{"patch": "guard@1", "targets": {f"{victim}:{target}": {"kind": "function", "signature": signature}}}]}))
    monkeypatch.setenv(EXTRA_ENV, str(folder))
    return folder


def start(tmp_path) -> Loader:
    """The loader of a front end, as the plugin builds it, through the import stage (unpatched afterwards)."""
    loader = Loader.builtin(role="frontend", sets=["extra:guard"], status_dir=tmp_path / "status")
    try:
        loader.run_import_stage()
    finally:
        loader.unpatch()
    return loader


def the_entry(cache_dir: Path) -> Path:
    [entry] = cache_dir.glob("patchsets-*.json")
    return entry


def rewrite_keeping_stat(path: Path, edit) -> None:
    """Edit the body in place, the header (with its digest) and the mtime left as they were."""
    st = path.stat()
    head, _, body = path.read_bytes().partition(b"\n")
    data = json.loads(body)
    edit(data)
    with open(path, "r+b") as fh:  # in place: the same inode
        fh.write(head + b"\n" + json.dumps(data, separators=(",", ":")).encode())
        fh.truncate()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def notes_of(loader: Loader) -> str:
    return "\n".join(loader.process.notes)


# -- the cached patch sets ---------------------------------------------------------------------------------------
def test_required_flipped_to_false_in_the_cached_set_is_detected_and_the_set_rebuilt(tmp_path, cache_dir, victim,
                                                                                       monkeypatch):
    """Before: with `required` flipped to false inside the cached pickle (mtime kept), the conflict became a
    warning and start-up went on."""
    extra_set(tmp_path, monkeypatch, victim)
    with pytest.raises(RequiredPatchFailed) as first:
        start(tmp_path)
    assert first.value.record.code == "conflict"
    entry = the_entry(cache_dir)

    rewrite_keeping_stat(entry, lambda d: d["content"]["patches"]["guard@1"].update(required=False))
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed) as again:
        start(tmp_path)
    rec = again.value.record
    assert rec.required and rec.code == "conflict"
    proc = cache._sink  # the record of the process's loader (written at the failure: status shows it)
    said = [n for n in proc.notes if n.startswith(f"cache: rebuilt: {entry.name}")]
    assert said and "does not match the digest" in said[0], proc.notes
    assert said[0] in proc.warnings
    assert cache.read_entry(entry.name)[1] is None  # rewritten, verified again
    assert json.loads(entry.read_bytes().partition(b"\n")[2])["content"]["patches"]["guard@1"]["required"] is True


def test_a_patch_deleted_from_the_cached_set_is_back_with_its_row(tmp_path, cache_dir, victim, monkeypatch):
    """Before: with the patch deleted from the cached pickle, the process had no row for it at all."""
    extra_set(tmp_path, monkeypatch, victim, required=False)
    start(tmp_path)

    def delete(d):
        for part in ("patches", "files", "set_of"):
            del d["content"][part]["guard@1"]

    rewrite_keeping_stat(the_entry(cache_dir), delete)
    new_process(monkeypatch)
    loader = start(tmp_path)
    assert loader.records["guard"].state == "failed" and loader.records["guard"].code == "conflict"
    assert "cache: rebuilt: patchsets-" in notes_of(loader)


def test_an_entry_with_a_recomputed_digest_but_a_wrong_type_is_refused(tmp_path, cache_dir, victim, monkeypatch):
    """The digest is no signature (it needs no secret); what the entry holds is still checked against the schema's
    types when it is read back, so a hand-made entry cannot hand the loader a `required: "no"`."""
    extra_set(tmp_path, monkeypatch, victim)
    with pytest.raises(RequiredPatchFailed):
        start(tmp_path)
    entry = the_entry(cache_dir)
    body = json.loads(entry.read_bytes().partition(b"\n")[2])
    body["content"]["patches"]["guard@1"]["required"] = "no"
    assert cache.write(entry.name, body)  # framed with a correct digest
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed) as again:
        start(tmp_path)
    assert again.value.record.required is True
    note = next(n for n in cache._sink.notes if n.startswith("cache: rebuilt"))
    assert "does not fit the schema" in note and "Expected `bool`, got `str` - at `$.required`" in note


def test_a_malformed_vetted_part_with_a_recomputed_digest_is_refused(tmp_path, cache_dir, victim, monkeypatch):
    """What the entry's writer checked (sets_cache.Vetted) is read as defensively as the sets: a `modules` that is
    no list is refused and the set rebuilt; a `no_contradictions` that is not `true` leaves the check to run."""
    extra_set(tmp_path, monkeypatch, victim)
    with pytest.raises(RequiredPatchFailed):
        start(tmp_path)
    entry = the_entry(cache_dir)
    body = json.loads(entry.read_bytes().partition(b"\n")[2])
    assert body["content"]["vetted"]["no_contradictions"] is True and victim in body["content"]["vetted"]["modules"]
    body["content"]["vetted"] = {"no_contradictions": "yes", "modules": 5}
    assert cache.write(entry.name, body)  # framed with a correct digest
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed):
        start(tmp_path)
    note = next(n for n in cache._sink.notes if n.startswith("cache: rebuilt"))
    assert "does not fit the schema" in note


def test_an_unchanged_entry_is_used_and_the_record_says_so(tmp_path, cache_dir, victim, monkeypatch):
    extra_set(tmp_path, monkeypatch, victim, required=False)
    first = start(tmp_path)
    assert f"cache: written: {the_entry(cache_dir).name}" in notes_of(first)
    new_process(monkeypatch)
    second = start(tmp_path)
    assert f"cache: used: {the_entry(cache_dir).name}" in notes_of(second)
    assert second.patch_set.patches == first.patch_set.patches
    assert {v: (m.manifest, m.path) for v, m in second.manifests.items()} == \
           {v: (m.manifest, m.path) for v, m in first.manifests.items()}


def test_a_patch_file_edited_with_its_size_and_mtime_kept_is_noticed_by_its_digest(tmp_path, cache_dir, victim,
                                                                                    monkeypatch):
    """Before: only (size, mtime) of the sets' files were compared, so an edit that kept both reused the old set."""
    folder = extra_set(tmp_path, monkeypatch, victim, required=False)
    start(tmp_path)
    path = folder / "guard.yaml"
    st = path.stat()
    text = path.read_text()
    assert "required: false" in text
    path.write_text(text.replace("required: false", "required: true "))  # same size, same inode
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed):
        start(tmp_path)
    assert f"{path} changed" in "\n".join(cache._sink.notes)


def test_no_entry_is_ever_unpickled(tmp_path, cache_dir, victim, monkeypatch):
    """Before: the patch sets were cached as a pickle, and a pickle is code: whoever could write the cache ran code
    in every vLLM process that read it."""
    import pickle

    def refuse(*a, **k):
        raise AssertionError("a cache entry was unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    extra_set(tmp_path, monkeypatch, victim, required=False)
    start(tmp_path)
    new_process(monkeypatch)
    assert "cache: used" in notes_of(start(tmp_path))
    assert not list(cache_dir.glob("*.pickle"))


# -- the patch set's entry-point module ----------------------------------------------------------------------------
def _installed_set(site: Path, victim: str) -> Path:
    """A distribution (dist-info + package) contributing the set `epset` through the entry point."""
    pkg = site / "epset_pkg"
    (pkg / "patches" / "manifests").mkdir(parents=True)
    write_patch(pkg / "patches", "guard", patch_doc(id="ep-guard", kind="wrap", target=f"{victim}:g",
                                                    processes=["frontend"], required=True))
    (pkg / "patches" / "manifests" / f"vllm-{INSTALLED}.yaml").write_text(yaml.safe_dump({
        "vllm": INSTALLED, "generated_by": "test",
        "patches": [{"patch": "ep-guard@1", "targets": {f"{victim}:g": {"kind": "function", "signature": "(a, b=1)"}}}]}))
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        from vllm_patchkit.declaration.patchsets import PatchSetSource

        def patch_set():
            here = Path(__file__).resolve().parent / "patches"
            return PatchSetSource("epset", here, here / "manifests")
        """))
    info = site / "epset_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epset-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vllm_patchkit.patch_sets]\nepset = epset_pkg:patch_set\n")
    (info / "RECORD").write_text("")
    return pkg / "__init__.py"


def test_an_entry_point_module_changed_to_raise_is_not_hidden_by_the_cache(tmp_path, cache_dir, victim, monkeypatch):
    """Before: the cache key did not cover the set's entry-point module: changed to raise, the next start-up still
    applied the cached set."""
    site = tmp_path / "site"
    module = _installed_set(site, victim)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(EXTRA_ENV, raising=False)
    try:
        loader = Loader.builtin(role="frontend", sets=["epset"], write_records=False)
        assert "ep-guard@1" in loader.patch_set.patches
        new_process(monkeypatch)
        assert "cache: used" in notes_of(Loader.builtin(role="frontend", sets=["epset"], write_records=False))

        module.write_text('raise RuntimeError("broken plugin")\n' + module.read_text())
        sys.modules.pop("epset_pkg", None)
        new_process(monkeypatch)
        with pytest.raises(DeclarationError) as ei:
            Loader.builtin(role="frontend", sets=["epset"], write_records=False)
        assert "entry point epset = epset_pkg:patch_set" in str(ei.value) and "broken plugin" in str(ei.value)
        assert f"cache: rebuilt: " in cache._pending[-1][0] and f"{module} changed" in cache._pending[-1][0]
    finally:
        sys.modules.pop("epset_pkg", None)


# -- entries this process must not trust -----------------------------------------------------------------------------
def _forged(cache_dir: Path, tmp_path, monkeypatch, victim) -> Path:
    """A well-formed entry (correct digest) that says the required patch is optional."""
    extra_set(tmp_path, monkeypatch, victim)
    with pytest.raises(RequiredPatchFailed):
        start(tmp_path)
    entry = the_entry(cache_dir)
    body = json.loads(entry.read_bytes().partition(b"\n")[2])
    body["content"]["patches"]["guard@1"]["required"] = False
    assert cache.write(entry.name, body)
    return entry


def _refused(tmp_path, monkeypatch, words: str) -> None:
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed) as ei:  # the set read from the files: the patch is required
        start(tmp_path)
    assert ei.value.record.required
    said = [n for n in cache._sink.notes if n.startswith("cache: rebuilt: patchsets-")]
    assert said and words in said[0], cache._sink.notes
    assert said[0] in cache._sink.warnings


def test_a_group_writable_entry_is_ignored(tmp_path, cache_dir, victim, monkeypatch):
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    os.chmod(entry, 0o664)
    _refused(tmp_path, monkeypatch, "group/world-writable (mode 664)")


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_an_entry_owned_by_another_user_is_ignored(tmp_path, cache_dir, victim, monkeypatch):
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    os.chown(entry, 12345, 12345)
    _refused(tmp_path, monkeypatch, "owned by uid 12345")


def test_an_entry_that_is_a_symlink_is_not_followed(tmp_path, cache_dir, victim, monkeypatch):
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    elsewhere = tmp_path / "planted.json"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    _refused(tmp_path, monkeypatch, "a symlink")


def test_an_entry_that_is_a_fifo_neither_blocks_nor_is_read(tmp_path, cache_dir, victim, monkeypatch):
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    entry.unlink()
    os.mkfifo(entry, 0o600)
    _refused(tmp_path, monkeypatch, "not a regular file")
    assert stat.S_ISFIFO(entry.lstat().st_mode) is False  # replaced by a real entry


# -- the live fingerprints -------------------------------------------------------------------------------------------


def _status(tmp_path) -> tuple[int, dict]:
    cli = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--json"], capture_output=True, text=True,
                         env={**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status")}, timeout=120)
    return cli.returncode, json.loads(cli.stdout)


def test_a_forged_fingerprint_does_not_pass_a_changed_target(tmp_path, cache_dir, victim, monkeypatch):
    """Before: with a target's entry in fingerprints.json set to the pinned signature while the live target
    differed, the required patch was `applied` and `status` exited 0 (with the cache off it failed, as it must).
    Real processes: the plugin's register() as the front end runs it, then `vllm-patchkit status --json`."""
    mods = tmp_path / "mods"
    extra_set(tmp_path, monkeypatch, victim, target="g")  # g is not wrapped: only its signature is judged
    env = {cache.CACHE_DIR_ENV: str(cache_dir), EXTRA_ENV: os.environ[EXTRA_ENV],
           "PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p)}
    # the target's module is imported before the plugin loads (as vLLM has imported its own by then)
    script = REGISTER.replace("from vllm_patchkit.runtime.plugin", f"import {victim}\nfrom vllm_patchkit.runtime.plugin")

    def run():
        full = {**os.environ, **env, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "status")}
        full.pop("VLLM_PATCHKIT_RUN_ID", None)
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full, timeout=300)

    ok = run()
    assert ok.returncode == 0, ok.stdout + ok.stderr[-3000:]
    assert _status(tmp_path)[0] == 0

    source = mods / f"{victim}.py"
    source.write_text(source.read_text().replace("def g(a, b=1)", "def g(a, c=2)"))  # the live target changes
    bad = run()
    changed = "expected '(a, b=1)', found '(a, c=2)'"
    assert bad.returncode == 3 and changed in bad.stdout, bad.stdout + bad.stderr[-2000:]

    fps = cache_dir / "fingerprints.json"
    fst = fps.stat()
    head, _, body = fps.read_bytes().partition(b"\n")
    data = json.loads(body)
    forged = [k for k in data["entries"] if f"{victim}:g|" in k and f"|{source.stat().st_mtime_ns}|" in k]
    assert forged, data["entries"].keys()
    for k in forged:
        data["entries"][k][0] = "(a, b=1)"  # the pinned signature
    fps.write_bytes(head + b"\n" + json.dumps(data, separators=(",", ":")).encode())
    os.utime(fps, ns=(fst.st_atime_ns, fst.st_mtime_ns))

    again = run()
    assert again.returncode == 3 and changed in again.stdout, again.stdout + again.stderr[-2000:]
    code, js = _status(tmp_path)
    assert code == 1 and js["exit_code"] == 1
    [proc] = [p for p in js["processes"] if p["role"] == "frontend"]
    said = [n for n in proc["notes"] if n.startswith("cache: rebuilt: fingerprints.json")]
    assert said and "does not match the digest" in said[0], proc["notes"]
    assert said[0] in js["warnings"]
    assert any(n.startswith("cache: used: patchsets-") for n in proc["notes"])


# -- the key -----------------------------------------------------------------------------------------------------
def test_a_folder_a_package_appends_inside_site_packages_does_not_change_the_key(tmp_path, monkeypatch):
    """Before: importing setuptools appends `site-packages/setuptools/_vendor` (which holds dist-info folders of its
    own) to sys.path, so a process that had imported it computed another key than one that had not: the entry the
    first process of an installation wrote was never found by the others (every one validated again)."""
    site = tmp_path / "site"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    (site / "vendoring" / "_vendor" / "inner-2.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(cache_stamps, "_INSTALLATION", None)
    before = cache_stamps.installation_stamp()
    sys.path.append(str(site / "vendoring" / "_vendor"))
    monkeypatch.setattr(cache_stamps, "_INSTALLATION", None)
    assert cache_stamps.installation_stamp() == before
    (site / "other-1.0.dist-info").mkdir()  # an install still changes it
    monkeypatch.setattr(cache_stamps, "_INSTALLATION", None)
    assert cache_stamps.installation_stamp() != before


# -- the trust boundary (docs/architecture.md, "The start-up cache") ----------------------------------------------
def test_an_entry_this_user_wrote_is_believed_as_written(tmp_path, cache_dir, victim, monkeypatch):
    """The stated boundary (issue 33, item 5): a writer that is this user, frames a forged body with a digest it
    computed again, and leaves every input's stamp as the reader finds it, is believed; its entry is named in the
    record (`cache: used: ENTRY`). Nothing of the content is derived again from the YAML (that is what the cache
    saves). Such a writer can equally write the records `status` reads, or the code on this user's sys.path."""
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    new_process(monkeypatch)
    loader = start(tmp_path)  # no RequiredPatchFailed: the forged `required: false` is what this process ran with
    assert loader.records["guard"].required is False and loader.records["guard"].code == "conflict"
    assert f"cache: used: {entry.name} (its digest and every input verified)" in notes_of(loader)


def test_an_entry_restored_from_elsewhere_is_not_used(tmp_path, cache_dir, victim, monkeypatch):
    """An entry made on another machine or checkout (a CI cache, a backup, a shared volume), forged or not, never
    matches files it was not written over: the same content, size and mtime in a file made anew (another inode)
    is another input."""
    entry = _forged(cache_dir, tmp_path, monkeypatch, victim)
    yaml_file = tmp_path / "guard" / "guard.yaml"
    st = yaml_file.stat()
    text = yaml_file.read_bytes()
    anew = yaml_file.with_name(".guard.yaml.new")
    anew.write_bytes(text)  # another checkout of the same commit (made while the old file exists: another inode)
    os.utime(anew, ns=(st.st_atime_ns, st.st_mtime_ns))
    anew.replace(yaml_file)
    assert yaml_file.stat().st_ino != st.st_ino
    new_process(monkeypatch)
    with pytest.raises(RequiredPatchFailed) as ei:
        start(tmp_path)
    assert ei.value.record.required
    assert f"cache: rebuilt: {entry.name}: {yaml_file} changed" in cache._sink.notes

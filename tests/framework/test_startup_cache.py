"""Start-up caches (cache.py): reused while what they depend on is unchanged, recomputed on any change, and
never trusted when corrupt or not this user's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vllm_patchkit.upstream import cache
from vllm_patchkit.upstream import cache_stamps
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.runtime.loader import Loader

from .helpers import patch_doc, write_patch


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(folder))
    monkeypatch.setattr(fp, "_fp_cache", None)
    return folder


def _count(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


# -- live fingerprints ----------------------------------------------------------------------------------------------
def test_live_fingerprint_is_computed_once_then_read_from_the_cache(cache_dir, monkeypatch):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    first = fp.live(get_kv_cache_configs, False, with_digest=True)
    assert (cache_dir / "fingerprints.json").is_file()
    assert oct((cache_dir / "fingerprints.json").stat().st_mode & 0o777) == "0o600"
    assert oct(cache_dir.stat().st_mode & 0o777) == "0o700"
    monkeypatch.setattr(fp, "_fp_cache", None)  # a new process: only the file
    parsed = _count(monkeypatch, fp, "_parse_def")
    again = fp.live(get_kv_cache_configs, False, with_digest=True)
    assert again == first and parsed == []
    # without the digest it is another entry (the pin may or may not carry one)
    assert fp.live(get_kv_cache_configs, False).source_digest is None and len(parsed) == 1


def test_a_changed_source_file_is_fingerprinted_again(cache_dir, tmp_path, monkeypatch):
    mod = tmp_path / "fp_mod_cache.py"
    mod.write_text("def f(a, b=1):\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    m = importlib.import_module("fp_mod_cache")
    try:
        assert fp.live(m.f, False).signature == "(a, b=1)"
        mod.write_text("def f(a, b=2):\n    return a\n")  # same size: the mtime tells
        os.utime(mod, ns=(time.time_ns(), time.time_ns() + 10_000_000))
        importlib.reload(m)
        assert fp.live(m.f, False).signature == "(a, b=2)"
    finally:
        import sys

        sys.modules.pop("fp_mod_cache", None)


def test_a_corrupt_or_foreign_fingerprint_cache_is_ignored_and_rewritten(cache_dir, monkeypatch):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    want = fp.live(get_kv_cache_configs, False, with_digest=True)
    path = cache_dir / "fingerprints.json"
    path.write_text('{"format": 2, "trunc')  # a torn file, as a crash of another writer could not leave it
    monkeypatch.setattr(fp, "_fp_cache", None)
    assert fp.live(get_kv_cache_configs, False, with_digest=True) == want
    assert cache.read("fingerprints.json") is not None  # rewritten
    # a planted entry (with a correct digest) in a group-writable file is not read: the real source is parsed
    data = cache.read("fingerprints.json")
    for key in data["entries"]:
        data["entries"][key] = ["(forged)", "sha256:0"]
    assert cache.write("fingerprints.json", data)
    os.chmod(path, 0o666)
    monkeypatch.setattr(fp, "_fp_cache", None)
    assert fp.live(get_kv_cache_configs, False, with_digest=True) == want


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_a_cache_entry_owned_by_another_user_is_not_read(cache_dir):
    cache.write("probe.json", {"v": 1})
    assert cache.read("probe.json") == {"v": 1}
    os.chown(cache_dir / "probe.json", 12345, 12345)
    assert cache.read("probe.json") is None
    os.chown(cache_dir / "probe.json", 0, 0)
    os.chmod(cache_dir, 0o777)  # a folder others can write: nothing in it is trusted
    assert cache.read("probe.json") is None


def test_cache_off_reads_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, "off")
    assert cache.write("x.json", {"a": 1}) is False and cache.read("x.json") is None


# -- the validated patch sets ---------------------------------------------------------------------------------------
def _extra_set(tmp_path: Path, summary: str) -> Path:
    folder = tmp_path / "extra"
    write_patch(folder, "extra_probe", patch_doc(id="extra-probe", kind="wrap", summary=summary,
                                                 target="vllm.v1.core.kv_cache_utils:get_kv_cache_configs",
                                                 processes=["worker"]))
    return folder


def test_patch_sets_are_validated_once_per_installation_and_again_after_an_edit(cache_dir, tmp_path, monkeypatch):
    from vllm_patchkit.declaration import declare

    folder = _extra_set(tmp_path, "first")
    monkeypatch.setenv("VLLM_PATCHKIT_EXTRA_PATCHES", str(folder))
    validated = _count(monkeypatch, declare, "load_patch_set")
    first = Loader.builtin(role="frontend", write_records=False)
    assert len(validated) == 1 and first.patch_set.patches["extra-probe@1"].summary == "first"
    [entry] = list(cache_dir.glob("patchsets-*.json"))
    second = Loader.builtin(role="frontend", write_records=False)
    assert len(validated) == 1  # from the cache
    assert second.patch_set.patches.keys() == first.patch_set.patches.keys()
    assert {v: m.path for v, m in second.manifests.items()} == {v: m.path for v, m in first.manifests.items()}

    _extra_set(tmp_path, "edited")  # a patch YAML changes: validated again, the new text wins
    os.utime(folder / "extra_probe.yaml", ns=(time.time_ns(), time.time_ns() + 10_000_000))
    third = Loader.builtin(role="frontend", write_records=False)
    assert len(validated) == 2 and third.patch_set.patches["extra-probe@1"].summary == "edited"

    (folder / "broken.yaml").write_text("id: [\n")  # a new file that does not parse: the error, never the cache
    from vllm_patchkit.declaration.errors import PatchSetErrors

    with pytest.raises(PatchSetErrors):
        Loader.builtin(role="frontend", write_records=False)
    (folder / "broken.yaml").unlink()

    entry.write_bytes(b"not an entry")  # corrupt: ignored and rewritten
    Loader.builtin(role="frontend", write_records=False)
    assert len(validated) == 4 and cache.read_entry(entry.name)[1] is None


def test_another_set_of_extra_folders_is_another_entry(cache_dir, tmp_path, monkeypatch):
    folder = _extra_set(tmp_path, "x")
    monkeypatch.setenv("VLLM_PATCHKIT_EXTRA_PATCHES", str(folder))
    with_extra = Loader.builtin(role="frontend", write_records=False)
    monkeypatch.delenv("VLLM_PATCHKIT_EXTRA_PATCHES")
    without = Loader.builtin(role="frontend", write_records=False)
    assert "extra-probe@1" in with_extra.patch_set.patches and "extra-probe@1" not in without.patch_set.patches


# -- the dependency roots of the conflict check ----------------------------------------------------------------------
def test_dependency_roots_are_kept_per_installation(cache_dir, monkeypatch):
    import importlib.metadata as md

    layers.upstream_code_roots.cache_clear()
    try:
        roots = layers.upstream_code_roots("vllm")
        assert any(r.endswith(os.sep + "torch") for r in roots)  # a declared dependency of vLLM
        layers.upstream_code_roots.cache_clear()

        def must_not_run():
            raise AssertionError("packages_distributions() recomputed")

        monkeypatch.setattr(md, "packages_distributions", must_not_run)
        assert layers.upstream_code_roots("vllm") == roots
        monkeypatch.setattr(cache_stamps, "_INSTALLATION", ["another installation"])
        layers.upstream_code_roots.cache_clear()
        # another installation: recomputed (here: the failing mapping leaves only vLLM itself and the stdlib)
        assert layers.upstream_code_roots("vllm") != roots
    finally:
        layers.upstream_code_roots.cache_clear()


def test_code_stamp_covers_the_validating_modules_where_they_live():
    """Regression: the stamp named files by their old flat paths; after the move into layer folders it would
    have stamped files that do not exist, and a changed schema would have reused what the old one validated."""
    from pathlib import Path

    from vllm_patchkit.declaration import schema
    from vllm_patchkit.runtime import loader
    from vllm_patchkit.upstream import cache
    from vllm_patchkit.upstream import cache_stamps

    stamped = {Path(entry[0]) for entry in cache_stamps.code_stamp()}
    assert all(p.is_file() for p in stamped)
    for module in (schema, loader, cache):
        assert Path(module.__file__).resolve() in stamped


WARM_CHILD = r"""
import json, sys
import vllm, vllm.engine.arg_utils  # what the front end has imported when vLLM loads the plugins
before = set(sys.modules)
from vllm_patchkit.runtime.loader import Loader
Loader.builtin(role="frontend", write_records=False)
new = sorted(set(sys.modules) - before)
print("RESULT" + json.dumps(new))
"""


def test_a_process_served_from_the_cache_imports_only_the_runtime(tmp_path):
    """The start-up path of every process after the first: no YAML reading, no specifier grammar, no offline tool
    (`benchmarks/startup.py` measures what that costs). Regression: the contradictions check compiled packaging's
    specifiers for every manifest's release in every process."""
    import json
    import subprocess
    import sys

    env = {**os.environ, cache.CACHE_DIR_ENV: str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", WARM_CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.split("RESULT", 1)[1]))
    warm = runs[1]
    ours = [m for m in warm if m.startswith("vllm_patchkit.")]
    assert not [m for m in ours if m.split(".")[1] in ("tools", "reporting", "hooks")], ours
    assert not {"vllm_patchkit.declaration.declare", "vllm_patchkit.declaration.yaml_files",
                "vllm_patchkit.declaration.features"} & set(warm)
    # no pydantic model of ours is defined (~6 ms): the sets come back as the schema's Structs
    assert "vllm_patchkit.declaration.validation" not in warm
    assert "packaging.specifiers" not in warm and "yaml" not in warm
    # what the entry's writer checked of the same sets is not checked again (sets_cache.Vetted)
    assert "vllm_patchkit.declaration.contradictions" not in warm


def test_a_module_vetted_by_the_cache_but_deleted_since_fails_its_patch(tmp_path, monkeypatch):
    """The module check trusts the start-up cache's list of modules found (sets_cache.Vetted): a module deleted
    since, in a folder the installation stamp does not cover, must still end in the patch's failure, never in
    an applied or skipped patch; without the list the plan refuses the set at once."""
    import sys

    from vllm_patchkit.declaration.errors import PatchSetErrors, RequiredPatchFailed
    from vllm_patchkit.runtime.sets_cache import Vetted

    from .helpers import make_loader, pinned_entry, write_module

    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "vetted_gone_mod", "def f(a):\n    return a\n")
    import vetted_gone_mod  # noqa: F401  (pinned live)

    docs = {"gone": patch_doc(id="gone", kind="wrap", target="vetted_gone_mod:f", processes=["frontend"],
                              implementation="vllm_patchkit.hooks.config_ready:before_vllm_config_post_init",
                              required=True)}
    entries = [pinned_entry("gone@1", "vetted_gone_mod:f")]
    (tmp_path / "vetted_gone_mod.py").unlink()
    sys.modules.pop("vetted_gone_mod")
    with pytest.raises(PatchSetErrors, match="vetted_gone_mod"):
        make_loader(tmp_path, docs, entries)
    loader = make_loader(tmp_path, docs, entries, vetted=Vetted(True, frozenset({"vetted_gone_mod"})))
    with pytest.raises(RequiredPatchFailed, match="gone"):
        loader.run_import_stage()
    assert loader.records["gone"].state == "failed"

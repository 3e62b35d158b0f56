"""Features: what the patches of one change share is declared once (features/<id>.yaml) and reaches every member
patch when a set is read; an environment variable is declared once, with one text; every misuse is an error
naming the file and the field; an edited feature file is read again, never served from the start-up cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import PatchSetErrors
from vllm_patchkit.declaration.patchsets import discover

from .helpers import patch_doc, write_patch

TARGET = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
VAR = {"name": "PK_TEST_INTERVAL", "default": "8", "doc": "tokens between things"}


def member(pid: str, **fields) -> dict:
    doc = patch_doc(id=pid, kind="wrap", target=TARGET, processes=["worker"], **{"feature": "shared-change", **fields})
    del doc["upstream"], doc["retire_when"]
    return doc


def write_feature(folder: Path, **fields) -> Path:
    doc = {"id": "shared-change", "summary": "two patches, one change", "upstream": "none: test feature",
           "retire_when": {"manual": "never (test)"}, "env_vars": [VAR], **fields}
    (folder / "features").mkdir(parents=True, exist_ok=True)
    path = folder / "features" / "shared_change.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def errors_of(folder: Path) -> list[str]:
    with pytest.raises(PatchSetErrors) as exc:
        load_patch_set([folder])
    return [str(e) for e in exc.value.errors]


def test_members_get_the_features_upstream_retirement_and_the_env_vars_they_name(tmp_path):
    """A member reads the feature's variables it names (`reads_env`), with the feature's one text; a member that
    names none reads none. Regression: every member was said to read every variable of its feature (a
    worker-side hook listed the scheduler's placement knobs in its docs and records)."""
    write_feature(tmp_path)
    write_patch(tmp_path, "a", member("a"))
    write_patch(tmp_path, "b", member("b", reads_env=["PK_TEST_INTERVAL"]))  # named: not a second declaration
    ps = load_patch_set([tmp_path])
    for key in ("a@1", "b@1"):
        p = ps.patches[key]
        assert (p.upstream, p.retire_when.manual, p.feature) == ("none: test feature", "never (test)", "shared-change")
    assert [(e.name, e.doc) for e in ps.patches["b@1"].env_vars] == [("PK_TEST_INTERVAL", "tokens between things")]
    assert ps.patches["a@1"].env_vars == []


def test_a_feature_may_say_why_for_members_that_do_not(tmp_path):
    write_feature(tmp_path, why="one reason for both")
    doc = member("a")
    del doc["why"]
    write_patch(tmp_path, "a", doc)
    assert load_patch_set([tmp_path]).patches["a@1"].why == "one reason for both"
    write_feature(tmp_path)  # no why anywhere: the patch's file and field are named
    assert any("a.yaml" in e and "why" in e and "neither the patch nor its feature" in e for e in errors_of(tmp_path))


def test_an_unknown_feature_names_the_patch_file_and_the_features_there_are(tmp_path):
    write_feature(tmp_path)
    write_patch(tmp_path, "a", member("a", feature="no-such-feature"))
    [error] = errors_of(tmp_path)
    assert "a.yaml" in error and "feature" in error and "'no-such-feature'" in error and "shared-change" in error


def test_a_member_repeating_what_its_feature_declares_is_refused(tmp_path):
    write_feature(tmp_path)
    write_patch(tmp_path, "a", {**member("a"), "upstream": "drifted copy"})
    [error] = errors_of(tmp_path)
    assert "a.yaml" in error and "upstream: declared by feature 'shared-change'" in error


def test_a_patch_without_a_feature_still_needs_its_own_upstream_and_retirement(tmp_path):
    doc = patch_doc(id="a", kind="wrap", target=TARGET, processes=["worker"])
    del doc["upstream"]
    write_patch(tmp_path, "a", doc)
    [error] = errors_of(tmp_path)
    assert "a.yaml" in error and "missing upstream" in error


def test_an_env_var_declared_twice_is_an_error_naming_both_files(tmp_path):
    """The drift this prevents: one variable declared by four patches whose texts had come apart."""
    write_feature(tmp_path)
    write_patch(tmp_path, "a", member("a", env_vars=[{**VAR, "doc": "a drifted text"}]))
    [error] = errors_of(tmp_path)
    assert "a.yaml" in error and "env_vars[0]" in error and "shared_change.yaml" in error and "declared once" in error


def test_an_env_var_named_but_declared_nowhere_is_an_error(tmp_path):
    write_patch(tmp_path, "a", patch_doc(id="a", kind="wrap", target=TARGET, processes=["worker"],
                                         reads_env=["PK_NOWHERE"]))
    [error] = errors_of(tmp_path)
    assert "a.yaml" in error and "reads_env[0]" in error and "PK_NOWHERE is named but declared nowhere" in error


def test_a_feature_file_whose_id_is_not_its_name_is_refused(tmp_path):
    path = write_feature(tmp_path)
    path.rename(path.with_name("other_name.yaml"))
    write_patch(tmp_path, "a", member("a"))
    errors = errors_of(tmp_path)
    assert any("other_name.yaml" in e and "does not match its file name" in e for e in errors)


def test_this_repositorys_image_publish_patches_are_one_feature_and_the_interval_is_declared_once():
    ps = load_patch_set(discover(with_env=False))
    members = sorted(p.id for p in ps.patches.values() if p.feature == "image-publish")
    assert {"image-publish", "image-publish-finish", "image-publish-preempt", "image-publish-split",
            "image-publish-suppress"} <= set(members)  # the five the issue named, and the pieces added since
    assert len({p.upstream for p in ps.patches.values() if p.feature == "image-publish"}) == 1
    kv = [p for p in ps.patches.values() if p.id == "kv-config-hook"]
    assert len(kv) >= 2 and {p.feature for p in kv} == {"kv-config-hook"}
    for name in ("VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS", "VLLM_PATCHKIT_IMAGE_DEMAND"):
        texts = {e.doc for p in ps.patches.values() for e in p.env_vars if e.name == name}
        assert len(texts) == 1, name
    # the placement knobs are read where the book is (the scheduler side), not by the worker-side pieces
    readers = {p.id for p in ps.patches.values() if "VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS" in {e.name for e in p.env_vars}}
    assert {"image-publish", "image-publish-admit", "kv-config-hook"} <= readers
    assert not {"image-slot-events", "image-kv-zeroing-off", "image-cow-refuse"} & readers


def test_an_edited_feature_file_is_read_again_not_served_from_the_cache(tmp_path, monkeypatch):
    """Regression guard: the start-up cache stamps the patches folder's files, not its subfolders' contents; the
    features folder is stamped itself, so an edited feature cannot leave stale upstream text in every process."""
    from vllm_patchkit.runtime.loader import Loader
    from vllm_patchkit.upstream import cache

    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "extra"
    path = write_feature(folder)
    write_patch(folder, "extra_probe", member("extra-probe"))
    monkeypatch.setenv("VLLM_PATCHKIT_EXTRA_PATCHES", str(folder))
    from vllm_patchkit.declaration import declare

    validated = []
    real = declare.load_patch_set
    monkeypatch.setattr(declare, "load_patch_set", lambda sources: validated.append(1) or real(sources))
    first = Loader.builtin(role="frontend", write_records=False)
    assert first.patch_set.patches["extra-probe@1"].upstream == "none: test feature"
    assert Loader.builtin(role="frontend", write_records=False) and len(validated) == 1  # the cache is in use
    write_feature(folder, upstream="none: edited")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    second = Loader.builtin(role="frontend", write_records=False)
    assert second.patch_set.patches["extra-probe@1"].upstream == "none: edited" and len(validated) == 2


def test_a_fifo_or_a_huge_file_among_the_features_is_an_error_not_a_hang(tmp_path):
    """Declaration files are read without blocking (a FIFO would hang every vLLM process at start-up) and bounded."""
    write_feature(tmp_path)
    write_patch(tmp_path, "a", member("a"))
    fifo = tmp_path / "features" / "stuck.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    errors = errors_of(tmp_path)
    assert time.monotonic() - started < 30
    assert any("stuck.yaml" in e and "not a regular file" in e for e in errors), errors
    fifo.unlink()
    from vllm_patchkit.declaration import yaml_files

    (tmp_path / "features" / "huge.yaml").write_bytes(b"#" * (yaml_files.MAX_BYTES + 1))
    assert any("huge.yaml" in e and "more than the" in e for e in errors_of(tmp_path))

"""The multi-release check on real vLLM releases, read statically: the installed 0.31.0 and the cached wheels of
0.32.0 / 0.33.0 / 0.34.0 (a test that needs a wheel skips naming it: scripts/fetch_wheels.sh fetches them).

0.34.0's verdicts on the shipped set are not asserted (its port is under way): on 0.34.0 the tests use a set
built here, pinned on the installed 0.31.0, whose required patch wraps a method 0.34.0 deleted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from packaging.specifiers import SpecifierSet

from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.manifest_files import write
from vllm_patchkit.tools.pin import pin_release
from vllm_patchkit.tools.releases import open_release

from .helpers import cached_wheel_or_skip, patch_doc, write_patches

ROOT = Path(__file__).resolve().parents[2]


def _json(capsys, args) -> tuple[int, dict]:
    code = main(args)
    return code, json.loads(capsys.readouterr().out)


def _admits(line: str, version: str) -> bool:
    return SpecifierSet(line.removeprefix("vllm")).contains(version, prereleases=True)


def test_shipped_set_on_the_three_pinned_releases(capsys):
    for v in ("0.32.0", "0.33.0"):
        cached_wheel_or_skip(v)
    code, doc = _json(capsys, ["check", "--vllm", "0.31.0,0.32.0,0.33.0", "--format", "json"])
    assert doc["releases"] == ["0.31.0", "0.32.0", "0.33.0"]
    assert code == max(0 if r["ok"] else 1 for r in doc["reports"].values())
    for row in doc["matrix"]:
        assert set(row["cells"]) == {"0.31.0", "0.32.0", "0.33.0"}, row["patch"]
    # every release has its own manifest and the set fits each: the line spans them, and claims nothing after
    assert code == 0
    assert doc["requirement"]["line"] == "vllm>=0.31.0,<=0.33.0"
    assert not _admits(doc["requirement"]["line"], "0.33.1")


def _set_built_here(tmp_path) -> tuple[Path, Path]:
    """A required wrap of the V1 GPU runner's `_update_states` (0.34.0 deleted the module) and an optional
    verbatim pass-through of `Scheduler.schedule`, pinned on the installed 0.31.0 by `pin`."""
    pdir = write_patches(tmp_path / "patches", [
        patch_doc("v1-update-states", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states",
                  required=True, processes=["worker"]),
        patch_doc("schedule-passthrough", "vllm.v1.core.sched.scheduler:Scheduler.schedule")])
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    write(pin_release(open_release("0.31.0"), load_patch_set([pdir]), {}, generated_by="test").manifest, mdir)
    return pdir, mdir


def test_a_set_broken_on_0340_stops_the_line_before_it(tmp_path, capsys):
    for v in ("0.32.0", "0.33.0", "0.34.0"):
        cached_wheel_or_skip(v)
    pdir, mdir = _set_built_here(tmp_path)
    code, doc = _json(capsys, ["check", "--vllm", ">=0.31,<0.35", "--patch-dir", str(pdir),
                               "--manifest-dir", str(mdir), "--format", "json"])
    assert doc["releases"][0] == "0.31.0" and "0.34.0" in doc["releases"]
    row = next(r for r in doc["matrix"] if r["patch"] == "v1-update-states")
    assert row["required"] is True
    assert row["cells"]["0.31.0"]["status"] == "ok"
    assert row["cells"]["0.34.0"]["status"] == "broken"
    [b] = [b for b in doc["reports"]["0.34.0"]["breakages"] if "v1-update-states@1" in b["patches"]]
    assert b["kind"] in ("target_removed", "target_moved") and b["breaking"]
    assert code == 1
    line = doc["requirement"]["line"]
    assert _admits(line, "0.31.0") and not _admits(line, "0.34.0") and not _admits(line, "0.34.1")
    assert "0.34.0" in doc["requirement"]["unsupported"]
    assert doc["blockers"]["0.34.0"] == ["v1-update-states@1 broken"]


def test_an_unexamined_release_between_two_examined_ones_is_excluded(tmp_path, capsys):
    cached_wheel_or_skip("0.33.0")
    pdir, mdir = _set_built_here(tmp_path)
    code, doc = _json(capsys, ["check", "--vllm", "0.31.0,0.33.0", "--patch-dir", str(pdir),
                               "--manifest-dir", str(mdir), "--format", "json"])
    assert code == 0 and doc["requirement"]["supported"] == ["0.31.0", "0.33.0"]
    # 0.32 was not examined (its wheel may well be in the cache): never claimed
    assert doc["requirement"]["line"] == "vllm>=0.31.0,<=0.33.0,!=0.32.*"
    assert doc["requirement"]["excluded"] == [{"clause": "!=0.32.*", "why": "no release of the series was examined"}]


def _corpus_set():
    spec = importlib.util.spec_from_file_location("corpus_set", ROOT / "scripts" / "corpus_set.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_corpus_plugin_matches_the_releases_its_ground_truth_says(tmp_path, capsys):
    """flash-head's places (tests/corpus/flash_head): the releases supported are those where the catalogue's
    truth (read from both sources by a person) has no break of a declared place; every corpus patch is required."""
    from tests.corpus.catalogue import load

    for v in ("0.32.0", "0.33.0"):
        cached_wheel_or_skip(v)
    patches, manifests = _corpus_set().write_set("flash_head", tmp_path / "flash_head")
    code, doc = _json(capsys, ["check", "--vllm", "0.31.0,0.32.0,0.33.0", "--patch-dir", str(patches),
                               "--manifest-dir", str(manifests), "--format", "json"])
    cat = load("flash_head")
    declared = [p for p in cat.places if p.declaration is not None]
    expected = ["0.31.0"] + [rel for rel in ("0.32.0", "0.33.0") if not any(p.truth[rel].breaks for p in declared)]
    assert doc["requirement"]["supported"] == expected
    assert code == (0 if expected == doc["releases"] else 1)
    for rel in doc["releases"]:
        for row in doc["matrix"]:
            place = row["patch"].removeprefix("flash-head-")
            breaks = rel != "0.31.0" and next(p for p in declared if p.id == place).truth[rel].breaks
            assert (row["cells"][rel]["status"] == "broken") == breaks, (row["patch"], rel)

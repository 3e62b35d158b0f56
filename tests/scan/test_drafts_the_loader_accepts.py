"""Drafts the loader accepts as written (issue 31, found adopting the held-out vllm-service-ple 0.2.2: the drafts of
two of its six sites could not be pinned until a person corrected them; the plugin then moved to the tuning split).
Built here from the constructs, not the plugin's code, against the installed vLLM read statically:

- a module-level function patched at a module that holds it by value (`default_loader` imports
  `filter_duplicate_safetensors_files` from `weight_utils`): drafted at its definition, with every holder that keeps
  the original in `copies` at once (pin named them one run at a time);
- a marker attribute the plugin adds to a vLLM class: drafted `adds: true` (pin said "the place is gone").
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import write

from .conftest import review_and_pin, write_plugin

WEIGHT_UTILS = "vllm.model_executor.model_loader.weight_utils:filter_duplicate_safetensors_files"
DEFAULT_LOADER = "vllm.model_executor.model_loader.default_loader:filter_duplicate_safetensors_files"
PLUGIN = '''
from vllm.model_executor.model_loader import default_loader
from vllm.v1.core.sched.scheduler import Scheduler

_orig = default_loader.filter_duplicate_safetensors_files

def _filter(*args, **kwargs):
    return _orig(*args, **kwargs)

def register():
    default_loader.filter_duplicate_safetensors_files = _filter
    Scheduler._myplug_patched = True
'''


def _drafts(tmp_path, upstream) -> dict:
    write_plugin(tmp_path / "src", {"myplug/__init__.py": PLUGIN})
    folder, _, rejected = write(scan(str(tmp_path / "src"), upstream=upstream), tmp_path / "out")
    assert not rejected
    return folder, {d["kind"]: d for d in (yaml.safe_load(y.read_text()) for y in folder.glob("*.yaml"))}


def test_a_by_value_holder_is_drafted_at_the_definition_with_every_holder(tmp_path, upstream):
    from vllm_patchkit.tools.static_copies import demanded_holders

    _, docs = _drafts(tmp_path, upstream)
    wrap = docs["wrap"]
    assert wrap["target"] == WEIGHT_UTILS
    holders = demanded_holders(upstream.release, WEIGHT_UTILS)
    assert wrap["copies"] == sorted({DEFAULT_LOADER, *holders}), (wrap["copies"], holders)
    if upstream.version() == "0.31.0":  # where the case was met: a second holder, which pin named one run later
        assert "vllm.model_executor.model_loader.weight_cache.protocol:filter_duplicate_safetensors_files" in holders


def test_a_name_the_plugin_adds_is_drafted_adds(tmp_path, upstream):
    _, docs = _drafts(tmp_path, upstream)
    assert docs["set"]["target"] == "vllm.v1.core.sched.scheduler:Scheduler._myplug_patched"
    assert docs["set"]["adds"] is True and docs["set"]["value"] is True


def test_reviewed_drafts_pin_as_written(tmp_path, upstream):
    """Only the review's own edits (the marker, why, upstream, retire_when): `pin` writes the manifest."""
    folder, _ = _drafts(tmp_path, upstream)
    out = review_and_pin(folder, tmp_path / "out")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 patch(es) listed, 0 not applicable" in out.stdout


def test_pin_names_every_holder_of_a_misdeclared_target(tmp_path, upstream):
    """A person's declaration at the holder: the refusal lists every holder to copy, not only the one declared."""
    folder, docs = _drafts(tmp_path, upstream)
    path = next(p for p in folder.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] == "wrap")
    doc = yaml.safe_load(path.read_text())
    del doc["draft"]
    doc.update(target=DEFAULT_LOADER, copies=[], why="needed", upstream="none: x", retire_when={"manual": "later"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for other in folder.glob("*.yaml"):
        if other != path:
            other.unlink()
    out = subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", "pin", "--dry-run", "--patch-dir",
                          str(folder), "--manifest-dir", str(folder / "manifests")], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "out")}, timeout=600)
    from vllm_patchkit.tools.static_copies import demanded_holders

    listed = ", ".join(sorted(set(demanded_holders(upstream.release, WEIGHT_UTILS)) | {DEFAULT_LOADER}))
    assert f"declare the target as {WEIGHT_UTILS} and list {listed} in `copies`" in out.stderr, out.stderr[-2000:]

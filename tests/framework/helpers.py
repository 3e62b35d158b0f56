"""Build small patch sets and manifests on disk, the way a plugin author would write them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml
import msgspec


from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.upstream.targets import resolve
from vllm_patchkit.tools.manifest_files import dump_fingerprint

BASE = dict(
    version=1,
    summary="test patch",
    why="exercise the loader",
    upstream="none: test",
    retire_when={"manual": "test"},
    required=False,
)


def patch_doc(**fields) -> dict:
    return {**BASE, **fields}


def write_patch(folder: Path, name: str, doc: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def live_pin(spec: str) -> dict:
    place = resolve(spec)
    raw = place.get_raw()
    f = msgspec.structs.replace(fp.live(raw, place.owner_is_class), wrappers=layers.wrapper_layers(raw))
    return dump_fingerprint(f)


def write_manifest(folder: Path, entries: list[dict], version: str = "0.31.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"vllm-{version}.yaml"
    path.write_text(yaml.safe_dump({"vllm": version, "generated_by": "test", "patches": entries}, sort_keys=False))
    return path


def pinned_entry(key: str, *specs: str) -> dict:
    return {"patch": key, "targets": {s: live_pin(s) for s in specs}}


def make_loader(tmp: Path, docs: dict[str, dict], entries: list[dict], role: str = "frontend", **kw) -> Loader:
    pdir, mdir = tmp / "patches", tmp / "manifests"
    for name, doc in docs.items():
        write_patch(pdir, name, doc)
    write_manifest(mdir, entries)
    ps = load_patch_set([pdir])
    ms = load_manifests([mdir], ps)
    kw.setdefault("vllm_version", "0.31.0")
    return Loader(ps, ms, role=role, status_dir=tmp / "status", **kw)


def write_module(tmp: Path, name: str, source: str) -> None:
    (tmp / f"{name}.py").write_text(textwrap.dedent(source))


def edit_in_tree(monkeypatch, spec: str, source: str):
    """vLLM's module-level function at `spec` as an edited source tree would define it: `source` (a def of the same
    name) compiled as vLLM's own code and installed in the module for the test (monkeypatch undoes it).

    The one fake: an edited file cannot be written into the shared venv, so the edited text is given to
    `linecache` under a file name of its own beside the module's (`<module>_edited.py`, inside vLLM's package,
    where an edited tree's file would be): the loader reads the def from there as it reads any live target, sees
    vLLM's code (not a foreign replacement), and the start-up fingerprint cache (keyed by a file's stat) holds
    nothing for it."""
    import importlib
    import linecache

    module_name, _, name = spec.partition(":")
    module = importlib.import_module(module_name)
    text = textwrap.dedent(source)
    fname = module.__file__[: -len(".py")] + "_edited.py"
    monkeypatch.setitem(linecache.cache, fname, (len(text), None, text.splitlines(keepends=True), fname))
    namespace = dict(vars(module))
    exec(compile(text, fname, "exec"), namespace)
    monkeypatch.setattr(module, name, namespace[name])
    return namespace[name]

"""Finding the sets (entry points of every distribution, ~20 ms), reading and validating every patch YAML and
manifest (~50 ms) give the same answer in every process of an installation: kept as JSON in
`patchsets-<key>.json`, the key made of what is installed, the framework's version and validating code, and the
environment the framework reads. The entry holds the stamp of every input the answer depends on, and is used only
while all of them are unchanged and its own digest matches (cache.read_entry); otherwise it is rebuilt from the
files, and the process record says why. The inputs: each file in the sets' folders by size, mtime, inode, and
each YAML's content digest; each entry point's module, the modules of its distribution imported by then and its
distribution's entry_points.txt, METADATA and RECORD, with their digests; the value of every environment variable
an entry point read or its set declares (declaration/entry_point_inputs.py). A set whose entry point enumerated
the environment is not cached: its answer may depend on any variable.

What the entry is trusted with (docs/architecture.md, "The start-up cache"): its content is believed as written
by this user; nothing of it is derived again from the YAML (that is the ~50 ms it saves)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple, Optional

from vllm_patchkit.declaration import manifest as manifests_mod
from vllm_patchkit.declaration.entry_point_inputs import ALL
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.patchsets import EXTRA_ENV
from vllm_patchkit.declaration.preconditions import admits_for, remember_admits
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Manifest
from vllm_patchkit.runtime.modules import module_exists
from vllm_patchkit.upstream import cache
from vllm_patchkit.upstream import cache_models, cache_stamps

log = logging.getLogger("vllm.patchkit")


class Vetted(NamedTuple):
    """What the entry's writer checked of the very sets it holds, so a warm process need not again (~2 ms): the
    manifests contradict no patch's `when.vllm` (the writer's loader raised otherwise, and the check reads only
    the sets), and these modules, named by the sets' patches, were found in this installation (its stamp is
    the entry's key)."""

    no_contradictions: bool
    modules: frozenset


def _named_modules(ps: PatchSet) -> set[str]:
    return {Target.parse(place).module for p in ps.patches.values()
            for place in (p.target, p.implementation, p.value_from, *p.copies, *p.uses) if place}


def _sets_key(sets, with_env: bool) -> tuple[list, str]:
    key = [cache_stamps.installation_stamp(), cache_stamps.framework_version(), cache_stamps.code_stamp(),
           sorted(sets) if sets is not None else None, with_env, os.environ.get(EXTRA_ENV) if with_env else None]
    return key, cache_stamps.digest_of(key)


def _sets_inputs(folders: list, files: list, env: list) -> dict:
    return {"folders": cache_stamps.folder_stamp(folders, digest=lambda p: p.endswith(".yaml")),
            "files": cache_stamps.file_stamp(files), "env": cache_stamps.env_stamp(env)}


def cached_sets(sets, with_env: bool) -> tuple[Optional[tuple], Optional[str]]:
    """((patch set, manifests, Vetted), the entry's name) from a verified entry, else (None, the entry's name) after saying
    why it was not used (a missing entry is said by `cache_sets`, once it is written). The cyclic GC is paused
    meanwhile: the entry's JSON and its models are thousands of young objects that would otherwise bring a full
    collection over all of vLLM's forward (~1 ms per process, benchmarks/startup.py)."""
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        return _read_cached_sets(sets, with_env)
    finally:
        if paused:
            gc.enable()


def _read_cached_sets(sets, with_env: bool) -> tuple[Optional[tuple], Optional[str]]:
    if cache.cache_dir() is None:
        cache.report(f"cache: off ({cache.CACHE_DIR_ENV}={os.environ.get(cache.CACHE_DIR_ENV)})")
        return None, None
    try:
        _, digest = _sets_key(sets, with_env)
    except Exception as exc:
        log.debug("vllm-patchkit: patch-set cache key: %s", exc)
        return None, None
    name = f"patchsets-{digest}.json"
    body, why = cache.read_entry(name)
    if why is not None:
        cache.rebuilt(name, why[1], why[0])
        return None, name
    if body is None:
        return None, name
    try:
        if type(body) is not dict:
            raise cache_models.NotRebuildable("not a mapping")
        if body.get("key") != digest:
            cache.rebuilt(name, f"it holds the entry of another key ({body.get('key')!r:.20})", cache.TAMPERED)
            return None, name
        if not all(type(x) is list and all(type(p) is str for p in x)
                   for x in (body["folders"], body["files"], body["env"])):
            raise cache_models.NotRebuildable("its folders, files and env are not lists of names")
        now = _sets_inputs(body["folders"], body["files"], body["env"])
        if now != body["inputs"]:
            cache.rebuilt(name, cache_stamps.first_difference(body["inputs"], now), cache.STALE)
            return None, name
        content = body["content"]
        ps = PatchSet({k: cache_models.load_model(Patch, d) for k, d in content["patches"].items()},
                      dict(content["files"]), dict(content["set_of"]))
        ms = {v: manifests_mod.Loaded(cache_models.load_model(Manifest, m["manifest"]), m["path"])
              for v, m in content["manifests"].items()}
        admits = content.get("admits")
        for release, by_specifier in (admits.items() if type(admits) is dict else ()):
            if type(release) is str and type(by_specifier) is dict:
                remember_admits(by_specifier, release)
        vetted = content.get("vetted")
        vetted = Vetted(vetted["no_contradictions"] is True, frozenset(
            m for m in vetted["modules"] if type(m) is str)) if type(vetted) is dict else None
        if not all(isinstance(x, str) for d in (ps.files, ps.set_of) for kv in d.items() for x in kv) or not all(
                k == p.key for k, p in ps.patches.items()) or not all(isinstance(m.path, str) for m in ms.values()):
            raise cache_models.NotRebuildable("a file name or key of the wrong type")
    except (cache_models.NotRebuildable, AttributeError, KeyError, TypeError, ValueError) as exc:
        cache.rebuilt(name, f"its content does not fit the schema ({exc})", cache.TAMPERED)
        return None, name
    cache.report(f"cache: used: {name} (its digest and every input verified)")
    return (ps, ms, vetted), name


def cache_sets(name: Optional[str], sources, dirs, ps: PatchSet, ms: dict, vllm_version: str) -> None:
    if name is None:
        return
    try:
        not_json = [k for k, p in ps.patches.items() if not cache_models.cacheable(p)]
        not_json += [m.path for m in ms.values() if not cache_models.cacheable(m.manifest)]
        if not_json:
            cache.report(f"cache: not written: {name}: {', '.join(not_json)} does not come back from JSON unchanged")
            return
        from vllm_patchkit.declaration.features import FOLDER as FEATURES

        specs = sorted({p.when.vllm for p in ps.patches.values() if p.when.vllm is not None})
        features = {str(Path(s.patches) / FEATURES) for s in sources if (Path(s.patches) / FEATURES).is_dir()}
        folders = sorted({str(s.patches) for s in sources} | features | {str(d) for d in dirs})
        enumerated = [s.origin or s.name for s in sources if ALL in s.env]
        if enumerated:
            cache.report(f"cache: not written: {name}: {', '.join(enumerated)} enumerated the environment (its "
                         "answer may depend on any variable)")
            return
        # the framework's own modules are stamped in the key already (code_stamp)
        own = {row[0] for row in cache_stamps.code_stamp()}
        files = sorted({f for s in sources for f in s.inputs} - own)
        env = sorted({n for s in sources for n in s.env})
        content = {"patches": {k: cache_models.dumps(p) for k, p in ps.patches.items()}, "files": ps.files,
                   "set_of": ps.set_of,
                   "manifests": {v: {"path": m.path, "manifest": cache_models.dumps(m.manifest)} for v, m in ms.items()},
                   # each `when.vllm` judged for this process's release and every manifest's (the contradictions
                   # check reads them all): preconditions.remember_admits
                   "admits": {release: admits_for(specs, release) for release in sorted({*ms, vllm_version})},
                   # called once the loader accepted these sets: its contradictions check passed (Vetted)
                   "vetted": {"no_contradictions": True,
                              "modules": sorted(m for m in _named_modules(ps) if module_exists(m))}}
        body = {"key": name[len("patchsets-"):-len(".json")], "folders": folders, "files": files, "env": env,
                "inputs": _sets_inputs(folders, files, env), "content": content}
        if cache.write(name, body):
            cache.report(f"cache: written: {name}")
    except Exception as exc:  # never fatal: the next process validates again
        log.debug("vllm-patchkit: patch-set cache not written: %s", exc)

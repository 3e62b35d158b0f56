"""Run one malformed case through the whole pipeline and say what, if anything, went wrong.

The pipeline is the one the plugin entry point runs: read the patch set, read
the manifests, build a Loader per process role and run its import stage. A
malformed case must stop it with DeclarationError / PatchSetErrors, before any
Loader applies anything.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import yaml
import msgspec


from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers
from vllm_patchkit.declaration.features import FOLDER as FEATURES
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.runtime.loader import Loader, installed_vllm_version
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.runtime.record import APPLIED
from vllm_patchkit.upstream.targets import TargetError, resolve
from vllm_patchkit.tools.manifest_files import dump_fingerprint

from .mutations import Case, Corpus, dump, field_matches

ROLES = ("frontend", "engine_core", "worker")
WATCHED_ENV = ("VLLM_USE_BREAKABLE_CUDAGRAPH",)


def pinned_specs(patch) -> list[str]:
    specs = getattr(patch, "pinned_specs", None)
    return list(specs) if specs is not None else ([patch.target] if patch.target else []) + list(patch.copies)


def live_pin(spec: str) -> dict:
    place = resolve(spec)
    raw = place.get_raw()
    f = msgspec.structs.replace(fp.live(raw, place.owner_is_class), wrappers=layers.wrapper_layers(raw))
    d = dump_fingerprint(f)
    if not d.get("wrappers"):
        d.pop("wrappers", None)
    return d


def build_corpus() -> Corpus:
    """The shipped patch files, and a manifest pinning each (live, from the installed vLLM).

    The manifest is made here rather than read from manifests/ so that the base is
    valid by construction while other work changes the shipped manifests; one patch
    is moved to `not_applicable` so that section is mutated too.
    """
    dirs = [s.patches for s in installed_sources()]  # every installed set, the framework's own too
    ps = load_patch_set(dirs)  # the base must be valid
    texts = {p.name: p.read_text() for d in dirs for p in sorted(d.glob("*.yaml"))}
    docs = {n: yaml.safe_load(t) for n, t in texts.items()}
    from vllm_patchkit.declaration.preconditions import version_matches

    newest = {}  # the newest version of each patch that admits the installed release (its targets exist here)
    for p in ps.patches.values():
        if not version_matches(p.when, installed_vllm_version()):
            continue
        if p.id not in newest or p.version > newest[p.id].version:
            newest[p.id] = p
    # the file of the version in use on this release (a patch may have one file per version)
    file_of = {d["id"]: n for n, d in docs.items() if d["id"] in newest and d["version"] == newest[d["id"]].version}
    texts = {n: t for n, t in texts.items() if n in file_of.values()}  # other releases' versions: not loadable here
    docs = {n: d for n, d in docs.items() if n in file_of.values()}
    required_by_others = {r for p in newest.values() for r in p.requires}
    spare = max(pid for pid in newest if pid not in required_by_others)
    pinned = {pid: {"patch": p.key, "targets": {s: live_pin(s) for s in pinned_specs(p)}}
              for pid, p in sorted(newest.items())}
    entries = [e for pid, e in pinned.items() if pid != spare]
    version = installed_vllm_version()
    manifest = {"vllm": version, "generated_by": "tests/reliability (live pins)", "patches": entries,
                "not_applicable": [{"patch": spare, "reason": "moved here so the section exists in the base"}]}
    declared: dict[str, set[int]] = {}  # every version of every patch the set declares (for any release)
    for key in ps.patches:
        pid, _, v = key.rpartition("@")
        declared.setdefault(pid, set()).add(int(v))
    corpus = Corpus(texts, docs, file_of, manifest, f"vllm-{version}.yaml", pinned[spare], declared)
    # the base itself loads: every rejection below is the mutation's doing
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"patchkit-corpus-{os.getpid()}"
    (tmp / "m").mkdir(parents=True, exist_ok=True)
    (tmp / "m" / corpus.manifest_name).write_bytes(dump(manifest))
    try:
        load_manifests([tmp / "m"], ps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return corpus


class Places:
    """Every upstream place the shipped set touches, and the object each held at the start."""

    def __init__(self, ps: PatchSet):
        self.specs = sorted({s for p in ps.patches.values() for s in pinned_specs(p)})
        self.before = {s: self._raw(s) for s in self.specs}
        self.env = {k: os.environ.get(k) for k in WATCHED_ENV}

    @staticmethod
    def _raw(spec: str):
        try:
            return resolve(spec, import_module=False).get_raw()
        except TargetError:
            return None

    def changed(self) -> list[str]:
        out = [s for s in self.specs if self._raw(s) is not self.before[s]]
        out += [f"env {k}" for k, v in self.env.items() if os.environ.get(k) != v]
        return out


def run_case(case: Case, folder: Path, shipped: PatchSet, places: Places) -> tuple[list[str], Optional[BaseException]]:
    """Problems with how `case` was handled (empty: rejected properly, nothing applied)."""
    pdir, mdir, sdir = folder / "patches", folder / "manifests", folder / "status"
    for d, files in ((pdir, case.patch_files), (mdir, case.manifest_files)):
        d.mkdir(parents=True)
        for name, data in files.items():
            (d / name).write_bytes(data)
    for source in installed_sources():  # the features the shipped patches name (features/<id>.yaml)
        if case.patch_files and (Path(source.patches) / FEATURES).is_dir():
            shutil.copytree(Path(source.patches) / FEATURES, pdir / FEATURES, dirs_exist_ok=True)
    written = {str(pdir / n) for n in case.patch_files} | {str(mdir / n) for n in case.manifest_files}
    problems: list[str] = []
    loaders: list[Loader] = []
    exc: Optional[BaseException] = None
    try:
        ps = load_patch_set([pdir]) if case.patch_files else shipped
        ms = load_manifests([mdir], ps)
        for role in ROLES:
            loaders.append(Loader(ps, ms, role=role, status_dir=sdir))
            loaders[-1].run_import_stage()
    except (PatchSetErrors, DeclarationError) as e:
        exc = e
    except Exception as e:  # anything else is a failure of the property
        exc = e
        problems.append(f"raised {type(e).__name__} (not DeclarationError/PatchSetErrors): {e}")
    finally:
        for loader in loaders:
            loader.unpatch()
    if exc is None:
        problems.append("accepted: no error at all")
    elif not problems:
        problems += _check_errors(case, exc, written)
    changed = places.changed()
    if changed:
        problems.append(f"vLLM changed although the case was rejected: {changed}")
    records = list(sdir.rglob("*.json")) if sdir.exists() else []
    applied = [str(r) for r in records if f'"state": "{APPLIED}"' in r.read_text()]
    if applied:
        problems.append(f"records say applied: {applied}")
    return problems, exc


def _check_errors(case: Case, exc: BaseException, written: set[str]) -> list[str]:
    problems = []
    errors = exc.errors if isinstance(exc, PatchSetErrors) else [exc]
    if not errors:
        problems.append("PatchSetErrors with no errors in it")
    text = str(exc)
    for e in errors:
        if not isinstance(e, DeclarationError):
            problems.append(f"not a DeclarationError inside PatchSetErrors: {e!r}")
            continue
        if e.file not in written:
            problems.append(f"error names {e.file!r}, not one of the case's files")
        if not e.field or not e.problem:
            problems.append(f"error without field or problem: {e!r}")
        if f"{e.file}: {e.field}: " not in text:
            problems.append(f"the message does not name file and field: {text!r}")
    want = [e for e in errors if isinstance(e, DeclarationError)
            and (case.expect_file is None or os.path.basename(e.file) == case.expect_file)
            and (case.expect_field is None or field_matches(e.field, case.expect_field))
            and (case.expect_words is None or case.expect_words in e.problem)]
    if not want:
        problems.append(f"no error names file {case.expect_file!r} and field {case.expect_field!r}"
                        f"{f' saying {case.expect_words!r}' if case.expect_words else ''}; got: "
                        + "; ".join(f"{os.path.basename(e.file)}: {e.field}: {e.problem}" for e in errors
                                    if isinstance(e, DeclarationError)))
    return problems

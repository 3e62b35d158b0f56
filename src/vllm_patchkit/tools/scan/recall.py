"""Recall of the scan against the corpus (`tests/corpus/<plugin>/catalogue.yaml`, format in its README):
the share of catalogued places the scan reports. A place is found when a site is in the same file within
±3 lines of its `where`, or names the same target (for a catalogued class: a site on one of its members; for a
catalogued registry table: a registration that stores into it, `Site.writes`).

Plugin sources: a registry plugin is downloaded once with `pip download --no-deps NAME==VERSION` into the plugin
cache (`$VLLM_PATCHKIT_PLUGIN_CACHE`, default ~/.cache/vllm-patchkit/plugins); a GitHub source (ATOM) is read
from the folder named by `$PATCHKIT_ATOM_SRC` (the repository's checkout, or its `atom/plugin/vllm` parent).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from vllm_patchkit.tools.scan.model import ScanResult, Site

LINES = 3
CACHE_ENV = "VLLM_PATCHKIT_PLUGIN_CACHE"
ATOM_ENV = "PATCHKIT_ATOM_SRC"


def plugin_cache() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-patchkit" / "plugins"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def cached_archive(name: str, version: str, cache: Optional[Path] = None) -> Optional[Path]:
    folder = cache or plugin_cache()
    if not folder.is_dir():
        return None
    want = f"{_norm(name)}-{version}"
    for p in sorted(folder.iterdir()):
        stem = _norm(p.name.split("-")[0]) + "-" + (p.name.split("-")[1] if "-" in p.name else "")
        if stem.removesuffix(".tar.gz") == want or p.name.lower().startswith(want):
            return p
    return None


def fetch(name: str, version: str, cache: Optional[Path] = None) -> tuple[Optional[Path], str]:
    """The plugin's archive from the cache, else one `pip download --no-deps` into it: (path, why not)."""
    folder = cache or plugin_cache()
    hit = cached_archive(name, version, folder)
    if hit is not None:
        return hit, ""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{name}=={version}",
                               "-d", str(folder)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"pip download {name}=={version} failed: {exc}"
    hit = cached_archive(name, version, folder)
    if hit is None:
        return None, f"pip download {name}=={version} failed: {(proc.stderr or proc.stdout).strip()[-300:]}"
    return hit, ""


@dataclass
class Place:
    id: str
    target: Optional[str]
    file: str
    line: int
    mechanism: str


@dataclass
class Recall:
    plugin: str
    places: list[Place]
    found: list[tuple[Place, Site]] = field(default_factory=list)
    missed: list[Place] = field(default_factory=list)
    skipped: Optional[str] = None

    @property
    def recall(self) -> float:
        return len(self.found) / len(self.places) if self.places else 1.0


def read_catalogue(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}


def places_of(cat: dict) -> list[Place]:
    out = []
    for p in cat.get("places") or []:
        where = str(p.get("where") or "")
        file, _, line = where.rpartition(":")
        if not line.isdigit():
            file, line = where, "0"
        out.append(Place(str(p.get("id")), p.get("target"), file, int(line), str(p.get("mechanism"))))
    return out


def _same_file(a: str, b: str) -> bool:
    a, b = a.strip("/"), b.strip("/")
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def matches(place: Place, site: Site) -> bool:
    if place.file and site.file and _same_file(place.file, site.file) and abs(site.line - place.line) <= LINES:
        return True
    if place.target:
        for t in (site.target, site.defined_at, *site.writes):
            if t and (t == place.target or t.startswith(place.target + ".")):
                return True
    return False


def recall_of(plugin: str, places: list[Place], result: ScanResult) -> Recall:
    r = Recall(plugin, places)
    for place in places:
        hit = next((s for s in result.sites if matches(place, s)), None)
        if hit is None:
            r.missed.append(place)
        else:
            r.found.append((place, hit))
    return r


def source_of(cat: dict, cache: Optional[Path] = None) -> tuple[Optional[Path], str]:
    """Where the catalogued plugin's source is, or why it cannot be had."""
    src = str(cat.get("source") or "")
    if src.startswith("pypi:"):
        spec = src.split(":", 1)[1].strip()
        name, _, version = spec.partition("==")
        return fetch(name.strip(), version.strip(), cache)
    if src.startswith("github:"):
        env = os.environ.get(ATOM_ENV)
        if "ATOM" in src and env and Path(env).is_dir():
            return Path(env), ""
        return None, (f"{src}: a GitHub source; set ${ATOM_ENV} to a checkout of it" if "ATOM" in src
                      else f"{src}: no way to fetch a GitHub source here")
    return None, f"unknown source {src!r}"


def corpus_recall(corpus: Path, vllm_source: Optional[str] = None, cache: Optional[Path] = None) -> list[Recall]:
    """Recall per catalogue of the corpus folder (a plugin whose source cannot be had: `skipped` says why)."""
    from vllm_patchkit.tools.scan.scanner import scan
    from vllm_patchkit.tools.scan.upstream import Upstream

    up = Upstream.open(vllm_source)
    out = []
    for cat_path in sorted(Path(corpus).glob("*/catalogue.yaml")):
        cat = read_catalogue(cat_path)
        plugin = str(cat.get("plugin") or cat_path.parent.name)
        places = places_of(cat)
        path, why = source_of(cat, cache)
        if path is None:
            out.append(Recall(plugin, places, skipped=why))
            continue
        result = scan(str(path), upstream=up)
        out.append(recall_of(plugin, places, result))
    return out


def render(recalls: list[Recall]) -> str:
    lines = [f"{'plugin':32} {'places':>6} {'found':>6} {'recall':>7}"]
    for r in recalls:
        if r.skipped:
            lines.append(f"{r.plugin:32} {len(r.places):>6} {'-':>6} {'skipped':>7}  ({r.skipped})")
            continue
        lines.append(f"{r.plugin:32} {len(r.places):>6} {len(r.found):>6} {r.recall:>7.2f}")
        for p in r.missed:
            lines.append(f"    missed {p.id}: {p.mechanism} {p.target} at {p.file}:{p.line}")
    return "\n".join(lines)


__all__ = ["Recall", "corpus_recall", "fetch", "matches", "places_of", "plugin_cache", "recall_of", "render"]

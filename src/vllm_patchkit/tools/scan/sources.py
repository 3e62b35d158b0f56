"""The plugin's Python files, read in place: a folder, one .py file, a wheel, an sdist, or an installed
distribution (found through importlib.metadata, never imported).

Nothing here parses Python. A file that cannot be read is a `SourceError` finding, not an exception.
"""

from __future__ import annotations

import tarfile
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Optional

TEST_PARTS = {"tests", "test", "testing"}


@dataclass(frozen=True)
class PluginFile:
    """One Python file of the plugin: its path inside the distribution (POSIX) and its bytes."""

    path: str
    data: bytes

    @property
    def module(self) -> str:
        """`pkg/sub/mod.py` -> `pkg.sub.mod` (a leading `src/` dropped; `__init__` is the package)."""
        parts = list(PurePosixPath(self.path).with_suffix("").parts)
        if parts and parts[0] == "src":
            parts = parts[1:]
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)


@dataclass
class PluginSource:
    """What was read: a label, the files, and what could not be read (path, error)."""

    label: str
    files: list[PluginFile] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    skipped_tests: int = 0

    @property
    def top_packages(self) -> set[str]:
        return {f.module.split(".")[0] for f in self.files if f.module}


def _is_test(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return any(p in TEST_PARTS for p in parts[:-1]) or parts[-1].startswith("test_") or parts[-1] == "conftest.py"


def _add(src: PluginSource, path: str, read, include_tests: bool) -> None:
    if not path.endswith(".py"):
        return
    if not include_tests and _is_test(path):
        src.skipped_tests += 1
        return
    try:
        src.files.append(PluginFile(path, read()))
    except Exception as exc:  # a member that cannot be read is a finding
        src.errors.append((path, f"cannot read: {type(exc).__name__}: {exc}"))


def _from_dir(root: Path, include_tests: bool) -> PluginSource:
    src = PluginSource(str(root))
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if any(part.startswith(".") or part in ("site-packages", "__pycache__") for part in PurePosixPath(rel).parts):
            continue
        _add(src, rel, p.read_bytes, include_tests)
    return src


def _from_wheel(path: Path, include_tests: bool) -> PluginSource:
    src = PluginSource(str(path))
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            _add(src, info.filename, lambda i=info: zf.read(i), include_tests)
    return src


def _strip_top(name: str) -> str:
    """`pkg-1.0/src/pkg/x.py` -> `src/pkg/x.py`: an sdist's members sit under one top folder."""
    parts = PurePosixPath(name).parts
    return PurePosixPath(*parts[1:]).as_posix() if len(parts) > 1 else name


def _from_sdist(path: Path, include_tests: bool) -> PluginSource:
    src = PluginSource(str(path))
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            rel = _strip_top(m.name)
            f = tf.extractfile(m)
            if f is None:
                continue
            _add(src, rel, f.read, include_tests)
    return src


def _from_dist(name: str, include_tests: bool) -> PluginSource:
    dist = metadata.distribution(name)
    src = PluginSource(f"installed distribution {dist.metadata['Name']} {dist.version}")
    for f in dist.files or []:
        rel = PurePosixPath(str(f)).as_posix()
        if rel.startswith("..") or ".dist-info/" in rel or ".egg-info/" in rel:
            continue
        _add(src, rel, lambda f=f: Path(dist.locate_file(f)).read_bytes(), include_tests)
    finders = [f for f in src.files if PurePosixPath(f.path).name.startswith("__editable__")]
    if finders:  # a setuptools editable install: its finder maps each package to the source folder
        src.files = [f for f in src.files if f not in finders]
        for finder in finders:
            for package, folder in _editable_mapping(finder.data).items():
                more = _from_dir(Path(folder), include_tests)
                src.files += [PluginFile(f"{package.replace('.', '/')}/{f.path}", f.data) for f in more.files]
                src.errors += more.errors
                src.skipped_tests += more.skipped_tests
    if not src.files:  # an editable install lists only a .pth: follow it to the source folder
        for f in dist.files or []:
            if str(f).endswith(".pth"):
                try:
                    for line in Path(dist.locate_file(f)).read_text().splitlines():
                        folder = Path(line.strip())
                        if line.strip() and not line.startswith(("#", "import")) and folder.is_dir():
                            more = _from_dir(folder, include_tests)
                            src.files += more.files
                            src.errors += more.errors
                except OSError as exc:
                    src.errors.append((str(f), f"cannot read: {exc}"))
    return src


def _editable_mapping(data: bytes) -> dict[str, str]:
    import ast

    try:
        for node in ast.parse(data).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            if any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in targets):
                value = ast.literal_eval(node.value)
                return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    except (SyntaxError, ValueError, TypeError, RecursionError):
        pass
    return {}


def open_plugin(spec: str, include_tests: bool = False) -> PluginSource:
    """PATH (folder, .py, .whl, .tar.gz / .tgz / .zip sdist) or an installed distribution's name.

    Never raises: what cannot be opened is returned as a source with one error."""
    p = Path(spec)
    try:
        if p.is_dir():
            return _from_dir(p, include_tests)
        if p.is_file():
            name = p.name.lower()
            if name.endswith(".py"):
                src = PluginSource(str(p))
                try:
                    src.files.append(PluginFile(p.name, p.read_bytes()))
                except OSError as exc:
                    src.errors.append((p.name, f"cannot read: {exc}"))
                return src
            if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
                return _from_sdist(p, include_tests)
            if zipfile.is_zipfile(p):  # a wheel, or a zip sdist
                return _from_wheel(p, include_tests)
            return PluginSource(str(p), errors=[(str(p), "not a folder, .py file, wheel or sdist")])
        try:
            return _from_dist(spec, include_tests)
        except metadata.PackageNotFoundError:
            return PluginSource(spec, errors=[(spec, "no such file or folder, and no installed distribution of that name")])
    except Exception as exc:  # a corrupt archive: a finding, never a crash
        return PluginSource(spec, errors=[(spec, f"cannot open: {type(exc).__name__}: {exc}")])


def dist_metadata(spec: str) -> Optional[dict]:
    """Name, version, Requires-Dist and vLLM entry points of a wheel or installed distribution (for reports)."""
    try:
        p = Path(spec)
        if p.is_file() and zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
                eps = next((n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
                text = zf.read(meta).decode("utf-8", "replace") if meta else ""
                ep_text = zf.read(eps).decode("utf-8", "replace") if eps else ""
        elif not p.exists():
            dist = metadata.distribution(spec)
            text = dist.read_text("METADATA") or ""
            ep_text = dist.read_text("entry_points.txt") or ""
        else:
            return None
    except Exception:
        return None
    import email.parser

    msg = email.parser.Parser().parsestr(text)
    groups, group = {}, None
    for line in ep_text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1]
        elif "=" in line and group:
            groups.setdefault(group, []).append(line.split("=", 1)[0].strip())
    return {"name": msg.get("Name"), "version": msg.get("Version"),
            "requires": msg.get_all("Requires-Dist") or [], "entry_points": groups}


__all__ = ["PluginFile", "PluginSource", "dist_metadata", "open_plugin"]

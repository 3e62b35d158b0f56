"""Static, source access: the files of a release, from a wheel read in place or from a folder.

Nothing here parses Python: `static_tables.py` does, `static.py` resolves names.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Optional, Union


class Source:
    """Files of a release: relative POSIX paths under the root that holds the top-level packages."""

    label: str

    def read(self, rel: str) -> Optional[bytes]:
        raise NotImplementedError

    def python_files(self, top: str) -> list[str]:
        raise NotImplementedError

    def root(self) -> Any:
        """A pathlib-like root (`/`, `.read_text()`, `.is_file()`) handed to retirement probes."""
        raise NotImplementedError

    def version_hint(self) -> Optional[str]:
        return None


class DirSource(Source):
    """An unpacked source tree or an installed site-packages folder."""

    def __init__(self, root: Path):
        self._root = Path(root)
        self.label = str(self._root)

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return (self._root / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def python_files(self, top: str) -> list[str]:
        base = self._root / top
        return sorted(p.relative_to(self._root).as_posix() for p in base.rglob("*.py")) if base.is_dir() else []

    def root(self) -> Path:
        return self._root


class WheelSource(Source):
    """A wheel (or any zip) read in place: members are decompressed one at a time, on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.label = str(self.path)
        self._zip = zipfile.ZipFile(self.path)
        self._names = set(self._zip.namelist())

    def read(self, rel: str) -> Optional[bytes]:
        return self._zip.read(rel) if rel in self._names else None

    def python_files(self, top: str) -> list[str]:
        prefix = top.rstrip("/") + "/"
        return sorted(n for n in self._names if n.startswith(prefix) and n.endswith(".py"))

    def root(self) -> zipfile.Path:
        return zipfile.Path(self._zip)

    def version_hint(self) -> Optional[str]:
        parts = self.path.name.split("-")
        return parts[1] if self.path.suffix == ".whl" and len(parts) > 2 else None

    def close(self) -> None:
        self._zip.close()


def open_source(path: Union[str, Path]) -> Source:
    """A wheel/zip file or a directory (the folder that holds `vllm/`, or `vllm/` itself)."""
    p = Path(path)
    if p.is_file():
        if not zipfile.is_zipfile(p):
            raise ValueError(f"{p}: not a wheel or zip file")
        return WheelSource(p)
    if p.is_dir():
        if (p / "__init__.py").is_file() and not (p / p.name / "__init__.py").is_file():
            return DirSource(p.parent)  # given the package folder itself
        return DirSource(p)
    raise FileNotFoundError(f"{p}: no such wheel or source folder")


def module_name(rel: str) -> str:
    """`vllm/v1/core/__init__.py` -> `vllm.v1.core`; `vllm/envs.py` -> `vllm.envs`."""
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


__all__ = ["DirSource", "Source", "WheelSource", "module_name", "open_source"]


def declared_version(source: Source, package: str = "vllm") -> Optional[str]:
    """`__version__` as `<package>/_version.py` (or `version.py`) assigns it, read without importing it."""
    import ast

    for rel in (f"{package}/_version.py", f"{package}/version.py"):
        raw = source.read(rel)
        if raw is None:
            continue
        for node in ast.parse(raw).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    return node.value.value
    return None


"""Runtime dependencies are what the runtime imports (issue 12): no more, no less.

Every module under src/vllm_patchkit/ (and the shipped patch set's patches/ and adapters/) is read
with `ast`; each absolute import outside the stdlib and this project must be a declared dependency
(vLLM and torch come with vLLM, through the `cpu`/`cuda` extras), and every declared dependency must be
imported somewhere. pytest belongs to the pytest plugin alone (pytest loads it), so it is a test extra.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = [ROOT / "src" / "vllm_patchkit", ROOT / "patches", ROOT / "adapters"]
WITH_VLLM = {"vllm", "torch", "transformers", "tokenizers", "numpy", "fastapi", "prometheus_client", "starlette",
             "safetensors"}  # installed with vLLM (its own requirements)
PYTEST_ONLY = {ROOT / "src" / "vllm_patchkit" / "tools" / "pytest_plugin.py"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _runtime_imports() -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for folder in RUNTIME:
        for path in folder.rglob("*.py"):
            if path in PYTEST_ONLY:
                continue
            for name in _imports(path):
                if name in sys.stdlib_module_names or name == "vllm_patchkit" or name.startswith("patchkit_"):
                    continue
                found.setdefault(name, set()).add(path.relative_to(ROOT))
    return found


def _declared() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(r).name.lower() for r in meta["dependencies"]}


def test_every_runtime_import_is_declared_or_comes_with_vllm():
    dists = packages_distributions()
    declared = _declared()
    undeclared = {}
    for name, where in _runtime_imports().items():
        if name in WITH_VLLM:
            continue
        owners = {d.lower() for d in dists.get(name, [name])}
        if not owners & declared:
            undeclared[name] = sorted(map(str, where))
    assert not undeclared, f"imported by the runtime but not a dependency: {undeclared}"


def test_every_declared_dependency_is_imported_by_the_runtime():
    dists = packages_distributions()
    imported_dists = {d.lower() for name in _runtime_imports() for d in dists.get(name, [name])}
    assert _declared() <= imported_dists, f"declared but never imported: {_declared() - imported_dists}"


def test_pytest_is_only_a_test_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "pytest" not in _declared()
    assert any(Requirement(r).name == "pytest" for r in meta["optional-dependencies"]["test"])
    assert "pytest" not in _runtime_imports()

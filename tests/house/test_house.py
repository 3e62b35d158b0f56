"""The house's rules, read from the source: layers import downward only, no circles (a function-local import
counts: it cannot hide one), no patch set reached by import, every import absolute, no module over 400 lines."""

from __future__ import annotations

from tests.house.imports import LAYERS, arrows, cycles, into_patch_sets, layer, modules, relative_imports, upward

MAX_LINES = 400


def test_every_module_lives_in_a_layer():
    outside = sorted(m for m in modules() if layer(m) is None and m != "vllm_patchkit")
    assert outside == [], f"framework modules outside the layers {LAYERS}: {outside}"


def test_no_import_circles():
    found = cycles(arrows())
    assert found == [], "import circles (function-local imports included): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_upward_imports():
    found = upward(arrows())
    assert found == [], "imports of a higher layer (order: " + " < ".join(LAYERS) + "):\n" + "\n".join(map(str, found))


def test_the_framework_never_imports_a_patch_set():
    found = into_patch_sets(arrows())
    assert found == [], "a patch set is loaded through its entry point only:\n" + "\n".join(map(str, found))


def test_imports_are_absolute():
    assert relative_imports() == []


def test_no_module_over_400_lines():
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    big = sorted((n, m) for m, n in sizes.items() if n > MAX_LINES)
    assert big == [], f"modules over {MAX_LINES} lines: " + ", ".join(f"{m} ({n})" for n, m in big)


def test_the_rules_bite(tmp_path, monkeypatch):
    """The graph reader sees a function-local upward import and the circle it closes (not a test of luck)."""
    import tests.house.imports as imports

    pkg = tmp_path / "vllm_patchkit"
    for name, body in {"runtime/a.py": "def f():\n    from vllm_patchkit.tools import b\n",
                       "tools/b.py": "from vllm_patchkit.runtime import a\n",
                       "runtime/__init__.py": "", "tools/__init__.py": ""}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    monkeypatch.setattr(imports, "SRC", tmp_path)
    edges = imports.arrows()
    assert [str(a) for a in imports.upward(edges)] == [
        "vllm_patchkit.runtime.a -> vllm_patchkit.tools.b (line 2, inside a function)"]
    assert imports.cycles(edges) == [["vllm_patchkit.runtime.a", "vllm_patchkit.tools.b"]]


def test_architecture_names_every_module():
    """docs/architecture.md lists every module with its purpose (generated from the docstrings): current, and
    no module without a docstring saying why it exists."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "architecture_modules.py"
    spec = importlib.util.spec_from_file_location("architecture_modules", script)
    arch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arch)
    assert "(no docstring)" not in arch.render()
    text = arch.DOC.read_text()
    assert arch.current(text) == text, "docs/architecture.md's module list is not current: python scripts/architecture_modules.py"


def test_every_framework_package_is_installed():
    """pyproject lists its packages by name: a new folder (a layer, `runtime/kinds`) left out of the list is missing
    from a real (non-editable) install while every editable test passes. Regression: `runtime.kinds` was left out."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    package = root / "src" / "vllm_patchkit"
    folders = {".".join(("vllm_patchkit", *p.parent.relative_to(package).parts)) for p in package.rglob("__init__.py")}
    assert folders - listed == set()

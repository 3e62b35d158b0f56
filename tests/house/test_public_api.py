"""The public API (`vllm_patchkit`, src/vllm_patchkit/__init__.py) is the only face a patch set sees: this
repository's set (patches/, adapters/), the third party's test set (tests/plugins/otherset) and the example of
docs/writing-a-patch.md import nothing else of the framework, and importing it costs a process nothing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import vllm_patchkit

ROOT = Path(__file__).resolve().parents[2]
#: what a set's code and tests may import: the package itself, nothing under it
SET_FOLDERS = ("patches", "adapters", "tests/plugins/otherset")
DOC = ROOT / "docs" / "writing-a-patch.md"


def framework_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every import of the framework other than its public names (function-local ones too)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "vllm_patchkit":
                out += [(node.lineno, f"vllm_patchkit.{a.name}") for a in node.names if a.name not in vllm_patchkit.__all__]
            elif node.module.startswith("vllm_patchkit."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("vllm_patchkit.")]
    return out


def test_the_shipped_set_and_otherset_import_only_the_public_api():
    files = [p for folder in SET_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 20  # the folders were read, not missed
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files
             for line, what in framework_imports(ast.parse(p.read_text()))]
    assert found == [], "import from vllm_patchkit's public names only (src/vllm_patchkit/__init__.py):\n" + "\n".join(found)


def test_the_doc_example_imports_only_the_public_api():
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)]
    assert any("from vllm_patchkit import" in b for b in blocks)
    found = [what for b in blocks for _, what in framework_imports(ast.parse(b))]
    assert found == []


def test_the_scan_bites():
    """Internal paths are caught at the top, inside a function and as an unknown public name."""
    tree = ast.parse("from vllm_patchkit.runtime.context import PatchContext\n"
                     "def f():\n    import vllm_patchkit.runtime.state\n"
                     "from vllm_patchkit import PatchContext, Loader\n")
    assert sorted(framework_imports(tree)) == [
        (1, "vllm_patchkit.runtime.context"), (3, "vllm_patchkit.runtime.state"), (4, "vllm_patchkit.Loader")]


def test_every_public_name_is_the_internal_object():
    from vllm_patchkit.declaration.errors import Refusal
    from vllm_patchkit.runtime.context import PatchContext
    from vllm_patchkit.tools.testing import run_lifecycle

    for name in vllm_patchkit.__all__:
        assert getattr(vllm_patchkit, name) is not None, name
    assert (vllm_patchkit.PatchContext, vllm_patchkit.Refusal, vllm_patchkit.run_lifecycle) == (
        PatchContext, Refusal, run_lifecycle)
    assert set(vllm_patchkit.__all__) <= set(dir(vllm_patchkit))
    try:
        vllm_patchkit.Loader
    except AttributeError as exc:
        assert "'Loader'" in str(exc)
    else:
        raise AssertionError("an internal name is not public")


def test_importing_the_api_imports_nothing_else():
    """vLLM's entry point imports the package in every process: a name is imported on first use only."""
    code = ("import sys; before = set(sys.modules); import vllm_patchkit; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    new = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in new if m.startswith("vllm_patchkit")] == ["vllm_patchkit"]
    assert {m for m in new if m.split(".")[0] not in sys.stdlib_module_names} == {"vllm_patchkit"}  # typing at most

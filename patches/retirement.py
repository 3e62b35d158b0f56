"""Retirement probes: read a release's source (never import it) and say whether upstream fixed the problem.

`check` calls each `retire_when.probe` with the folder holding `vllm/` (a
`pathlib.Path`, or a `zipfile.Path` inside a wheel). A probe returns a reason
(the fix it found) or None. They read the code that decides, not a version
number, so a backport is seen too; a probe that cannot find the code it reads
raises, and `check` reports that as a finding rather than "not retirable".
"""

from __future__ import annotations

import ast
from typing import Any, Optional

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
CONFIG = "vllm/config/vllm.py"
BREAKABLE = "VLLM_USE_BREAKABLE_CUDAGRAPH"


def _tree(root: Any, rel: str) -> ast.Module:
    path = root
    for part in rel.split("/"):
        path = path / part
    return ast.parse(path.read_text(encoding="utf-8"), filename=rel)


def _function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    raise LookupError(f"{cls}.{name} not found: the probe must be updated for this release")


def _names(node: ast.AST) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id
            for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}


def uniform_decode_checks_prompts(root: Any) -> Optional[str]:
    """batch-dispatch-override: upstream's uniform-decode test looks at prompt progress, not shape alone."""
    fn = _function(_tree(root, RUNNER), "GPUModelRunner", "_is_uniform_decode")
    seen = _names(fn) & {"num_prompt_tokens", "num_computed_tokens", "is_prefilling", "num_prefills"}
    if seen:
        return f"GPUModelRunner._is_uniform_decode now reads {', '.join(sorted(seen))}"
    return None


def breakable_cudagraph_not_auto_enabled(root: Any) -> Optional[str]:
    """breakable-cudagraph-opt-out: VllmConfig no longer sets VLLM_USE_BREAKABLE_CUDAGRAPH by itself."""
    tree = _tree(root, CONFIG)
    _function(tree, "VllmConfig", "__post_init__")  # the file is the config module we expect
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and target.slice.value == BREAKABLE):
                    return None
    return f"vllm/config/vllm.py never assigns os.environ[{BREAKABLE!r}]: vLLM no longer auto-enables it"

"""Retirement probes: read a release's source (never import it) and say whether upstream fixed the problem.

`check` calls each `retire_when.probe` with the folder holding `vllm/` (a
`pathlib.Path`, or a `zipfile.Path` inside a wheel). A probe returns a
`ProbeAnswer` (retirable or not, with the release's file:line that decides), or
the older form: a reason (the fix it found) or None. They read the code that
decides, not a version number, so a backport is seen too; "retirable" rests on
positive evidence of the fix, never on the old code's absence; a probe that
cannot find the code it reads raises, and `check` reports that as a finding
rather than "not retirable" or "retirable".
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from vllm_patchkit import ProbeAnswer

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


#: the architectures breakable-cudagraph-opt-out is declared for (its `when.architectures`)
PLUGIN_ARCHS = ("DeepseekV4ForCausalLM", "DeepSeekV4MTPModel")


def _top_level(tree: ast.Module) -> dict[str, ast.AST]:
    """The module's top-level names: assignments and functions, by name."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node
        elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
    return out


def _reached_sets(tree: ast.Module, start: ast.AST) -> dict[str, ast.AST]:
    """The module-level assignments `start` reads, directly or through the module's functions it calls."""
    defs, seen, sets, todo = _top_level(tree), set(), {}, [start]
    while todo:
        for name in _names(todo.pop()):
            node = defs.get(name)
            if node is None or name in seen:
                continue
            seen.add(name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                todo.append(node)
            else:
                sets[name] = node
                todo.append(node)
    return sets


def breakable_cudagraph_not_auto_enabled(root: Any) -> ProbeAnswer:
    """breakable-cudagraph-opt-out: retirable only on positive evidence — the architecture sets vLLM's
    auto-enable decision reads are found, and none lists the plugin's architectures. (0.34.0 no longer writes
    `os.environ`, it keeps the decision in `compilation_config.use_breakable_cudagraph`: the absence of the old
    write is no evidence.)"""
    tree = _tree(root, CONFIG)
    decide = _function(tree, "VllmConfig", "_maybe_enable_breakable_cudagraph")
    if "_uses_breakable_cudagraph_by_default" not in _names(decide):
        raise LookupError("VllmConfig._maybe_enable_breakable_cudagraph no longer calls "
                          "_uses_breakable_cudagraph_by_default: the probe must be updated for this release")
    by_default = _function(tree, "VllmConfig", "_uses_breakable_cudagraph_by_default")
    sets = {name: node for name, node in _reached_sets(tree, by_default).items()
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in ast.walk(node))}
    if not sets:
        raise LookupError("VllmConfig._uses_breakable_cudagraph_by_default reads no architecture set of "
                          f"{CONFIG}: the probe must be updated for this release")
    for name, node in sets.items():
        for const in ast.walk(node):
            if isinstance(const, ast.Constant) and const.value in PLUGIN_ARCHS:
                return ProbeAnswer(False, f"{CONFIG}:{const.lineno}: {name} lists {const.value!r}, which "
                                   f"VllmConfig._maybe_enable_breakable_cudagraph ({CONFIG}:{decide.lineno}) "
                                   "auto-enables breakable CUDA graphs for")
    return ProbeAnswer(True, f"{CONFIG}: the architecture sets VllmConfig._uses_breakable_cudagraph_by_default "
                       f"reads ({', '.join(sorted(sets))}) list none of {', '.join(PLUGIN_ARCHS)}: vLLM no longer "
                       "auto-enables breakable CUDA graphs for them")


V2_RUNNER = "vllm/v1/worker/gpu/model_runner.py"


def v2_prefill_never_decode_graph(root: Any) -> ProbeAnswer:
    """batch-dispatch-override-v2: retirable only when every assignment of `decode_graph_eligible` in the V2
    runner's `gather_batch_req_state` is `not has_prefill` (a prefilling row never eligible); any other
    assignment (the one-token-tail exception) keeps the patch, named by its line."""
    fn = _function(_tree(root, V2_RUNNER), "GPUModelRunner", "gather_batch_req_state")
    assigns = [node for node in ast.walk(fn) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "decode_graph_eligible" for t in node.targets)]
    if not assigns:
        raise LookupError("GPUModelRunner.gather_batch_req_state assigns no decode_graph_eligible: the probe must "
                          "be updated for this release")
    for node in assigns:
        value = node.value
        if not (isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)
                and isinstance(value.operand, ast.Name) and value.operand.id == "has_prefill"):
            return ProbeAnswer(False, f"{V2_RUNNER}:{node.lineno}: decode_graph_eligible = "
                               f"{ast.unparse(value)} can make a step with a prefilling row eligible for the FULL "
                               "decode graph")
    return ProbeAnswer(True, f"{V2_RUNNER}:{assigns[0].lineno}: gather_batch_req_state makes a step decode-graph "
                       "eligible only without prefilling rows (decode_graph_eligible = not has_prefill)")

"""Batch-dispatch override: a still-prefilling row never makes a step "uniform decode".

Wraps `GPUModelRunner._determine_batch_execution_and_padding` (see the YAML for
why). Arguments are forwarded verbatim; the only change is
`force_uniform_decode=False`, passed as vLLM's own parameter (by keyword, or in
its positional slot if a caller ever passes it positionally as None).

Which runners: decided once per runner instance (the answer is kept on the
runner) from the architectures of its model config, which must be among the
YAML's `when.architectures`, and the class serving it, which must satisfy the
YAML's `when.served_by`: the loaded model's class once the model is loaded,
else the class vLLM's registry resolves the architecture to.

Counts: every real step of a plugin runner is counted straight into this
patch's record (`detail`), which the loader writes at every flush, so
`vllm-patchkit status` shows them. Cost per step: one dict lookup for the
runner's decision, one numpy comparison over the rows, a few int increments.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Optional

from vllm_patchkit import runtime
from vllm_patchkit.declare import parse_patch
from vllm_patchkit.preconditions import _served_ok, served_by_module

log = logging.getLogger("vllm_patchkit")

PATCH = parse_patch(Path(__file__).with_suffix(".yaml"))
ARCHITECTURES = frozenset(PATCH.when.architectures or ())
SERVED_BY = PATCH.when.served_by
RUNNER_ATTR = "_vllm_patchkit_batch_dispatch"  # on each runner: its detail dict (plugin's) or None
PARAM = "force_uniform_decode"

# Counts of a runner whose process has no loader (the patch installed by hand): kept, never lost.
ORPHAN_DETAIL: dict = {}

_positions: Optional[dict[str, int]] = None


def _param_positions(original) -> dict[str, int]:
    """Positional index (self included) of each parameter of the upstream function."""
    global _positions
    if _positions is None:
        _positions = {name: i for i, name in enumerate(inspect.signature(original).parameters)}
    return _positions


def _served_module(runner: Any, arch: str) -> Optional[str]:
    model = runner.__dict__.get("model")
    if model is not None:
        try:
            model = runner.get_model()  # unwraps vLLM's cudagraph wrappers
        except Exception:
            pass
        return type(model).__module__
    return served_by_module(arch)


def plugin_model(runner: Any) -> tuple[bool, str]:
    """Is this runner's model the plugin's? (answer, one-line reason)."""
    archs = list(getattr(runner.model_config, "architectures", None) or [])
    matched = [a for a in archs if a in ARCHITECTURES]
    if not matched:
        return False, f"architectures {archs} not in {sorted(ARCHITECTURES)}"
    module = _served_module(runner, matched[0])
    if SERVED_BY is not None and not _served_ok(SERVED_BY, module):
        return False, f"{matched[0]} served by {module}, not {SERVED_BY}"
    return True, f"{matched[0]} served by {module}"


def _detail_for_this_process() -> dict:
    loader = runtime.current()
    rec = loader.records.get(PATCH.id) if loader is not None else None
    detail = rec.detail if rec is not None else ORPHAN_DETAIL
    for key in ("steps_seen", "steps_overridden", "steps_overridden_decode_shaped"):
        detail.setdefault(key, 0)
    detail.setdefault("cudagraph_modes", {})
    detail.setdefault("runners", [])
    return detail


def decide(runner: Any) -> Optional[dict]:
    """Decide once for this runner; keep the answer on it. Returns the dict to count into, or None."""
    ok, why = plugin_model(runner)
    detail = _detail_for_this_process()
    detail["runners"].append(f"{type(runner).__name__}: {'plugin' if ok else 'not plugin'} ({why})")
    sink = detail if ok else None
    runner.__dict__[RUNNER_ATTR] = sink
    log.info("vllm-patchkit: %s: %s %s the override (%s)", PATCH.key, type(runner).__name__,
             "gets" if ok else "does not get", why)
    return sink


def determine_batch_execution_and_padding(original, *args, **kwargs):
    """Wrap of GPUModelRunner._determine_batch_execution_and_padding(self, ...)."""
    runner = args[0]
    d = runner.__dict__
    sink = d[RUNNER_ATTR] if RUNNER_ATTR in d else decide(runner)
    if sink is None:
        return original(*args, **kwargs)
    pos = _positions or _param_positions(original)
    i = pos[PARAM]
    if (args[i] if len(args) > i else kwargs.get(PARAM)) is not None:
        return original(*args, **kwargs)  # capture / dummy run: the caller decided
    j = pos["num_reqs"]
    num_reqs = args[j] if len(args) > j else kwargs["num_reqs"]
    batch = runner.input_batch
    sink["steps_seen"] += 1
    if (batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]).any():
        sink["steps_overridden"] += 1
        if _decode_shaped(runner, pos, args, kwargs, num_reqs):
            sink["steps_overridden_decode_shaped"] += 1
        if len(args) > i:
            args = args[:i] + (False,) + args[i + 1:]
        else:
            kwargs[PARAM] = False
    result = original(*args, **kwargs)
    modes = sink["cudagraph_modes"]
    name = result[0].name
    modes[name] = modes.get(name, 0) + 1
    return result


def _decode_shaped(runner: Any, pos: dict[str, int], args: tuple, kwargs: dict, num_reqs: int) -> bool:
    """Would vLLM's own shape test have called this step uniform decode?"""

    def arg(name):
        k = pos[name]
        return args[k] if len(args) > k else kwargs[name]

    return bool(runner._is_uniform_decode(
        max_num_scheduled_tokens=arg("max_num_scheduled_tokens"),
        uniform_decode_query_len=runner.uniform_decode_query_len,
        num_tokens=arg("num_tokens"),
        num_reqs=num_reqs,
    ))

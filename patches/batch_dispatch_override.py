"""Batch-dispatch override: a still-prefilling row never makes a step "uniform decode".

Wraps `GPUModelRunner._determine_batch_execution_and_padding` (see the YAML for
why). Arguments are forwarded verbatim; the only change is
`force_uniform_decode=False`, passed as vLLM's own parameter (by keyword, or in
its positional slot if a caller ever passes it positionally as None).

Which runners: decided once per runner instance (the answer is kept on the
runner) by the patch's own YAML `when` (architectures, served_by) through
`ctx.holds_for`: the loaded model's class once the model is loaded, else the
class vLLM's registry resolves the architecture to.

Counts: every real step of a plugin runner is counted with `ctx.count` (one
dict add each); they reach this patch's record (`detail`) at every flush, so
`vllm-patchkit status` shows them. Cost per step: one dict lookup for the
runner's decision, a few declared-parameter reads, one numpy comparison over
the rows, a few counter adds.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from vllm_patchkit import PatchContext

log = logging.getLogger("vllm.patchkit")

RUNNER_ATTR = "_vllm_patchkit_batch_dispatch"  # on each runner: True (the plugin's model) or False
PARAM = "force_uniform_decode"
COUNTERS = ("steps_seen", "steps_overridden", "steps_overridden_decode_shaped")


def _served_module(runner: Any) -> Optional[str]:
    """The module of the loaded model's class; None before the model is loaded (the registry answers then)."""
    model = runner.__dict__.get("model")
    if model is None:
        return None
    try:
        model = runner.get_model()  # unwraps vLLM's cudagraph wrappers
    except Exception:
        pass
    return type(model).__module__


def plugin_model(runner: Any, ctx: PatchContext) -> tuple[bool, str]:
    """Is this runner's model the plugin's? (answer, one-line reason), by the YAML's `when`."""
    return ctx.holds_for(runner.model_config, _served_module(runner))


def decide(runner: Any, ctx: PatchContext) -> bool:
    """Decide once for this runner; keep the answer on it and a line in the record."""
    ok, why = plugin_model(runner, ctx)
    for name in COUNTERS:
        ctx.count(name, 0)  # present in the record from the first runner on
    line = f"{type(runner).__name__}: {'plugin' if ok else 'not plugin'} ({why})"
    ctx.note(flush=False, runners=[*ctx.notes.get("runners", ()), line])
    runner.__dict__[RUNNER_ATTR] = ok
    log.info("vllm-patchkit: %s: %s %s the override (%s)", ctx.patch.key, type(runner).__name__,
             "gets" if ok else "does not get", why)
    return ok


def determine_batch_execution_and_padding(wrapped, instance, args, kwargs, ctx):
    """Wrap of GPUModelRunner._determine_batch_execution_and_padding (instance: the runner)."""
    d = instance.__dict__
    if not (d[RUNNER_ATTR] if RUNNER_ATTR in d else decide(instance, ctx)):
        return wrapped(*args, **kwargs)
    if ctx.arg(args, kwargs, PARAM) is not None:
        return wrapped(*args, **kwargs)  # capture / dummy run: the caller decided
    num_reqs = ctx.arg(args, kwargs, "num_reqs")
    batch = instance.input_batch
    ctx.count("steps_seen")
    if (batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]).any():
        ctx.count("steps_overridden")
        if _decode_shaped(instance, ctx, args, kwargs, num_reqs):
            ctx.count("steps_overridden_decode_shaped")
        args, kwargs = ctx.with_arg(args, kwargs, PARAM, False)
    result = wrapped(*args, **kwargs)
    mode = result[0]
    ctx.count("cudagraph_modes." + getattr(mode, "name", str(mode)))
    return result


def _decode_shaped(runner: Any, ctx: PatchContext, args: tuple, kwargs: dict, num_reqs: int) -> bool:
    """Would vLLM's own shape test have called this step uniform decode?"""
    return bool(runner._is_uniform_decode(
        max_num_scheduled_tokens=ctx.arg(args, kwargs, "max_num_scheduled_tokens"),
        uniform_decode_query_len=runner.uniform_decode_query_len,
        num_tokens=ctx.arg(args, kwargs, "num_tokens"),
        num_reqs=num_reqs,
    ))

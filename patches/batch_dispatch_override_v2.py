"""Batch-dispatch override on the V2 runner: a still-prefilling row never makes a step decode-graph eligible.

Wraps `GPUModelRunner.gather_batch_req_state` of `vllm.v1.worker.gpu.model_runner` (see the YAML for why). The
call is forwarded verbatim; on a real step of the plugin's runner whose returned `BatchReqState` has a
prefilling row and `decode_graph_eligible=True` (vLLM's one-token-tail exception), the result is what vLLM
returns for any other prefill step: the state with `decode_graph_eligible=False`, and no uniform token count.

Which runners: decided once per runner, by the patch's own `when` (the V1 patch's `decide`, shared). Counts:
steps seen, steps overridden, and of those the ones vLLM would have replayed as a uniform (FULL) decode.
"""

from __future__ import annotations

from patchkit_deepseek_v4.batch_dispatch_override import RUNNER_ATTR, decide


def gather_batch_req_state(wrapped, instance, args, kwargs, ctx):
    """Wrap of the V2 GPUModelRunner.gather_batch_req_state (instance: the runner)."""
    d = instance.__dict__
    if not (d[RUNNER_ATTR] if RUNNER_ATTR in d else decide(instance, ctx)):
        return wrapped(*args, **kwargs)
    result = wrapped(*args, **kwargs)
    state, uniform_token_count = result
    if state is None:  # a dummy / capture run: uniform by construction, the caller decided
        return result
    ctx.count("steps_seen")
    if not (state.has_prefill and state.decode_graph_eligible):
        return result
    ctx.count("steps_overridden")
    if uniform_token_count is not None:
        ctx.count("steps_overridden_decode_shaped")
    return state._replace(decode_graph_eligible=False), None

"""The step's finished / preempted / resumed request ids, handed to the adapter layer's listeners (why: see the YAML).

Wraps ``GPUModelRunner._update_states`` (vLLM's V1 runner applies the step's ``SchedulerOutput`` to its
cached requests and persistent batch there, once per step, before it prepares the step's inputs): vLLM's
method runs first and its result is returned unchanged; then, when the step finished, preempted or resumed
any request, ``SLOT_EVENTS.deliver(finished, preempted, resumed)`` (``adapters/slot_events.py``) calls every
registered listener. A listener's error propagates (the step stops; never swallowed). Counts: ``finished``,
``preempted``, ``resumed`` (ids delivered) and ``deliveries`` in this patch's record.
"""

from __future__ import annotations

from vllm_patchkit.adapters import SLOT_EVENTS


def update_states(wrapped, instance, args, kwargs, ctx):
    """Wrap of GPUModelRunner._update_states (instance: the runner)."""
    result = wrapped(*args, **kwargs)
    so = ctx.arg(args, kwargs, "scheduler_output")
    finished = so.finished_req_ids or ()
    preempted = so.preempted_req_ids or ()
    resumed = so.scheduled_cached_reqs.resumed_req_ids or ()
    if finished or preempted or resumed:
        ctx.count("finished", len(finished))
        ctx.count("preempted", len(preempted))
        ctx.count("resumed", len(resumed))
        ctx.count("deliveries")
        SLOT_EVENTS.deliver(finished, preempted, resumed)
    return result

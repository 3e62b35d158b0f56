"""The step's finished / preempted / resumed request ids, handed to the adapter layer's listeners (why: see the YAML).

Wraps ``GPUModelRunner._update_states`` (vLLM's V1 runner applies the step's ``SchedulerOutput`` to its
cached requests and persistent batch there, once per step, before it prepares the step's inputs): vLLM's
method runs first and its result is returned unchanged; then, when the step finished, preempted or resumed
any request, ``SLOT_EVENTS.deliver(finished, preempted, resumed)`` (``adapters/slot_events.py``) calls every
registered listener. A listener's error propagates (the step stops; never swallowed). Counts: ``finished``,
``preempted``, ``resumed`` (ids delivered) and ``deliveries`` in this patch's record.

``finish_requests`` (image-slot-events-v2) is the V2 runner's form: V2 has no ``resumed_req_ids``, so the
runner's preempted ids are remembered on it and a new request among them is delivered as resumed.
"""

from __future__ import annotations

from patchkit_deepseek_v4.adapters import SLOT_EVENTS


PREEMPTED_ATTR = "_vllm_patchkit_preempted"  # on each V2 runner: the ids it freed as preempted, not yet back


def _deliver(ctx, finished, preempted, resumed) -> None:
    if finished or preempted or resumed:
        ctx.count("finished", len(finished))
        ctx.count("preempted", len(preempted))
        ctx.count("resumed", len(resumed))
        ctx.count("deliveries")
        SLOT_EVENTS.deliver(finished, preempted, resumed)


def finish_requests(wrapped, instance, args, kwargs, ctx):
    """Wrap of the V2 GPUModelRunner.finish_requests (instance: the runner)."""
    result = wrapped(*args, **kwargs)
    so = ctx.arg(args, kwargs, "scheduler_output")
    finished = so.finished_req_ids or ()
    preempted = so.preempted_req_ids or ()
    waiting = instance.__dict__.setdefault(PREEMPTED_ATTR, set())
    resumed = [r.req_id for r in so.scheduled_new_reqs if r.req_id in waiting] if waiting else []
    waiting.difference_update(resumed)
    waiting.difference_update(finished)
    waiting.update(preempted)
    _deliver(ctx, finished, preempted, resumed)
    return result


def update_states(wrapped, instance, args, kwargs, ctx):
    """Wrap of GPUModelRunner._update_states (instance: the runner)."""
    result = wrapped(*args, **kwargs)
    so = ctx.arg(args, kwargs, "scheduler_output")
    finished = so.finished_req_ids or ()
    preempted = so.preempted_req_ids or ()
    resumed = so.scheduled_cached_reqs.resumed_req_ids or ()
    _deliver(ctx, finished, preempted, resumed)
    return result

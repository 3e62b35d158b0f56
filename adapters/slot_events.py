"""Where a plugin's state-slot allocator hears which requests finished, were preempted or resumed.

Why this exists: a model with a per-request state slot (adapters/protocol.py) must give a slot back when its
request finishes, and must re-seat a preempted request's slot when it resumes (its state is recomputed or
restored from an image into a fresh slot). Only the worker's model runner sees those events in order, one
step at a time: vLLM hands them to ``GPUModelRunner._update_states`` in the step's ``SchedulerOutput``
(``finished_req_ids``, ``preempted_req_ids``, ``scheduled_cached_reqs.resumed_req_ids``). The native plugin
(ROCm/ATOM, ``paged_state_image.py``: ``register_slot_allocator``, ``_apply_runner_patches``) wraps that method
and calls each registered allocator's ``release``. Here the wrap is a declared patch
(``patches/image_slot_events.yaml``, recorded and counted like any other), and this is the one place a plugin's
allocator plugs in, so the allocator never reads vLLM's scheduler output itself.
"""

from __future__ import annotations

from typing import Callable, FrozenSet

#: ``listener(finished, preempted, resumed)``: three frozensets of request ids, one step's worth.
Listener = Callable[[FrozenSet[str], FrozenSet[str], FrozenSet[str]], None]


class SlotEvents:
    """The step's finished / preempted / resumed request ids, handed to every registered listener.

    ``listen(fn)`` registers ``fn`` (once; registering it again changes nothing) and returns a function that
    unregisters it. ``deliver`` is called by the patch ``image-slot-events`` after vLLM's
    ``GPUModelRunner._update_states`` ran for the step, before the step's inputs are prepared, only when one
    of the three sets is non-empty; listeners run in registration order. A listener that raises stops the
    step: the error is re-raised naming the listener (a slot that was not released would be handed out twice
    or leak, so it must never be swallowed).
    """

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> Callable[[], None]:
        if listener not in self._listeners:  # == : the same bound method twice is one listener
            self._listeners.append(listener)
        return lambda: self.unlisten(listener)

    def unlisten(self, listener: Listener) -> None:
        self._listeners = [existing for existing in self._listeners if existing != listener]

    def deliver(self, finished, preempted, resumed) -> None:
        events = (frozenset(finished or ()), frozenset(preempted or ()), frozenset(resumed or ()))
        for listener in tuple(self._listeners):
            try:
                listener(*events)
            except Exception as exc:
                name = getattr(listener, "__qualname__", None) or repr(listener)
                raise RuntimeError(
                    f"vllm-patchkit: slot-event listener {name} failed on finished={sorted(events[0])} "
                    f"preempted={sorted(events[1])} resumed={sorted(events[2])}: {exc!r}") from exc


#: The process's one registration point (a plugin registers its slot allocator here from its worker side).
SLOT_EVENTS = SlotEvents()

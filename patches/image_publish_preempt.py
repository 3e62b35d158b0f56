"""A preempted request's deferred image is dropped; the request resumes (why: see the YAML).

Wraps ``Scheduler._preempt_request``, before vLLM frees the request's blocks and puts it back in the waiting
queue. The count goes to the book's record (``image-publish``: ``dropped_on_preemption``).
"""

from __future__ import annotations

from vllm_patchkit.patches.image_publish import existing_book


def preempt_request(wrapped, instance, args, kwargs, ctx):
    """Wrap of Scheduler._preempt_request (instance: the Scheduler or AsyncScheduler)."""
    book = existing_book(instance.kv_cache_manager)
    if book is not None:
        book.drop(ctx.arg(args, kwargs, "request"), "dropped_on_preemption")
    return wrapped(*args, **kwargs)

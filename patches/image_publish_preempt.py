"""A preempted request's deferred image is dropped; the request resumes (why: see the YAML).

Wraps ``Scheduler._preempt_request``, before vLLM frees the request's blocks and puts it back in the waiting
queue: an image published in this same step is taken back (its forward will not run, ``Book.take_back``), a
deferred one dropped, and the request's marks and last image forgotten (it starts over, as native's
``last_checkpoint_pos`` does). The counts go to the book's record (``image-publish``: ``dropped_on_preemption``,
``unpublished_not_run``).
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import existing_book


def preempt_request(wrapped, instance, args, kwargs, ctx):
    """Wrap of Scheduler._preempt_request (instance: the Scheduler or AsyncScheduler)."""
    book = existing_book(instance.kv_cache_manager)
    if book is not None:
        request = ctx.arg(args, kwargs, "request")
        book.take_back(request)
        book.drop(request, "dropped_on_preemption")
        book.forget(request)
    return wrapped(*args, **kwargs)

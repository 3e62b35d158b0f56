"""A finishing request's deferred image: published if its boundary hash exists, else dropped (why: the YAML).

Wraps ``Scheduler._free_request`` (both natural completion and abort reach it, with the request's finished
status already set), before vLLM frees the request, which then goes on exactly as without the patch. The
decision reads the hash through the book's one view (``Book.boundary_hash``); the counts go to the book's
record (``image-publish``).
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import existing_book


def free_request(wrapped, instance, args, kwargs, ctx):
    """Wrap of Scheduler._free_request (instance: the Scheduler or AsyncScheduler)."""
    book = existing_book(instance.kv_cache_manager)
    if book is not None:
        request = ctx.arg(args, kwargs, "request")
        image = book.pending.get(request.request_id)
        if image is not None:
            aborted = request.status.name == "FINISHED_ABORTED"
            published = book.decide(request, image, on_missing="dropped_on_abort" if aborted
                                    else "dropped_unhashed_on_finish")
            ctx.count(("abort_" if aborted else "finish_") + ("published" if published else "dropped"))
        book.forget(request)
    return wrapped(*args, **kwargs)

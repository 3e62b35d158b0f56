"""At each prefix lookup, a request's anchor and demand rung (why: see the YAML).

Wraps ``KVCacheManager.get_computed_blocks`` (the scheduler's lookup for a waiting request): after vLLM's
answer, the image book notes where this request's prompt-end anchor and demand rung lie (``Book.admit``); the
answer is returned unchanged. Before the book exists (made at the manager's first ``allocate_slots``) no
request has run, so there is no hit to place a demand rung at; the anchor is computed when it is needed.
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import existing_book


def get_computed_blocks(wrapped, instance, args, kwargs, ctx):
    """Wrap of KVCacheManager.get_computed_blocks (instance: the KVCacheManager)."""
    result = wrapped(*args, **kwargs)
    book = existing_book(instance)  # made by the first allocate_slots; before it no request ran, so no hit
    if book is not None:
        blocks, hit, shared_prefix_boundary = result
        book.admit(ctx.arg(args, kwargs, "request"), blocks, int(hit), int(shared_prefix_boundary))
    return result

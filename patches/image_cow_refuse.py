"""No copy-on-write block copy is handed to the worker for an adapter's opaque pool (why: see the YAML).

Wraps ``KVCacheManager.take_kv_cache_block_copies`` (the scheduler drains the step's copy-on-write copies
there and sends them as ``SchedulerOutput.kv_cache_block_copies``): for a manager with an adapter's image
groups (the image book exists), a non-empty list stops EngineCore with a message naming the blocks, before
the worker would copy vLLM's view of them.
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import existing_book


def take_kv_cache_block_copies(wrapped, instance, args, kwargs, ctx):
    """Wrap of KVCacheManager.take_kv_cache_block_copies (instance: the KVCacheManager)."""
    copies, retained = wrapped(*args, **kwargs)
    book = existing_book(instance)
    if copies and book is not None:
        pairs = [(c.src_block_id, c.dst_block_id) for c in copies[:8]]
        raise RuntimeError(
            f"vllm-patchkit: {ctx.patch.key}: vLLM scheduled {len(copies)} copy-on-write block copies "
            f"(source, copy: {pairs}) on the {book.layout.adapter.name} pool, whose blocks vLLM does not lay "
            "out (the adapter's proxy and image groups): the copy would corrupt them")
    return copies, retained

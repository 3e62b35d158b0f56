"""An image group frees a request's older image blocks itself: two per request (why: see the YAML).

Wraps ``MambaManager.remove_skipped_blocks``. For a manager the image book marked as an image group, vLLM's
pass (which frees on *processed* tokens and so lags a step in flight under async scheduling) does not run;
instead every block of the request but its last non-null one (the previous step's running block, whose
image may still be in flight) goes back to the pool, before vLLM allocates the step's new block. So a
request holds at most 2 blocks per image group, with or without async scheduling, as the native plugin's
``SchedulerImages.release_image_blocks`` does. A published image stays in vLLM's prefix cache once freed.
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import IMAGE_GROUP_ATTR


def remove_skipped_blocks(wrapped, instance, args, kwargs, ctx):
    """Wrap of MambaManager.remove_skipped_blocks (instance: one group's MambaManager)."""
    if not instance.__dict__.get(IMAGE_GROUP_ATTR):
        return wrapped(*args, **kwargs)
    blocks = instance.req_to_blocks.get(ctx.arg(args, kwargs, "request_id"))
    if not blocks:
        return None
    held = [i for i, b in enumerate(blocks) if not b.is_null]
    freed = [blocks[i] for i in held[:-1]]
    for i in held[:-1]:
        blocks[i] = instance._null_block
    if freed:
        instance.block_pool.free_blocks(freed)
        ctx.count("blocks_released", len(freed))
    return None

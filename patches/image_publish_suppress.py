"""Image groups are published by the image book only (why: see the YAML).

Wraps ``MambaManager.cache_blocks``: for a manager the book marked as an image group, vLLM's own caching
(every block boundary, its partial tails and offload hand-offs) does not run; every other Mamba group is
forwarded untouched.
"""

from __future__ import annotations

from patchkit_deepseek_v4.image_publish import IMAGE_GROUP_ATTR


def cache_blocks(wrapped, instance, args, kwargs, ctx):
    """Wrap of MambaManager.cache_blocks (instance: one group's MambaManager)."""
    if instance.__dict__.get(IMAGE_GROUP_ATTR):
        ctx.count("image_group_calls_skipped")
        return None
    return wrapped(*args, **kwargs)

"""A prefill chunk ends where the placement puts an image, and nowhere else it need not (why: see the YAML).

Wraps ``Scheduler._mamba_block_aligned_split`` (vLLM's own clip of a prefill chunk to where a Mamba state must
be materialised). For a scheduler whose KV-cache config holds an adapter's image groups, the chunk is cut at
the earliest interval rung, demand rung or anchor inside it (``Placement.cut``), as the native plugin's
``SchedulerImages.chunk_len`` does in place of vLLM's clip (the image groups are the config's only Mamba
groups, and vLLM's own caching of them is off); every other scheduler gets vLLM's answer.
"""

from __future__ import annotations

from patchkit_deepseek_v4.adapters import REGISTRY
from patchkit_deepseek_v4.image_publish import LAYOUT_ATTR, existing_book, image_layout


def mamba_block_aligned_split(wrapped, instance, args, kwargs, ctx):
    """Wrap of Scheduler._mamba_block_aligned_split (instance: the Scheduler); returns the chunk's tokens."""
    d = instance.__dict__
    if LAYOUT_ATTR not in d:
        on = instance.cache_config.enable_prefix_caching
        d[LAYOUT_ATTR] = image_layout(instance.kv_cache_config, REGISTRY) if on else None
    layout = d[LAYOUT_ATTR]
    if layout is None:
        return wrapped(*args, **kwargs)
    request = ctx.arg(args, kwargs, "request")
    num_new_tokens = ctx.arg(args, kwargs, "num_new_tokens")
    start = (request.num_computed_tokens + ctx.arg(args, kwargs, "num_new_local_computed_tokens")
             + ctx.arg(args, kwargs, "num_external_computed_tokens"))
    if start >= max(request.num_prompt_tokens, request.num_tokens - 1) or not layout.placement.publishes:
        return num_new_tokens  # decoding, or no image: nothing to cut for
    book = existing_book(instance.kv_cache_manager)
    marks = book.marks.get(request.request_id) if book is not None else None
    demand, anchor = marks or (0, layout.placement.anchor_at(request.num_prompt_tokens, request.num_tokens,
                                                             layout.block_size))
    end = start + num_new_tokens
    target = layout.placement.cut(start, end, request.num_prompt_tokens, demand, anchor)
    if target and target < end:
        ctx.count("chunks_cut_for_" + (layout.placement.keeps(target, request.num_prompt_tokens, demand, anchor)
                                       or "image"))
        return target - start
    return num_new_tokens

"""A prefill chunk also ends at each image rung, so the rung is a step's end (why: see the YAML).

Wraps ``Scheduler._mamba_block_aligned_split`` (vLLM's own clip of a prefill chunk to where a Mamba state must
be materialised): after vLLM's answer, a chunk that would run past the next interval rung is cut there. The
placement is the adapter's (``Placement.next_rung``), read once per scheduler from its KV-cache config.
"""

from __future__ import annotations

from vllm_patchkit.adapters import REGISTRY
from vllm_patchkit.patches.image_publish import LAYOUT_ATTR, image_layout


def mamba_block_aligned_split(wrapped, instance, args, kwargs, ctx):
    """Wrap of Scheduler._mamba_block_aligned_split (instance: the Scheduler); returns the chunk's tokens."""
    num_new_tokens = wrapped(*args, **kwargs)
    d = instance.__dict__
    if LAYOUT_ATTR not in d:
        on = instance.cache_config.enable_prefix_caching
        d[LAYOUT_ATTR] = image_layout(instance.kv_cache_config, REGISTRY) if on else None
    layout = d[LAYOUT_ATTR]
    if layout is None or not layout.placement.publishes:
        return num_new_tokens
    request = ctx.arg(args, kwargs, "request")
    start = (request.num_computed_tokens + ctx.arg(args, kwargs, "num_new_local_computed_tokens")
             + ctx.arg(args, kwargs, "num_external_computed_tokens"))
    rung = layout.placement.next_rung(start)
    if start < rung < start + num_new_tokens:
        ctx.count("chunks_cut_at_rung")
        return rung - start
    return num_new_tokens

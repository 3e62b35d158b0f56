"""vLLM does not zero new blocks of a KV-cache config that holds an adapter's proxy (why: see the YAML).

Wraps the getter of ``KVCacheConfig.needs_kv_cache_zeroing`` (read by the scheduler, the hybrid coordinator
and the worker): for a config with a registered adapter's proxy layer in one of its groups the answer is
False; every other config gets vLLM's answer.
"""

from __future__ import annotations

from vllm_patchkit.adapters import REGISTRY


def needs_kv_cache_zeroing(wrapped, instance, args, kwargs, ctx):
    """Wrap of the KVCacheConfig.needs_kv_cache_zeroing getter (instance: the KVCacheConfig)."""
    names = [{n: None for g in instance.kv_cache_groups for n in g.layer_names}]
    if REGISTRY.for_kv_specs(names) is not None:
        ctx.count("zeroing_off")
        return False
    return wrapped(*args, **kwargs)

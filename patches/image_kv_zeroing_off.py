"""vLLM does not zero new blocks of a KV-cache config that holds an adapter's proxy (why: see the YAML).

Wraps the getter of ``KVCacheConfig.needs_kv_cache_zeroing`` (read by the scheduler, the hybrid coordinator
and the worker): for a config with a registered adapter's proxy layer in one of its groups the answer is
False; every other config gets vLLM's answer. From vLLM 0.34.0 the answer is a dataclass field set in
``KVCacheConfig.__post_init__``: ``post_init`` (image-kv-zeroing-off@2) sets it False there, for the same
configs.
"""

from __future__ import annotations

from patchkit_deepseek_v4.adapters import REGISTRY


def _holds_proxy(config) -> bool:
    names = [{n: None for g in config.kv_cache_groups for n in g.layer_names}]
    return REGISTRY.for_kv_specs(names) is not None


def post_init(wrapped, instance, args, kwargs, ctx):
    """Wrap of KVCacheConfig.__post_init__ (vLLM >= 0.34; instance: the KVCacheConfig being built)."""
    result = wrapped(*args, **kwargs)
    if _holds_proxy(instance):
        instance.needs_kv_cache_zeroing = False
        ctx.count("zeroing_off")
    return result


def needs_kv_cache_zeroing(wrapped, instance, args, kwargs, ctx):
    """Wrap of the KVCacheConfig.needs_kv_cache_zeroing getter (instance: the KVCacheConfig)."""
    if _holds_proxy(instance):
        ctx.count("zeroing_off")
        return False
    return wrapped(*args, **kwargs)

"""Stand-ins for ATOM's Scheduler subclass and its fixed-signature wrappers (ATOM is not installed here), named by
the declarations of tests/data/atom_patch_sites.yaml and tests/corpus/atom/catalogue.yaml.

Our own code, not ATOM's: the subclass overrides the base method with the base's signature (as ATOM's class does)
and calls up; each wrapper stand-in has only the signature of ATOM's wrapper. The ATOM measurement
(scripts/atom_sites_report.py) reads this file statically and never imports it, so importing vLLM's scheduler here
costs nothing there; import it only in a process where vLLM's CPU build may load.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler


class AtomSchedulerStandIn(Scheduler):
    """ATOM's hybrid-aware scheduler: overrides the invalid-block recompute (multi-group KV load failures)."""

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens,
                                             evict_blocks=True):
        return super()._update_requests_with_invalid_blocks(requests, invalid_block_ids, num_scheduled_tokens,
                                                            evict_blocks)


# ATOM's fixed-signature wrappers (their shapes, as the catalogue's notes and truths describe them; not ATOM's code):
# each calls the original with the arguments it names, so it rejects any call vLLM makes with more.
def pool_bytes_per_block_wrapper(kv_cache_groups):
    """ATOM wraps `_pool_bytes_per_block` with the one argument of vLLM 0.31.0."""
    ...


def get_parser_wrapper(cls, tool_parser_name=None, reasoning_parser_name=None, enable_auto_tools=False,
                       model_name=None, is_harmony=False, **kwargs):
    """ATOM's classmethod wrapper re-declares five keywords and forwards any other keyword (**kwargs)."""
    ...


def reserve_prefill_lookahead_wrapper(self, request, num_computed_tokens, num_new_tokens):
    """ATOM's class-level wrapper of Scheduler._reserve_prefill_lookahead takes the three arguments of 0.31.0."""
    ...


def local_prefix_cache_hit_wrapper(self, request):
    """ATOM's class-level wrapper of Scheduler._get_local_prefix_cache_hit takes (self, request) and calls the
    original with those two only."""
    ...


def get_computed_blocks_wrapper(self, request):
    """ATOM's class-level wrapper of KVCacheManager.get_computed_blocks takes (self, request)."""
    ...


def get_computed_blocks_closure(self, request):
    """ATOM's per-instance closure takes (request); bound on the object, so (self, request) at the class."""
    ...


def hf_config_override_wrapper(hf_config):
    """ATOM's staticmethod replacement of SpeculativeConfig.hf_config_override takes hf_config alone."""
    ...


def free_blocks(self, ordered_blocks):
    """ATOM's BlockPool.free_blocks wrapper (deepseek_v4_prefix_patch.py): a fixed (self, ordered_blocks) that
    calls the original with those two only. Declared as a `replace` that copies nothing (`reimplements: []`), so
    that check sees the signature vLLM's calls must fit."""
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool.free_blocks.__wrapped__(self, ordered_blocks)


def post_load_hook(wrapped, instance, args, kwargs, ctx):
    """ATOM's process_weights_after_loading wrappers (register.py, model_wrapper.py) give act_dtype a default and
    pass it on to the original: they read act_dtype (`params: [act_dtype]`)."""
    return wrapped(ctx.arg("act_dtype"))


from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase  # noqa: E402


class AtomLMCacheOffloadConnectorStandIn(KVConnectorBase_V1):
    """ATOM's offload connector (registered with KVConnectorFactory.register_connector): the two hooks the catalogue
    names, with the base's signatures, as ATOM's class overrides them (declared `kind: hook`)."""

    def handle_preemptions(self, kv_connector_metadata):
        return None

    def get_block_ids_with_load_errors(self):
        return set()


class Glm5NextConvertorStandIn(ModelArchConfigConvertorBase):
    """ATOM's GLM-5.3 convertors, registered as MODEL_ARCH_CONFIG_CONVERTORS['glm5_next'] / ['glm5_next_mtp']
    (declared `kind: register`): the class only; its overrides are ATOM's business, not vLLM's."""

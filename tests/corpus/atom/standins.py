"""Stand-ins for ATOM's Scheduler subclasses (ATOM is not installed here), named by the kind subclass
declarations of tests/data/atom_patch_sites.yaml and tests/corpus/atom/catalogue.yaml.

Our own code, not ATOM's: each overrides the base method with the base's signature (as ATOM's classes do)
and calls up. The ATOM measurement (scripts/atom_sites_report.py) reads this file statically and never
imports it, so importing vLLM's scheduler here costs nothing there; import it only in a process where
vLLM's CPU build may load.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler


class AtomSchedulerStandIn(Scheduler):
    """ATOM's hybrid-aware scheduler: overrides the invalid-block recompute (multi-group KV load failures)."""

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens,
                                             evict_blocks=True):
        return super()._update_requests_with_invalid_blocks(requests, invalid_block_ids, num_scheduled_tokens,
                                                            evict_blocks)


class PrefixCapMixin:
    """ATOM's V4.1 scheduler takes its override from a mixin: the method is the mixin's, not the class's own."""

    def _get_local_prefix_cache_hit(self, request):
        return super()._get_local_prefix_cache_hit(request)


class AtomV41SchedulerStandIn(PrefixCapMixin, Scheduler):
    """ATOM's DeepSeek-V4.1 scheduler: caps local prefix-cache hits."""

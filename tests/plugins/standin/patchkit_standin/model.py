"""Stand-in for ATOM's DeepSeek-V4 model class, which cannot run on this CPU machine.

It is vLLM's Llama unchanged. It matches ATOM's class exactly where patches
look: the architecture name (``DeepseekV4ForCausalLM``) and the registry's
answer (an out-of-tree class, not vLLM's own).

It has no state slots, but it listens where a plugin's slot allocator does (``SLOT_EVENTS``, fed by the patch
``image-slot-events`` from vLLM's real runner in the worker) and counts what it hears into the worker's record
(``patchkit_standin.slot_events``: ``finished``, ``preempted``, ``resumed``, ``steps``), so a serve shows the
hook reaching a listener.
"""

import logging
import os

from vllm.model_executor.models.llama import LlamaForCausalLM

logger = logging.getLogger("vllm.patchkit_standin")  # under "vllm" so vLLM's handler prints it
SLOT_EVENTS_SOURCE = "patchkit_standin.slot_events"


def count_slot_events(finished, preempted, resumed) -> None:
    """A listener of patchkit_deepseek_v4.adapters.SLOT_EVENTS: counts into this process's record."""
    from vllm_patchkit.runtime import state as runtime

    runtime.count(SLOT_EVENTS_SOURCE, "steps")
    for name, ids in (("finished", finished), ("preempted", preempted), ("resumed", resumed)):
        runtime.count(SLOT_EVENTS_SOURCE, name, len(ids))


class StandinDeepseekV4ForCausalLM(LlamaForCausalLM):
    """Thin subclass of vLLM's Llama served under the DeepseekV4 architecture name."""

    # Keyword-only ``vllm_config``/``prefix`` as upstream: vLLM reads this signature
    # to tell new-style model classes from old-style ones.
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        from patchkit_deepseek_v4.adapters import SLOT_EVENTS

        SLOT_EVENTS.listen(count_slot_events)  # once per process: listening again changes nothing
        logger.info("patchkit_standin: model class %s.%s in pid %d",
                    type(self).__module__, type(self).__qualname__, os.getpid())

"""Stand-in for ATOM's DeepSeek-V4 model class, which cannot run on this CPU machine.

It is vLLM's Llama unchanged. It matches ATOM's class exactly where patches
look: the architecture name (``DeepseekV4ForCausalLM``) and the registry's
answer (an out-of-tree class, not vLLM's own).
"""

import logging
import os

from vllm.model_executor.models.llama import LlamaForCausalLM

logger = logging.getLogger("vllm.patchkit_standin")  # under "vllm" so vLLM's handler prints it


class StandinDeepseekV4ForCausalLM(LlamaForCausalLM):
    """Thin subclass of vLLM's Llama served under the DeepseekV4 architecture name."""

    # Keyword-only ``vllm_config``/``prefix`` as upstream: vLLM reads this signature
    # to tell new-style model classes from old-style ones.
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        logger.info("patchkit_standin: model class %s.%s in pid %d",
                    type(self).__module__, type(self).__qualname__, os.getpid())

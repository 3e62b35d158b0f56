"""An out-of-tree model class for lifecycle cases of patches that need one (`served_by: out_of_tree`).

vLLM's Llama unchanged, defined outside `vllm.*`: registered under the patch's architecture
name, vLLM's registry answers with a class no vLLM module defines, which is all such a
precondition looks at. Imported only inside the harness's children (it imports vLLM's Llama).
"""

from vllm.model_executor.models.llama import LlamaForCausalLM


class OutOfTreeStandin(LlamaForCausalLM):
    """A tiny Llama served under any architecture name, from outside vLLM."""

    # Keyword-only as upstream: vLLM reads this signature to tell new-style model classes apart.
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)

"""Our stand-ins for vllm-canon 0.1.0's classes that vLLM calls into (declared `kind: hook`): the overrides with
the signatures the plugin's classes give them, bodies empty. Not the plugin's code."""

from __future__ import annotations

from vllm.model_executor.layers.mamba.abstract import MambaBase


class CanonConvStandIn(MambaBase):
    """The plugin's short-conv layer: vLLM finds it by isinstance(MambaBase) in static_forward_context and calls
    these to size and type its state."""

    def get_state_shape(self):
        return ()

    def get_state_dtype(self):
        return ()

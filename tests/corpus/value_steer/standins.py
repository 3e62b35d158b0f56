"""Our stand-ins for value-steer 0.2.0: its worker and its two model runners with the plugin's override signatures
(bodies call super(), or are `...` where the plugin's own step stands in for vLLM's). Not the plugin's code."""

from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker


class SteerWorkerStandIn(Worker):
    def init_device(self):
        super().init_device()


class AbstentionRunnerStandIn(GPUModelRunner):
    def __init__(self, vllm_config, device):
        super().__init__(vllm_config, device)

    def sample_tokens(self, grammar_output):
        return super().sample_tokens(grammar_output)


class VFDRunnerStandIn(GPUModelRunner):
    def __init__(self, vllm_config, device):
        super().__init__(vllm_config, device)

    def initialize_kv_cache(self, kv_cache_config) -> None:
        super().initialize_kv_cache(kv_cache_config)

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        return super()._prepare_inputs(scheduler_output, num_scheduled_tokens)

    def execute_model(self, scheduler_output, *args, **kwargs):
        """The plugin's steady-state decode step is its own (super() only on prefill / mixed steps)."""
        ...

    def _update_states(self, scheduler_output):
        return super()._update_states(scheduler_output)

"""Our stand-in for thaw-vllm 0.6.0's model loader, with the plugin's override signatures (its two loading methods
are abstract upstream, so there is no super() to call). Not the plugin's code."""

from vllm.model_executor.model_loader.base_loader import BaseModelLoader


class ThawLoaderStandIn(BaseModelLoader):
    def __init__(self, load_config):
        super().__init__(load_config)

    def download_model(self, model_config) -> None:
        ...

    def load_weights(self, model, model_config) -> None:
        ...

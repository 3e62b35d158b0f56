"""The seed's toy model family, shared by the KV-config hook's tests and the release-source probes: a fixed
checkpoint spec (pages of 4096 B, block 256, an image of 10,000 B and a slot of 11,000 B), so the numbers of
the seed's toy check (100 physical blocks, 11 withheld, 3 image groups → 20,992 tokens) come out everywhere."""

from __future__ import annotations

from patchkit_deepseek_v4.adapters import CheckpointSpec, ModelAdapter

PAGE = 4096
BS = 256
PHYSICAL = 100


class ToyAdapter(ModelAdapter):
    """A stand-in family: fixed checkpoint spec with the seed's toy numbers."""

    name = "Toy"
    architectures = ("ToyStateForCausalLM",)
    proxy_layer_name = "model.layers.0.toy_proxy"
    image_layer_suffix = "toy_image"
    block_size = BS

    def checkpoint_spec(self, vllm_config):
        return CheckpointSpec(page_bytes=PAGE, slot_bytes=11_000, image_bytes=10_000, layout_id="toy-v1")

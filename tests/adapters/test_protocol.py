"""The adapter protocol: sizing arithmetic, placement defaults, the reference copier, the registry, the model match."""

from __future__ import annotations

import pytest
import torch

from patchkit_deepseek_v4.adapters import (
    DEMAND_ENV,
    INTERVAL_ENV,
    REGISTRY,
    ByteImageCopier,
    CheckpointSpec,
    DeepseekV4Adapter,
    ModelAdapter,
    Placement,
    Registry,
    Sizing,
    StateCopier,
)
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"


class Toy(ModelAdapter):
    name = "Toy"
    architectures = ("ToyForCausalLM",)
    proxy_layer_name = "model.layers.0.toy_proxy"
    image_layer_suffix = "toy_image"
    block_size = 16

    def __init__(self, spec=None, **kw):
        super().__init__(**kw)
        self.spec = spec or CheckpointSpec(page_bytes=64, slot_bytes=200, image_bytes=150, layout_id="toy")

    def checkpoint_spec(self, vllm_config):
        return self.spec


# -- checkpoint spec and sizing -----------------------------------------------

def test_units_per_checkpoint_is_ceil_image_over_page():
    assert CheckpointSpec(4096, 11_000, 10_000, "t").units_per_checkpoint == 3
    assert CheckpointSpec(4096, 8192, 8192, "t").units_per_checkpoint == 2
    assert CheckpointSpec(4096, 8193, 8193, "t").units_per_checkpoint == 3


@pytest.mark.parametrize("args", [(0, 10, 10), (64, 10, 11), (64, 0, 0)])
def test_bad_specs_are_rejected(args):
    with pytest.raises(ValueError):
        CheckpointSpec(*args, "t")


def test_from_segments_aligns_and_keeps_image_parts_in_order():
    spec = CheckpointSpec.from_segments(1024, "t", [("a", 100, True), ("b", 300, False), ("c", 10, True), ("z", 0, True)])
    assert [(s.name, s.offset, s.nbytes, s.in_image) for s in spec.segments] == [
        ("a", 0, 256, True), ("b", 256, 512, False), ("c", 768, 256, True)]
    assert (spec.slot_bytes, spec.image_bytes, spec.units_per_checkpoint) == (1024, 512, 1)
    assert [s.name for s in spec.image_segments()] == ["a", "c"]


def test_sizing_withholds_the_slot_area_as_a_tail():
    sizing = Sizing(CheckpointSpec(4096, 11_000, 10_000, "t"), block_size=256, num_slots=4)
    assert (sizing.k, sizing.slot_area_bytes, sizing.withheld_blocks) == (3, 44_000, 11)
    assert sizing.usable_blocks(100) == 89
    assert sizing.slot_offset(100, 0) == 89 * 4096 and sizing.slot_offset(100, 3) == 89 * 4096 + 33_000
    with pytest.raises(IndexError):
        sizing.slot_offset(100, 4)


def test_contiguous_spec_withholds_the_same_at_every_physical_count():
    spec = CheckpointSpec(4096, 11_000, 10_000, "t")
    sizing = Sizing(spec, block_size=256, num_slots=4)
    assert spec.withheld_blocks(4) == spec.withheld_blocks(4, 100) == 11
    assert {sizing.withheld_for(p) for p in (12, 100, 10_000)} == {11} == {sizing.withheld_blocks}
    assert sizing.physical_for(89) == 100 and sizing.physical_for(0) == 11


class Carved(CheckpointSpec):
    """A layout that withholds the contiguous count plus one block per 10 physical blocks (not invertible)."""

    def withheld_blocks(self, num_slots, physical_blocks=None):
        base = super().withheld_blocks(num_slots, physical_blocks)
        return base if physical_blocks is None else base + physical_blocks // 10


def test_a_spec_that_carves_more_sizes_the_pool_and_the_slots():
    sizing = Sizing(Carved(4096, 11_000, 10_000, "t"), block_size=256, num_slots=4)
    assert sizing.withheld_blocks == 11                            # the lower bound, what callers passing nothing get
    assert (sizing.withheld_for(100), sizing.usable_blocks(100)) == (21, 79)
    assert sizing.slot_offset(100, 0) == 79 * 4096 and sizing.slot_offset(100, 3) == 79 * 4096 + 33_000
    copier = ByteImageCopier(torch.zeros(100 * 4096, dtype=torch.uint8), sizing, 100)
    assert copier.usable_blocks == 79
    # the fewest physical blocks for n usable ones, searched: equals the brute force
    for n in (1, 50, 79, 80, 500):
        assert sizing.physical_for(n) == min(p for p in range(2_000) if sizing.usable_blocks(p) >= n)
    assert (sizing.physical_for(79), sizing.physical_for(80)) == (99, 101)  # usable 79 at 99 and 100, 80 at 101


# -- placement ------------------------------------------------------------------

def test_placement_defaults_are_the_native_plugins():
    """ATOM's Config: state_checkpoint_interval_tokens=8192, state_checkpoint_demand=True."""
    p = DeepseekV4Adapter().placement({})
    assert (p.interval_tokens, p.demand, p.max_images_per_request, p.images_per_boundary) == (8192, True, 2, 1)
    assert p.publishes and p.working_blocks_per_group == 2


def test_interval_zero_publishes_nothing_but_keeps_two_working_blocks():
    p = DeepseekV4Adapter().placement({INTERVAL_ENV: "0"})
    assert not p.publishes and p.working_blocks_per_group == 2
    assert p.anchor_at(3000, 3000, 128) == 0 and p.demand_at(0, 2944, True) == 0


def test_interval_minus_one_keeps_the_anchor_and_the_demand_rung():
    """Native semantics (``ImagePlacement``: -1 no rungs, the anchor and the demand rung still place images)."""
    p = DeepseekV4Adapter().placement({INTERVAL_ENV: "-1"})
    assert p.publishes and p.limit(20_000) == 0
    assert p.anchor_at(20_000, 20_000, 128) == 19_968
    assert p.keeps(19_968, 20_000, 0, 19_968) == "anchor" and p.keeps(8192, 20_000, 0, 19_968) is None
    assert p.demand_at(0, 2944, True) == 2944 and p.keeps(2944, 20_000, 2944, 19_968) == "demand"
    assert not p.decode_keeps(20_096, 0, 128)


def test_decode_keeps_are_one_interval_past_the_last_image():
    """The issue's example: a 1,000-token prompt at interval 8,192, block 128: the anchor is at 896, the first
    decode keep at 9,088 (not at 8,192)."""
    p = DeepseekV4Adapter().placement({})
    anchor = p.anchor_at(1000, 1000, 128)
    assert anchor == 896
    assert next(e for e in range(1001, 20_000) if p.decode_keeps(e, anchor, 128)) == 9088


def test_a_block_aligned_prompts_anchor_is_one_block_short():
    p = DeepseekV4Adapter().placement({})
    assert p.anchor_at(12_288, 12_288, 128) == 12_160 and p.anchor_at(12_300, 12_300, 128) == 12_288
    assert p.cut(8192, 12_288, 12_288, 0, 12_160) == 12_160 and p.cut(12_160, 12_288, 12_288, 0, 12_160) == 0


def test_demand_env_and_its_bad_values():
    assert DeepseekV4Adapter().placement({DEMAND_ENV: "0"}).demand is False
    with pytest.raises(ValueError, match=DEMAND_ENV):
        DeepseekV4Adapter().placement({DEMAND_ENV: "yes"})


@pytest.mark.parametrize("raw", ["100", "-256", "-2", "x"])
def test_bad_intervals_are_refused(raw):
    with pytest.raises(ValueError, match=INTERVAL_ENV):
        DeepseekV4Adapter().placement({INTERVAL_ENV: raw})


def test_interval_override_must_be_block_aligned():
    assert DeepseekV4Adapter().placement({INTERVAL_ENV: "512"}).interval_tokens == 512


# -- the reference copier ---------------------------------------------------------

def _pool(adapter, physical):
    sizing = Sizing(adapter.spec, adapter.block_size, num_slots=2)
    buf = torch.zeros(physical * sizing.page_bytes, dtype=torch.uint8)
    return sizing, buf


def test_copier_round_trips_an_image_through_k_scattered_blocks():
    spec = CheckpointSpec.from_segments(256, "t", [("ring", 300, True), ("hca", 200, False), ("csa", 100, True)])
    adapter = Toy(spec)
    sizing, buf = _pool(adapter, physical=12)
    assert sizing.k == 3 and sizing.withheld_blocks == 8  # 2 slots x 1024 B / 256
    copier = adapter.make_copier(buf, sizing, 12)
    assert isinstance(copier, StateCopier)
    base0, base1 = sizing.slot_offset(12, 0), sizing.slot_offset(12, 1)
    buf[base0:base0 + spec.slot_bytes] = torch.randint(1, 255, (spec.slot_bytes,), dtype=torch.uint8)
    before_pool = buf[:base0].clone()
    copier.store(0, [3, 1, 2])
    assert not torch.equal(buf[:base0], before_pool)  # the image went into the pool's blocks
    copier.restore([3, 1, 2], 1)
    for seg in spec.segments:
        a = buf[base0 + seg.offset:base0 + seg.offset + seg.nbytes]
        b = buf[base1 + seg.offset:base1 + seg.offset + seg.nbytes]
        assert torch.equal(a, b) == seg.in_image, seg.name  # carried parts restored, the rest untouched


@pytest.mark.parametrize("blocks, match", [([1, 2], "k=3"), ([0, 1, 2], "null block"), ([1, 2, 4], "outside the pool")])
def test_copier_refuses_wrong_blocks(blocks, match):
    adapter = Toy(CheckpointSpec(256, 700, 700, "t"))
    sizing, buf = _pool(adapter, physical=10)  # 2 slots x 700 B -> 6 withheld, pool 0..3
    with pytest.raises(ValueError, match=match):
        ByteImageCopier(buf, sizing, 10).store(0, blocks)


def test_copier_needs_a_buffer_covering_every_physical_block():
    adapter = Toy()
    sizing, buf = _pool(adapter, physical=10)
    with pytest.raises(ValueError, match="does not cover 11 blocks"):
        ByteImageCopier(buf, sizing, 11)


# -- registry and names -----------------------------------------------------------

def test_registry_finds_the_adapter_by_its_proxy_layer_only():
    reg = Registry([Toy()])
    toy = reg.adapters[0]
    assert reg.for_kv_specs([{"model.layers.0.self_attn.attn": object()}]) is None
    assert reg.for_kv_specs([{}, {toy.proxy_layer_name: object()}]) is toy  # any worker (pipeline stages)
    assert reg.for_kv_specs([{"model.layers.0.toy_proxy_not": object()}]) is None
    with pytest.raises(ValueError, match="already belongs"):
        reg.register(Toy())
    assert reg.register(toy) is toy


def test_image_layer_names_and_overrides():
    toy = Toy(proxy_layer_name="model.layers.0.other_proxy")
    assert toy.proxy_layer_name == "model.layers.0.other_proxy"
    assert toy.image_layer_names(2) == ["model.layers.1.toy_image", "model.layers.2.toy_image"]
    assert toy.is_image_layer("model.layers.7.toy_image") and not toy.is_image_layer("model.layers.7.toy_image2")
    with pytest.raises(TypeError):
        Toy(no_such_field=1)


def test_the_v4_adapter_is_registered_by_default():
    assert any(isinstance(a, DeepseekV4Adapter) for a in REGISTRY.adapters)


# -- model match: exact architecture + served by the plugin ---------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("adapter-match")
    return {a: build_tiny_model(base / a, architecture=a)
            for a in ("DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM", "LlamaForCausalLM")}


def _config(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model_dir), max_model_len=512, dtype="float32").create_engine_config()


def test_matches_only_the_plugins_v4(checkpoints, standin_registered):
    v4 = DeepseekV4Adapter()
    assert v4.matches(_config(checkpoints["DeepseekV4ForCausalLM"]))
    assert not v4.matches(_config(checkpoints["DeepseekV41ForCausalLM"]))  # no substring match
    assert not v4.matches(_config(checkpoints["LlamaForCausalLM"]))


def test_does_not_match_vllms_own_v4(checkpoints):
    assert not DeepseekV4Adapter().matches(_config(checkpoints["DeepseekV4ForCausalLM"]))

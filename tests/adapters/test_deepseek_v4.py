"""The DeepSeek-V4 checkpoint spec: the formula of adapters/deepseek_v4.py, pinned.

Numbers for the published DeepSeek-V4-Flash configuration (43 layers: 2 SWA, 21
CSA, 20 HCA; W=128, D=512, R=64, Di=128) and a tiny configuration small enough
to check by hand (docs/adapters/deepseek-v4.md shows the arithmetic).
"""

from __future__ import annotations

import math

import pytest

from vllm_patchkit.adapters.deepseek_v4 import DeepseekV4Adapter, V4Inputs, v4_checkpoint_spec

FLASH = dict(num_hidden_layers=43, compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0], sliding_window=128, head_dim=512,
             qk_rope_head_dim=64, index_head_dim=128, num_nextn_predict_layers=1)
TINY = dict(num_hidden_layers=4, compress_ratios=[0, 4, 128, 4], sliding_window=8, head_dim=64, qk_rope_head_dim=16,
            index_head_dim=32)


def test_flash_layer_mix():
    i = V4Inputs.from_hf(FLASH)
    assert len(i.ratios) == 43 and i.ratios.count(4) == 21 and i.ratios.count(128) == 20 and i.ratios.count(1) == 2


def test_entry_and_indexer_row_bytes_match_vllms_v4_packing():
    fp8 = V4Inputs.from_hf(FLASH, kv_fp8=True)
    assert fp8.entry_bytes == 584  # 448 NoPE fp8 + 64x2 RoPE bf16 + 8 UE8M0 scale bytes (vLLM: 584)
    assert fp8.index_row_bytes == 132  # 128 fp8 + one fp32 scale (vLLM: 132)
    assert V4Inputs.from_hf(FLASH, kv_fp8=False).entry_bytes == 1024


def test_compressor_tails_match_vllms_state_cache():
    # CompressorStateCache: coff*r rows of 2*coff*d fp32
    assert V4Inputs.tail_bytes(4, 512) == 8 * 2048 * 4 == 65_536
    assert V4Inputs.tail_bytes(4, 128) == 8 * 512 * 4 == 16_384
    assert V4Inputs.tail_bytes(128, 512) == 128 * 1024 * 4 == 524_288


@pytest.mark.parametrize("fp8, page, slot, image, k", [
    (True, 985_856, 15_420_416, 4_934_656, 6),
    (False, 1_594_624, 17_842_176, 7_356_416, 5),
])
def test_flash_numbers(fp8, page, slot, image, k):
    spec = v4_checkpoint_spec(V4Inputs.from_hf(FLASH, kv_fp8=fp8))
    assert (spec.page_bytes, spec.slot_bytes, spec.image_bytes, spec.units_per_checkpoint) == (page, slot, image, k)
    assert spec.units_per_checkpoint == math.ceil(spec.image_bytes / spec.page_bytes)


def test_flash_fp8_pieces_add_up():
    spec = v4_checkpoint_spec(V4Inputs.from_hf(FLASH))
    rings = 43 * 128 * 584
    csa = 21 * (65_536 + 16_384)
    hca = 20 * 524_288
    assert (rings, csa, hca) == (3_214_336, 1_720_320, 10_485_760)
    assert spec.slot_bytes == rings + csa + hca and spec.image_bytes == rings + csa
    paged = 21 * (64 * 584 + 64 * 132) + 20 * (2 * 584)
    assert paged == 985_664 and spec.page_bytes == 985_856  # rounded up to 256 B


def test_flash_with_mtp_speculation_grows_the_rings():
    spec = v4_checkpoint_spec(V4Inputs.from_hf(FLASH, spec_tokens=1, with_mtp=True))
    # 44 rings (43 + 1 MTP layer) of 129 rows, each 75,336 B rounded up to 75,520
    assert spec.slot_bytes == 44 * 75_520 + 1_720_320 + 10_485_760 == 15_528_960
    assert (spec.image_bytes, spec.units_per_checkpoint) == (5_043_200, 6)


def test_tiny_numbers_by_hand():
    i = V4Inputs.from_hf(TINY)
    spec = v4_checkpoint_spec(i)
    assert (i.entry_bytes, i.index_row_bytes) == (88, 36)  # 48 + 32 + 8; 32 + 4
    assert spec.page_bytes == 16_128  # 2 x (64x88 + 64x36) + 2x88 = 16,048 -> 256-aligned
    assert spec.slot_bytes == 4 * 768 + 2 * (8192 + 4096) + 65_536 == 93_184
    assert spec.image_bytes == 4 * 768 + 2 * (8192 + 4096) == 27_648
    assert spec.units_per_checkpoint == 2
    assert [s.name for s in spec.segments if not s.in_image] == ["hca_tail.2"]
    # the image is a prefix of the slot: one contiguous range to copy
    assert max(s.offset + s.nbytes for s in spec.segments if s.in_image) == spec.image_bytes


def test_layout_id_changes_with_what_changes_bytes():
    a = v4_checkpoint_spec(V4Inputs.from_hf(TINY)).layout_id
    assert a != v4_checkpoint_spec(V4Inputs.from_hf(TINY, kv_fp8=False)).layout_id
    assert a != v4_checkpoint_spec(V4Inputs.from_hf({**TINY, "compress_ratios": [0, 4, 4, 128]})).layout_id
    assert a.startswith("dsv4-slot-v1:block=256:ring=8:dims=64,16,32:kv=fp8:layers=4+0")


@pytest.mark.parametrize("bad, match", [
    ({"sliding_window": None}, "lacks sliding_window"),
    ({"compress_ratios": [0, 4]}, "lists 2 layers"),
    ({"index_head_dim": None}, "no index_head_dim"),
    ({"compress_ratios": [0, 4, 16, 4]}, "knows 0/1"),
])
def test_configs_the_formula_cannot_size_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        v4_checkpoint_spec(V4Inputs.from_hf({**TINY, **bad}))


def test_block_size_must_be_a_multiple_of_every_ratio():
    with pytest.raises(ValueError, match="not a multiple of compress ratios"):
        v4_checkpoint_spec(V4Inputs.from_hf(TINY, block_size=64))


def test_adapter_reads_the_serve_options(tmp_path):
    from types import SimpleNamespace as NS

    def cfg(cache_dtype, spec=None, seqs=256):
        return NS(model_config=NS(hf_config=NS(**FLASH)), cache_config=NS(cache_dtype=cache_dtype),
                  speculative_config=spec, scheduler_config=NS(max_num_seqs=seqs))

    v4 = DeepseekV4Adapter()
    assert v4.inputs(cfg("fp8_ds_mla")).kv_fp8 and v4.inputs(cfg("fp8")).kv_fp8
    assert not v4.inputs(cfg("auto")).kv_fp8
    spec_run = v4.inputs(cfg("fp8", NS(num_speculative_tokens=2)))
    assert (spec_run.spec_tokens, spec_run.mtp_layers) == (2, 1)
    sizing = v4.sizing(cfg("fp8"))
    assert (sizing.num_slots, sizing.k, sizing.withheld_blocks) == (256, 6, 4005)

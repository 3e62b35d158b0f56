"""The DeepSeek-V4 checkpoint spec equals the plugin's (ATOM's) native one: figures pinned.

ATOM's own figures for V4-Flash with fp8 KV at its 128-token block (the PR that
added ``atom/plugin/vllm/deepseek_v4_image.py``): page 531,712 B, image
5,324,800 B, k = 11. Before this, the adapter used vLLM's own V4 layout at block
256 (page 985,856 B, image 4,934,656 B, k = 6); those numbers are gone.

The tiny configuration is worked by hand in docs/adapters/deepseek-v4.md with
the same arithmetic as the comments here.
"""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch

from patchkit_deepseek_v4.adapters import ByteImageCopier, Sizing
from patchkit_deepseek_v4.adapters.deepseek_v4 import DeepseekV4Adapter, V4CheckpointSpec, V4Inputs, v4_checkpoint_spec
from patchkit_deepseek_v4.adapters.deepseek_v4_rows import RowSpace
from patchkit_deepseek_v4.adapters.deepseek_v4_state import split_over_planes, v4_state_fields

# The fields ATOM's layout reads, with the values of deepseek-ai/DeepSeek-V4-Flash's config.json:
# 43 layers + 1 MTP layer (num_nextn_predict_layers); compress_ratios lists 44 entries: 2 SWA-only (0),
# 21 CSA (4) alternating with 20 HCA (128), and a trailing 0 for the MTP layer; sliding_window 128;
# head_dim 512 with qk_rope_head_dim 64; index_head_dim 128 (the lightning indexer).
FLASH = dict(num_hidden_layers=43, num_nextn_predict_layers=1, compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0],
             sliding_window=128, head_dim=512, qk_rope_head_dim=64, index_head_dim=128)
# Small enough to work by hand: 4 layers + 1 MTP placeholder (the trailing 0); 2 CSA layers, so the
# interleaved rings leave padding rows an image skips.
TINY = dict(num_hidden_layers=4, num_nextn_predict_layers=1, compress_ratios=[0, 4, 128, 4, 0], sliding_window=8,
            head_dim=64, qk_rope_head_dim=16, index_head_dim=32)


def spec_of(cfg, **kw):
    return v4_checkpoint_spec(V4Inputs.from_hf(cfg, **kw))


# -- V4-Flash, fp8: ATOM's figures ---------------------------------------------

def test_flash_fp8_equals_atoms_native_spec():
    spec = spec_of(FLASH)
    assert spec.page_bytes == 531_712          # per 128-token block
    assert spec.image_bytes == 5_324_800
    assert spec.units_per_checkpoint == 11 == math.ceil(5_324_800 / 531_712)
    assert spec.slot_bytes == 16_711_680
    assert spec.page_unit_bytes == 531_584     # ATOM's PAGE unit, before the 256-B rounding


def test_flash_layer_mix_counts_the_mtp_placeholder():
    i = V4Inputs.from_hf(FLASH)
    assert (len(i.ratios), i.ratios.count(0), i.n_csa, i.n_hca) == (44, 3, 21, 20)


def test_flash_page_terms():
    rows = RowSpace(V4Inputs.from_hf(FLASH).ratios, ring=128, block_size=128, arena_rows=0)
    assert rows.envelope_rows == 20 * 1 + 21 * 32 == 692           # HCA: 128/128 rows, CSA: 128/4 rows per layer
    planes = 692 * (512 + 128)                                     # fp8 NoPE plane 512 B/row + bf16 RoPE 128 B/row
    indexer = 21 * 32 * (128 + 4)                                  # every CSA layer's indexer block
    assert (planes, indexer) == (442_880, 88_704)
    spec = spec_of(FLASH)
    assert spec.page_unit_bytes == planes + indexer == 531_584
    assert spec.page_bytes == 2077 * 256                           # 531,584 / 256 = 2076.5 -> rounded up


def test_flash_state_split_and_slot_rows():
    fields = v4_state_fields(n_csa=21, n_hca=20, head_dim=512, index_head_dim=128)
    assert [f.nbytes for f in fields] == [688_128, 688_128, 172_032, 172_032, 5_242_880, 5_242_880]
    per_plane, arena_rows = split_over_planes(fields, (512, 128))
    assert [[f.name for f in p] for p in per_plane] == [
        ["hca_main_kv", "hca_main_score"], ["csa_main_kv", "csa_main_score", "csa_idx_kv", "csa_idx_score"]]
    assert arena_rows == 10_485_760 // 512 == 20_480                 # the RoPE plane needs 1,720,320/128 = 13,440
    rows = RowSpace(V4Inputs.from_hf(FLASH).ratios, ring=128, block_size=128, arena_rows=arena_rows)
    assert rows.entry_rows == 44 * 128 == 5_632                    # ring 128 divides evenly: no interleave padding
    assert rows.slot_rows == 26_112 and spec_of(FLASH).slot_bytes == 26_112 * 640


def test_flash_image_segments():
    spec = spec_of(FLASH)
    carried = {s.name: s.nbytes for s in spec.image_segments()}
    assert carried == {"nope.rings.0": 5_632 * 512, "rope.csa_main_kv..csa_idx_score": 1_720_320,
                       "rope.rings.0": 5_632 * 128}
    assert sum(carried.values()) == 2_883_584 + 1_720_320 + 720_896 == spec.image_bytes
    left_out = {s.name: s.nbytes for s in spec.segments if not s.in_image}
    assert left_out == {"nope.hca_main_kv": 5_242_880, "nope.hca_main_score": 5_242_880}


def test_every_csa_indexer_block_is_in_the_page():
    # Each of the 21 CSA layers adds 32 rows of (index_head_dim + 4) B per block; without them page 442,880, k 13.
    wide, narrow = spec_of(FLASH), spec_of({**FLASH, "index_head_dim": 64})
    assert wide.page_unit_bytes - narrow.page_unit_bytes == 21 * 32 * 64
    no_csa = spec_of({**FLASH, "compress_ratios": [0 if r == 4 else r for r in FLASH["compress_ratios"]]})
    assert no_csa.page_unit_bytes == 20 * 640                      # HCA envelope rows only, no indexer


def test_the_mtp_placeholder_ring_is_in_the_slot_and_the_image():
    # ATOM carves over every listed ratio; cut to num_hidden_layers the image loses one ring (128 rows x 640 B), k 10.
    cut = spec_of({**FLASH, "compress_ratios": FLASH["compress_ratios"][:43]})
    assert spec_of(FLASH).image_bytes - cut.image_bytes == 128 * 640
    assert (cut.image_bytes, cut.units_per_checkpoint) == (5_242_880, 10)


def test_flash_bf16_and_speculation():
    bf16 = spec_of(FLASH, kv_fp8=False)                            # one bf16 plane of 1,024 B/row
    assert (bf16.page_unit_bytes, bf16.page_bytes) == (692 * 1024 + 88_704, 797_440)
    assert (bf16.slot_bytes, bf16.image_bytes, bf16.units_per_checkpoint) == (17_552 * 1024, 7_487_488, 10)
    mtp = spec_of(FLASH, spec_tokens=1)                            # ring 129; state rows 9 (CSA) and 129 (HCA)
    assert mtp.page_bytes == 531_712
    assert mtp.image_bytes == 44 * 129 * 640 + 21 * 9 * (2 * 1024 + 2 * 256) * 4 == 5_568_000
    assert (mtp.slot_bytes, mtp.units_per_checkpoint) == (26_936 * 640, 11)


def test_layout_id_is_atoms():
    spec = spec_of(FLASH)
    ratios = ",".join(map(str, FLASH["compress_ratios"]))
    assert spec.layout_id == (f"dsv4-paged-state-v3-plugin:block=128:ring=128:dims=512,64,128:main=fp8-2buff"
                              f":ratios={ratios}:nocopy=hca_main_kv,hca_main_score:entry=packed")
    assert spec_of(FLASH, kv_fp8=False).layout_id != spec.layout_id


# -- the tiny configuration, by hand (docs/adapters/deepseek-v4.md) ------------

def test_tiny_by_hand():
    i = V4Inputs.from_hf(TINY)
    spec = v4_checkpoint_spec(i)
    # planes: NoPE 64 B/row (fp8), RoPE 2 x 16 = 32 B/row (bf16): 96 B per row
    assert i.plane_widths == (64, 32)
    # page: envelope HCA 1 x 1 + CSA 2 x 32 = 65 rows x 96 = 6,240; indexer 2 x 32 x (32 + 4) = 2,304
    assert spec.page_unit_bytes == 65 * 96 + 2 * 32 * 36 == 8_544
    assert spec.page_bytes == 8_704                                # 34 x 256
    # state: CSA 4 fields 2 x 8 x (128|128|64|64) x 4 B = 24,576 B; HCA 2 fields 1 x 128 x 64 x 4 B = 65,536 B
    # HCA on the NoPE plane: 65,536 / 64 = 1,024 rows; CSA on the RoPE plane: 24,576 / 32 = 768 rows
    # rings (ring 8): dense 2 x 8 = 16 rows, HCA 8, CSA 2 layers at stride 32: 32 + 7 + 1 = 40 (16 reached)
    # slot: 1,024 + 64 = 1,088 rows x 96 = 104,448
    assert spec.slot_bytes == 1_088 * 96 == 104_448
    # image: rings 5 layers x 8 rows x 96 = 3,840, + CSA state 24,576
    assert spec.image_bytes == 5 * 8 * 96 + 24_576 == 28_416
    assert spec.units_per_checkpoint == math.ceil(28_416 / 8_544) == 4


def test_tiny_segments_leave_out_the_interleave_padding():
    spec = spec_of(TINY)
    assert [(s.name, s.offset, s.nbytes, s.in_image) for s in spec.segments] == [
        ("nope.hca_main_kv", 0, 32_768, False),
        ("nope.hca_main_score", 32_768, 32_768, False),
        ("nope.rings.0", 1_024 * 64, 32 * 64, True),               # rows 0..32 of the rings: dense, HCA, CSA run 0
        ("nope.rings.1", 1_080 * 64, 8 * 64, True),                # CSA layer 2's rows at 32 + 24; 24 rows between
        ("rope.csa_main_kv..csa_idx_score", 69_632, 24_576, True),  # the RoPE plane's share starts at 1,088 x 64
        ("rope.rings.0", 69_632 + 1_024 * 32, 32 * 32, True),
        ("rope.rings.1", 69_632 + 1_080 * 32, 8 * 32, True),
    ]


def test_tiny_bf16_by_hand():
    spec = spec_of(TINY, kv_fp8=False)
    # one plane of 2 x 64 = 128 B/row; state 90,112 B / 128 = 704 rows; slot (704 + 64) x 128
    assert (spec.page_unit_bytes, spec.page_bytes) == (65 * 128 + 2_304, 10_752)
    assert (spec.slot_bytes, spec.image_bytes, spec.units_per_checkpoint) == (98_304, 24_576 + 40 * 128, 3)


def test_rounding_to_256_only_when_needed():
    # no CSA layer: no indexer; envelope 2 HCA rows x 96 = 192 -> 256
    spec = spec_of({**TINY, "compress_ratios": [0, 128, 128]})
    assert (spec.page_unit_bytes, spec.page_bytes) == (192, 256)


def test_k_counts_page_units_as_atom_does():
    spec = V4CheckpointSpec(page_bytes=512, slot_bytes=2_000, image_bytes=1_010, layout_id="t", page_unit_bytes=500)
    assert spec.units_per_checkpoint == 3                          # ceil(1,010 / 500), not ceil(1,010 / 512) = 2


def test_absent_dims_take_atoms_defaults():
    bare = {"compress_ratios": FLASH["compress_ratios"]}
    assert spec_of(bare) == spec_of(FLASH)


@pytest.mark.parametrize("bad, match", [
    ({"compress_ratios": []}, "lacks compress_ratios"),
    ({"compress_ratios": [0, 4, 16, 4]}, "knows 0"),
    ({"compress_ratios": [0, 0]}, "pages nothing"),
])
def test_configs_the_layout_cannot_size_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        spec_of({**TINY, **bad})


def test_block_size_must_be_a_multiple_of_every_ratio():
    with pytest.raises(ValueError, match="not a multiple of compress ratios"):
        spec_of(TINY, block_size=64)


# -- the adapter ----------------------------------------------------------------

def _cfg(cache_dtype, spec=None, seqs=256):
    return NS(model_config=NS(hf_config=NS(**FLASH)), cache_config=NS(cache_dtype=cache_dtype),
              speculative_config=spec, scheduler_config=NS(max_num_seqs=seqs))


def test_adapter_reads_the_serve_options():
    v4 = DeepseekV4Adapter()
    assert v4.block_size == 128
    assert v4.inputs(_cfg("fp8_ds_mla")).kv_fp8 and v4.inputs(_cfg("fp8")).kv_fp8
    assert not v4.inputs(_cfg("auto")).kv_fp8
    assert v4.inputs(_cfg("fp8", NS(num_speculative_tokens=2))).ring == 130
    sizing = v4.sizing(_cfg("fp8"))
    assert (sizing.num_slots, sizing.k, sizing.page_bytes) == (256, 11, 531_712)
    assert sizing.withheld_blocks == math.ceil(256 * 16_711_680 / 531_712) == 8_047


def test_fp8_on_a_device_without_atoms_fp8_kernels_is_bf16():
    v4 = DeepseekV4Adapter(fp8_kv_supported=False)
    assert v4.checkpoint_spec(_cfg("fp8")) == spec_of(FLASH, kv_fp8=False)


def test_reference_copier_moves_exactly_the_image():
    spec = spec_of(TINY)
    sizing = Sizing(spec, block_size=128, num_slots=2)
    physical = 40                                                  # 25 withheld (ATOM's carve), 15 in the pool
    assert (sizing.withheld_blocks, sizing.withheld_for(physical)) == (24, 25)  # 24: 2 x 104,448 B / 8,704 B
    buf = torch.zeros(physical * spec.page_bytes, dtype=torch.uint8)
    copier = ByteImageCopier(buf, sizing, physical)
    base = sizing.slot_offset(physical, 1)
    buf[base:base + spec.slot_bytes] = torch.randint(1, 255, (spec.slot_bytes,), dtype=torch.uint8)
    before = buf[base:base + spec.slot_bytes].clone()
    copier.store(1, [1, 2, 3, 4])
    buf[base:base + spec.slot_bytes] = 0
    copier.restore([1, 2, 3, 4], 1)
    after = buf[base:base + spec.slot_bytes]
    for s in spec.segments:
        got, want = after[s.offset:s.offset + s.nbytes], before[s.offset:s.offset + s.nbytes]
        assert torch.equal(got, want) if s.in_image else not got.any(), s.name


# -- the blocks withheld: ATOM's carve (V4ImageSizing.usable_blocks) -------------

def _flash_sizing(slots=256):
    return Sizing(spec_of(FLASH), block_size=128, num_slots=slots)


def test_flash_withholds_atoms_carve_not_the_contiguous_count():
    sizing = _flash_sizing()
    page, slot = 531_712, 16_711_680
    # the protocol's contiguous count, kept as the lower bound, and ATOM's first guess (+256 B of slack)
    assert sizing.withheld_blocks == math.ceil(256 * slot / page) == 8_047
    assert math.ceil((256 * slot + 256) / page) == 8_047
    # ATOM then withholds one more block at a time until its planes and indexer pool fit
    assert sizing.withheld_for(20_000) == 8_068 and sizing.usable_blocks(20_000) == 11_932
    assert sizing.withheld_for(12_000) == 8_076 and sizing.usable_blocks(12_000) == 3_924
    assert DeepseekV4Adapter().sizing(_cfg("fp8")).withheld_for(20_000) == 8_068
    # no block count: the protocol's count
    assert sizing.spec.withheld_blocks(256) == 8_047


@pytest.mark.parametrize("physical", [12_000, 20_000])
def test_flash_carve_fits_and_one_block_more_would_not(physical):
    sizing = _flash_sizing()
    carve, usable = sizing.spec.carve, sizing.usable_blocks(physical)
    assert carve.carve_bytes(usable, 256) <= physical * 531_712 < carve.carve_bytes(usable + 1, 256)


def test_flash_carve_by_its_terms_at_20000():
    # 11,932 blocks: 11,932 x 692 = 8,256,944 envelope rows -> 317 slots of 26,112 rows (8,277,504 rows);
    # with the 256 slots each plane holds 573 x 26,112 = 14,962,176 rows (NoPE x 512 B, RoPE x 128 B);
    # the indexer pool 11,932 x 88,704 B; all 256-aligned already; + 255 B.
    carve = _flash_sizing().spec.carve
    assert carve.plane_rows(11_932, 256) == (256 + math.ceil(11_932 * 692 / 26_112)) * 26_112 == 573 * 26_112
    total = 573 * 26_112 * (512 + 128) + 11_932 * 88_704 + 255
    assert carve.carve_bytes(11_932, 256) == total <= 20_000 * 531_712 < carve.carve_bytes(11_933, 256)


def test_tiny_carve_by_hand():
    # TINY fp8, 2 slots (docs/adapters/deepseek-v4.md, "Blocks withheld"): page 8,704 B, slot 104,448 B =
    # 1,088 rows x (64 + 32) B, envelope 65 rows, indexer 2,304 B per block.
    sizing = Sizing(spec_of(TINY), block_size=128, num_slots=2)
    carve = sizing.spec.carve
    assert (carve.plane_widths, carve.envelope_rows, carve.slot_rows, carve.indexer_block_bytes) == \
        ((64, 32), 65, 1_088, 2_304)
    assert sizing.withheld_blocks == math.ceil(2 * 104_448 / 8_704) == 24
    # 100 physical blocks, 870,400 B: first guess 100 - ceil(209,152 / 8,704) = 100 - 25 = 75 blocks
    # 75 blocks: 4,875 rows -> 5 slots of rows; planes (2 + 5) x 1,088 = 7,616 rows x 96 B = 731,136 B,
    # indexer 75 x 2,304 = 172,800 B, + 255 = 904,191 B > 870,400 B: one less ... down to
    # 67 blocks: 4,355 rows > 4 x 1,088 = 4,352 -> still 5: 731,136 + 154,368 + 255 = 885,759 B: too big;
    # 66 blocks: 4,290 rows -> 4: (2 + 4) x 1,088 x 96 = 626,688 + 152,064 + 255 = 779,007 B: fits
    assert [carve.carve_bytes(n, 2) for n in (75, 67, 66)] == [904_191, 885_759, 779_007]
    assert (sizing.withheld_for(100), sizing.usable_blocks(100)) == (34, 66)
    # 91 blocks (792,064 B) already give those 66; 90 give 65 (first guess 90 - 25); 102 give 67 (885,759 B fits)
    assert [sizing.usable_blocks(p) for p in (90, 91, 101, 102)] == [65, 66, 66, 67]
    assert (sizing.physical_for(66), sizing.physical_for(67)) == (91, 102)      # contiguous: 90 and 91


def test_usable_never_decreases_with_the_physical_count():
    """What the KV-config hook's search for the minimum pool relies on."""
    for sizing in (Sizing(spec_of(TINY), 128, 2), Sizing(spec_of(TINY, kv_fp8=False), 128, 32), _flash_sizing(8)):
        usable = [sizing.usable_blocks(p) for p in range(0, 1_200)]
        assert all(b >= a for a, b in zip(usable, usable[1:]))
        assert all(sizing.withheld_for(p) >= sizing.withheld_blocks for p in range(0, 1_200) if usable[p] > 0)


def test_slots_stay_in_the_withheld_tail():
    # The protocol's contiguous slot placement still lies inside the allocation with the carve's tail.
    for sizing, physical in ((_flash_sizing(), 12_000), (Sizing(spec_of(TINY), 128, 2), 100)):
        end = sizing.slot_offset(physical, sizing.num_slots - 1) + sizing.spec.slot_bytes
        assert sizing.usable_blocks(physical) * sizing.page_bytes == sizing.slot_offset(physical, 0)
        assert end <= physical * sizing.page_bytes


def test_standin_bf16_figure_is_unchanged():
    # TINY bf16 at 32 slots, 2,048 blocks (tests/e2e/test_stateful_standin_e2e.py): ATOM's carve = 293 = contiguous.
    sizing = Sizing(spec_of(TINY, kv_fp8=False), 128, 32)
    assert sizing.withheld_blocks == sizing.withheld_for(2_048) == 293


def test_a_spec_without_a_carve_keeps_the_contiguous_count():
    spec = V4CheckpointSpec(page_bytes=512, slot_bytes=2_000, image_bytes=1_010, layout_id="t", page_unit_bytes=500)
    assert Sizing(spec, 128, 3).withheld_for(100) == math.ceil(6_000 / 512) == 12

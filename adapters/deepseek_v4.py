"""DeepSeek-V4 adapter: the plugin's (ATOM's) own checkpoint spec, from the checkpoint's config.json.

The adapter exists to supply the spec ATOM's native checkpoint uses, so every
number here is computed the way ROCm/ATOM computes it
(``atom/plugin/vllm/deepseek_v4_image.py: v4_image_sizing``), at ATOM's block
of 128 tokens. docs/adapters/deepseek-v4.md has the formulas, where each fact
comes from, and worked numbers; tests/adapters/test_deepseek_v4.py pins them.

In short (``w_p``: the planes' row widths, fp8: ``[D, 2R]``, bf16: ``[2D]``):

* **page** = ``round_up(envelope_rows * sum(w_p) + n_csa * (B/4) * (Di + 4), 256)``
  -- one block's compressed rows in every plane plus every CSA layer's
  indexer block; the unrounded sum is ATOM's PAGE unit;
* **slot** = ``slot_rows * sum(w_p)`` -- compressor state (split over the
  planes) and every layer's sliding-window ring;
* **image** = per plane, the carried state (CSA compressors) + the ring rows
  any position reaches (``layers * ring`` rows, interleave padding left out);
* **k** = ``ceil(image / PAGE unit)`` (ATOM's ``units_per_checkpoint``);
* **withheld** at ``physical`` blocks = ATOM's carve (``V4ImageSizing.usable_blocks``):
  ``ceil((slots * slot + 256) / page)`` and then one more at a time until the planes
  (block region rounded up to whole slots of rows) and the indexer pool fit
  (``deepseek_v4_rows.PlaneCarve``; ``V4CheckpointSpec.withheld_blocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .deepseek_v4_rows import CSA_RATIO, HCA_RATIO, PlaneCarve, RowSpace
from .deepseek_v4_state import carried_runs, extents, split_over_planes, v4_state_fields
from .protocol import CheckpointSpec, ModelAdapter, Placement, Segment, round_up

#: ATOM's V4 block (``ATOM_DEEPSEEK_V4_BLOCK_SIZE`` / ``_V4_IMAGE_BLOCK_SIZE``).
BLOCK_SIZE = 128
#: vLLM prices a block at the PAGE unit rounded up to this (``_V4_PROXY_ALIGNMENT``).
PAGE_ALIGN = 256
#: Per indexer row: ``index_head_dim`` fp8 bytes + one fp32 scale (bridge ``_index_row_bytes``).
INDEX_SCALE_BYTES = 4
PROXY_LAYER_NAME = "model.layers.0.atom_deepseek_v4_proxy"
IMAGE_LAYER_SUFFIX = "atom_deepseek_v4_image"
#: The MTP draft model's own proxy (``model.layers.{num_hidden_layers}.<suffix>``, bridge
#: ``deepseek_v4_draft_proxy_layer_name``): its tensor carves its own slots from its own tail.
DRAFT_PROXY_LAYER_SUFFIX = "atom_deepseek_v4_draft_proxy"
ARCHITECTURES = ("DeepseekV4ForCausalLM",)
#: ATOM's ``_V4_IMAGE_LAYOUT_PREFIX``: an image is only restored into the same layout.
LAYOUT_PREFIX = "dsv4-paged-state-v3-plugin"
#: config.json fields ATOM reads with a default when absent (``getattr(hf, name, default)``).
NATIVE_DEFAULTS = {"sliding_window": 128, "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}


def _field(hf: Any, name: str) -> Any:
    return hf.get(name) if isinstance(hf, Mapping) else getattr(hf, name, None)


@dataclass(frozen=True)
class V4CheckpointSpec(CheckpointSpec):
    """The protocol's spec plus ATOM's PAGE unit and carve.

    An image is cut into units of ``page_unit_bytes`` (one block's carve, before the 256-B
    rounding), so k counts those. ``carve`` is how ATOM cuts an allocation into its planes
    and indexer pool; with it, the blocks withheld at a physical block count are ATOM's
    (``withheld_blocks``), not the protocol's contiguous ``ceil(slots * slot / page)``.
    """

    page_unit_bytes: int = 0
    carve: Optional[PlaneCarve] = None

    @property
    def units_per_checkpoint(self) -> int:
        return math.ceil(self.image_bytes / (self.page_unit_bytes or self.page_bytes))

    def withheld_blocks(self, num_slots: int, physical_blocks: Optional[int] = None) -> int:
        """ATOM's count (``V4ImageSizing.usable_blocks`` over ``carve_bytes``; see
        ``deepseek_v4_rows.PlaneCarve``): ``ceil((slots * slot + 256) / page)``, then one more
        block at a time while the carve of the remaining blocks does not fit in
        ``physical * page``. Without a block count (or a carve): the protocol's lower bound."""
        if physical_blocks is None or self.carve is None:
            return super().withheld_blocks(num_slots, physical_blocks)
        return self.carve.withheld_blocks(physical_blocks, num_slots, self.page_bytes, self.slot_bytes)


@dataclass(frozen=True)
class V4Inputs:
    """What ATOM's V4 layout reads: config.json fields, two serve options, the block."""

    ratios: tuple[int, ...]
    window: int = NATIVE_DEFAULTS["sliding_window"]
    head_dim: int = NATIVE_DEFAULTS["head_dim"]
    rope_head_dim: int = NATIVE_DEFAULTS["qk_rope_head_dim"]
    index_head_dim: int = NATIVE_DEFAULTS["index_head_dim"]
    kv_fp8: bool = True
    spec_tokens: int = 0
    block_size: int = BLOCK_SIZE

    @classmethod
    def from_hf(cls, hf: Any, *, kv_fp8: bool = True, spec_tokens: int = 0,
                block_size: int = BLOCK_SIZE) -> "V4Inputs":
        listed = _field(hf, "compress_ratios")
        if not listed:
            raise ValueError("DeepSeek-V4 config lacks compress_ratios; cannot size its state slot")
        dims = {name: int(default if _field(hf, name) is None else _field(hf, name))
                for name, default in NATIVE_DEFAULTS.items()}
        return cls(
            ratios=tuple(int(r) for r in listed),  # every entry, the MTP placeholder included
            window=dims["sliding_window"],
            head_dim=dims["head_dim"],
            rope_head_dim=dims["qk_rope_head_dim"],
            index_head_dim=dims["index_head_dim"],
            kv_fp8=kv_fp8,
            spec_tokens=int(spec_tokens),
            block_size=block_size,
        )

    @property
    def ring(self) -> int:
        """Sliding-window rows per layer: the window plus the draft lookahead."""
        return self.window + self.spec_tokens

    @property
    def n_csa(self) -> int:
        return self.ratios.count(CSA_RATIO)

    @property
    def n_hca(self) -> int:
        return self.ratios.count(HCA_RATIO)

    @property
    def plane_widths(self) -> tuple[int, ...]:
        """Bytes per row of each plane: fp8 NoPE (D) + bf16 RoPE (2R), or one bf16 plane (2D)."""
        return (self.head_dim, 2 * self.rope_head_dim) if self.kv_fp8 else (2 * self.head_dim,)

    @property
    def plane_names(self) -> tuple[str, ...]:
        return ("nope", "rope") if self.kv_fp8 else ("kv",)

    @property
    def index_row_bytes(self) -> int:
        return self.index_head_dim + INDEX_SCALE_BYTES

    @property
    def indexer_block_bytes(self) -> int:
        """Every CSA layer's indexer keys for one block: B/4 rows each."""
        return self.n_csa * (self.block_size // CSA_RATIO) * self.index_row_bytes


def v4_checkpoint_spec(inputs: V4Inputs) -> V4CheckpointSpec:
    """Page, slot, image and segments of ATOM's DeepSeek-V4 layout for these inputs."""
    fields = v4_state_fields(inputs.n_csa, inputs.n_hca, inputs.head_dim, inputs.index_head_dim,
                             inputs.spec_tokens)
    per_plane, arena_rows = split_over_planes(fields, inputs.plane_widths)
    rows = RowSpace(inputs.ratios, inputs.ring, inputs.block_size, arena_rows)
    widths = inputs.plane_widths
    page_unit = rows.envelope_rows * sum(widths) + inputs.indexer_block_bytes
    if rows.envelope_rows == 0:
        raise ValueError("a DeepSeek-V4 config with no compressed layer pages nothing; no proxy to size")

    # The slot as one logical range: each plane's share of it, planes in order.
    segments, base = [], 0
    for plane, fs, width in zip(inputs.plane_names, per_plane, widths):
        for offset, nbytes, name in carried_runs(fs):
            segments.append(Segment(f"{plane}.{name}", base + offset, nbytes, True))
        segments += [Segment(f"{plane}.{f.name}", base + s, e - s, False)
                     for f, s, e in extents(fs) if not f.in_image and e > s]
        for i, (start, count) in enumerate(rows.window_runs()):
            segments.append(Segment(f"{plane}.rings.{i}", base + start * width, count * width, True))
        base += rows.slot_rows * width
    segments.sort(key=lambda s: s.offset)
    image = sum(s.nbytes for s in segments if s.in_image)
    nocopy = ",".join(f.name for fs in per_plane for f in fs if not f.in_image)
    layout_id = (f"{LAYOUT_PREFIX}:block={inputs.block_size}:ring={inputs.ring}"
                 f":dims={inputs.head_dim},{inputs.rope_head_dim},{inputs.index_head_dim}"
                 f":main={'fp8-2buff' if inputs.kv_fp8 else 'bf16'}"
                 f":ratios={','.join(map(str, inputs.ratios))}:nocopy={nocopy}:entry=packed")
    carve = PlaneCarve(plane_widths=tuple(widths), envelope_rows=rows.envelope_rows, slot_rows=rows.slot_rows,
                       indexer_block_bytes=inputs.indexer_block_bytes)
    return V4CheckpointSpec(page_bytes=round_up(page_unit, PAGE_ALIGN), slot_bytes=base, image_bytes=image,
                            layout_id=layout_id, segments=tuple(segments), page_unit_bytes=page_unit, carve=carve)


class DeepseekV4Adapter(ModelAdapter):
    """The plugin's DeepseekV4ForCausalLM, served out of tree behind one proxy layer.

    Explicit arguments (native defaults): ``block_size=128`` (ATOM's V4 block);
    ``fp8_kv_supported=True``: ATOM runs its fp8 ("2buff") KV only on gfx950 /
    gfx1250 and falls back to bf16 elsewhere, a device fact config.json does not
    hold -- pass ``False`` for a plugin serving fp8-requested KV as bf16.
    """

    name = "DeepSeek-V4"
    architectures = ARCHITECTURES
    served_by = "out_of_tree"
    proxy_layer_name = PROXY_LAYER_NAME
    image_layer_suffix = IMAGE_LAYER_SUFFIX
    block_size = BLOCK_SIZE
    fp8_kv_supported: bool = True
    draft_proxy_layer_suffix = DRAFT_PROXY_LAYER_SUFFIX
    #: ATOM's ``Config`` defaults: ``state_checkpoint_interval_tokens=8192``, ``state_checkpoint_demand=True``.
    placement_defaults = Placement(interval_tokens=8192, demand=True, max_images_per_request=2,
                                   images_per_boundary=1)

    def inputs(self, vllm_config: Any) -> V4Inputs:
        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
        spec = getattr(vllm_config, "speculative_config", None)
        return V4Inputs.from_hf(
            vllm_config.model_config.hf_config,
            kv_fp8=cache_dtype.startswith("fp8") and self.fp8_kv_supported,
            spec_tokens=int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0,
            block_size=self.block_size,
        )

    def checkpoint_spec(self, vllm_config: Any) -> CheckpointSpec:
        return v4_checkpoint_spec(self.inputs(vllm_config))

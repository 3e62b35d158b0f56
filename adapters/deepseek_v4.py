"""DeepSeek-V4 adapter: the plugin's V4 state slot, its checkpoint image, and the proxy's real page.

The formula below is derived from vLLM 0.31's own DeepSeek-V4 implementation
(``vllm/models/deepseek_v4/attention.py`` and ``compressor.py``,
``vllm/v1/attention/backends/mla/sparse_swa.py``), which allocates the same state
as paged vLLM caches; the plugin (ATOM) keeps the windowed parts in one fixed
slot per request instead. docs/adapters/deepseek-v4.md explains it with worked
numbers; tests/adapters/test_deepseek_v4.py pins them.

Inputs (Hugging Face ``config.json`` of the checkpoint, plus the serve options):

=========================  =====  ==============================================
config field / option      sym    meaning
=========================  =====  ==============================================
num_hidden_layers          N      main layers (entries of compress_ratios past N
                                  are MTP placeholders and are ignored)
compress_ratios[:N]        r_i    0/1 sliding-window only; 4 CSA (overlapping
                                  compressor + indexer); 128 HCA
sliding_window             W      ring rows per layer
head_dim                   D      compressed KV entry width (512)
qk_rope_head_dim           R      RoPE part of an entry (64)
index_head_dim             Di     indexer key width (128), CSA layers only
num_nextn_predict_layers   M      MTP layers, counted only with --speculative-config
--kv-cache-dtype fp8*      fp8    packed fp8 entries, else bf16
--speculative-config       s      num_speculative_tokens (0 without)
--max-num-seqs             S      slots (one per running request)
block size (adapter)       B      256 tokens, a multiple of every r_i
=========================  =====  ==============================================

Per-entry bytes (vLLM's ``DeepseekV4SWACache``/``MLAAttentionSpec`` packing):
``E = (D-R) + 2R + round_up(ceil((D-R)/64), 8)`` with fp8 (448 + 128 + 8 = 584),
``E = 2D`` with bf16. Indexer row: ``I = Di + 4*ceil(Di/128)`` (132).

Compressor tail of one compressor of width ``d`` at ratio ``r``
(``CompressorStateCache``): ``coff*r`` rows of ``2*coff*d`` fp32 (kv state and
score state), ``coff = 2`` when ``r == 4`` (overlapping windows), else 1.
CSA layers have two compressors (main ``d = D``, indexer ``d = Di``), HCA one.

* **slot** = rings ``(N + M) * (W + s) * E`` + every layer's compressor tails,
  each segment rounded up to 256 B;
* **image** = the rings + the CSA tails. An image sits on a block boundary;
  ``B`` is a multiple of 128, so an HCA compressor (no overlap) has no partial
  group there and its tail carries nothing; a CSA compressor's overlap reaches
  back one full group, so its whole window is carried;
* **page** (the proxy's real bytes per block) = for each main layer with
  ``r > 1``: ``(B/r) * E``, plus ``(B/4) * I`` on CSA layers; the sum rounded up
  to 256 B. Sliding-window-only layers page nothing (their ring is in the slot).

Then ``k = ceil(image / page)`` image groups and ``ceil(S * slot / page)``
blocks withheld.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from .protocol import CheckpointSpec, ModelAdapter, Placement, round_up

BLOCK_SIZE = 256
PAGE_ALIGN = 256
PROXY_LAYER_NAME = "model.layers.0.atom_deepseek_v4_proxy"
IMAGE_LAYER_SUFFIX = "atom_deepseek_v4_image"
ARCHITECTURES = ("DeepseekV4ForCausalLM",)
LAYOUT_PREFIX = "dsv4-slot-v1"


def _field(hf: Any, name: str) -> Any:
    if isinstance(hf, Mapping):
        return hf.get(name)
    return getattr(hf, name, None)


@dataclass(frozen=True)
class V4Inputs:
    """The configuration values the formula reads (see the module docstring)."""

    ratios: tuple[int, ...]
    window: int
    head_dim: int
    rope_head_dim: int
    index_head_dim: int
    kv_fp8: bool = True
    spec_tokens: int = 0
    mtp_layers: int = 0
    block_size: int = BLOCK_SIZE

    @classmethod
    def from_hf(cls, hf: Any, *, kv_fp8: bool = True, spec_tokens: int = 0, with_mtp: bool = False,
                block_size: int = BLOCK_SIZE) -> "V4Inputs":
        required = ("num_hidden_layers", "compress_ratios", "sliding_window", "head_dim", "qk_rope_head_dim")
        missing = [n for n in required if _field(hf, n) is None]
        if missing:
            raise ValueError(f"DeepSeek-V4 config lacks {', '.join(missing)}; cannot size its state slot")
        n = int(_field(hf, "num_hidden_layers"))
        listed = [int(r) for r in _field(hf, "compress_ratios")]
        if len(listed) < n:
            raise ValueError(f"compress_ratios lists {len(listed)} layers, num_hidden_layers is {n}")
        ratios = tuple(max(1, r) for r in listed[:n])  # as vLLM: max(1, compress_ratios[layer])
        index_head_dim = _field(hf, "index_head_dim")
        if index_head_dim is None and 4 in ratios:
            raise ValueError("DeepSeek-V4 config has CSA layers (ratio 4) but no index_head_dim")
        return cls(
            ratios=ratios,
            window=int(_field(hf, "sliding_window")),
            head_dim=int(_field(hf, "head_dim")),
            rope_head_dim=int(_field(hf, "qk_rope_head_dim")),
            index_head_dim=int(index_head_dim or 0),
            kv_fp8=kv_fp8,
            spec_tokens=int(spec_tokens),
            mtp_layers=int(_field(hf, "num_nextn_predict_layers") or 0) if with_mtp else 0,
            block_size=block_size,
        )

    # -- the pieces of the formula ------------------------------------------
    @property
    def entry_bytes(self) -> int:
        """E: one compressed KV entry (one ring row)."""
        d, r = self.head_dim, self.rope_head_dim
        if self.kv_fp8:
            nope = d - r
            return nope + 2 * r + round_up(-(-nope // 64), 8)
        return 2 * d

    @property
    def index_row_bytes(self) -> int:
        """I: one indexer key (fp8 values + one fp32 scale per 128)."""
        di = self.index_head_dim
        return di + 4 * -(-di // 128)

    @staticmethod
    def tail_bytes(ratio: int, width: int) -> int:
        """One compressor's tail: coff*r rows of 2*coff*width fp32."""
        coff = 2 if ratio == 4 else 1
        return (coff * ratio) * (2 * coff * width) * 4

    def paged_bytes_per_block(self, ratio: int) -> int:
        if ratio <= 1:
            return 0
        b = (self.block_size // ratio) * self.entry_bytes
        if ratio == 4:
            b += (self.block_size // 4) * self.index_row_bytes
        return b

    def check(self) -> None:
        odd = sorted({r for r in self.ratios if r > 1 and self.block_size % r})
        if odd:
            raise ValueError(f"block size {self.block_size} is not a multiple of compress ratios {odd}")
        unknown = sorted({r for r in self.ratios if r not in (1, 4, 128)})
        if unknown:
            raise ValueError(f"compress ratios {unknown}: the V4 formula knows 0/1 (SWA), 4 (CSA), 128 (HCA)")

    def layout_id(self) -> str:
        digest = hashlib.sha256(",".join(map(str, self.ratios)).encode()).hexdigest()[:8]
        return (f"{LAYOUT_PREFIX}:block={self.block_size}:ring={self.window + self.spec_tokens}"
                f":dims={self.head_dim},{self.rope_head_dim},{self.index_head_dim}"
                f":kv={'fp8' if self.kv_fp8 else 'bf16'}:layers={len(self.ratios)}+{self.mtp_layers}"
                f":ratios={digest}")


def v4_checkpoint_spec(inputs: V4Inputs) -> CheckpointSpec:
    """Slot, image and page of the plugin's DeepSeek-V4 for these inputs (formula above)."""
    inputs.check()
    rows = inputs.window + inputs.spec_tokens
    parts: list[tuple[str, int, bool]] = []
    layers = list(inputs.ratios) + [1] * inputs.mtp_layers
    for i, _ in enumerate(layers):
        parts.append((f"ring.{i}", rows * inputs.entry_bytes, True))
    for i, r in enumerate(inputs.ratios):
        if r == 4:
            parts.append((f"csa_tail.{i}", V4Inputs.tail_bytes(r, inputs.head_dim), True))
            parts.append((f"csa_index_tail.{i}", V4Inputs.tail_bytes(r, inputs.index_head_dim), True))
    for i, r in enumerate(inputs.ratios):
        if r > 4:
            parts.append((f"hca_tail.{i}", V4Inputs.tail_bytes(r, inputs.head_dim), False))
    page = round_up(sum(inputs.paged_bytes_per_block(r) for r in inputs.ratios), PAGE_ALIGN)
    if page == 0:
        raise ValueError("a DeepSeek-V4 config with no compressed layer pages nothing; no proxy to size")
    return CheckpointSpec.from_segments(page, inputs.layout_id(), parts)


class DeepseekV4Adapter(ModelAdapter):
    """The plugin's DeepseekV4ForCausalLM, served out of tree behind one proxy layer."""

    name = "DeepSeek-V4"
    architectures = ARCHITECTURES
    served_by = "out_of_tree"
    proxy_layer_name = PROXY_LAYER_NAME
    image_layer_suffix = IMAGE_LAYER_SUFFIX
    block_size = BLOCK_SIZE
    placement_defaults = Placement(interval_tokens=8192, anchor="prompt_end",
                                   max_images_per_request=2, images_per_boundary=1)

    def inputs(self, vllm_config: Any) -> V4Inputs:
        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
        spec = getattr(vllm_config, "speculative_config", None)
        return V4Inputs.from_hf(
            vllm_config.model_config.hf_config,
            kv_fp8=cache_dtype.startswith("fp8"),
            spec_tokens=int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0,
            with_mtp=spec is not None,
            block_size=self.block_size,
        )

    def checkpoint_spec(self, vllm_config: Any) -> CheckpointSpec:
        return v4_checkpoint_spec(self.inputs(vllm_config))

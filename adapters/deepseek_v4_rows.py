"""DeepSeek-V4's row space as the plugin (ATOM) carves it, in rows rather than bytes.

ATOM keeps V4's paged history and every request's state in the same planes
(``atom/model_ops/attentions/pool_layout/v4_pool_geometry.py``). A row is one
token's KV at one layer; a plane materializes every row at its own width, so
row counts are shared by all planes and only the bytes differ. Two regions:

* an **envelope** per block: ``block_size / ratio`` compressed rows for every
  layer of a compressed class (HCA first, then CSA: descending ratio);
* a **slot** per request: the compressor state first (``arena_rows``), then the
  sliding-window **entry**: every layer's ring, dense layers first, then the
  compressed classes in envelope order. Within a class the rings are cut into
  runs of ``ring_stride`` rows interleaved across the class's layers, so one
  index formula serves every layer; the rows no (layer, position) reaches are
  padding a checkpoint image leaves out.

Ratios are the checkpoint's ``compress_ratios`` as listed, MTP placeholder
included: ATOM's slot carries the draft layer's ring too.

``PlaneCarve`` is how those rows become bytes of one allocation (every plane,
then the CSA indexer pool) and so how many blocks the pool gets: the blocks
withheld for the slots.
"""

from __future__ import annotations

from dataclasses import dataclass

DENSE_RATIO = 0
CSA_RATIO = 4
HCA_RATIO = 128
#: A slot's row count is rounded up to this (v4_pool_geometry: ``slot_align_rows``).
SLOT_ALIGN_ROWS = 2


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def merge_runs(runs) -> list[tuple[int, int]]:
    """``(start, count)`` runs in ascending order, the ones that touch joined."""
    merged: list[tuple[int, int]] = []
    for start, count in runs:
        if merged and merged[-1][0] + merged[-1][1] == start:
            merged[-1] = (merged[-1][0], merged[-1][1] + count)
        else:
            merged.append((start, count))
    return merged


@dataclass(frozen=True)
class RingClass:
    """One class's rings inside the entry: ``layers`` rings of ``ring`` rows."""

    ratio: int
    layers: int
    ring_stride: int
    ring: int
    entry_offset: int

    @property
    def entry_rows(self) -> int:
        """Rows the interleaved rings reach up to: the last layer at the last position."""
        chunk, within = divmod(self.ring - 1, self.ring_stride)
        return (self.layers - 1) * self.ring_stride + chunk * self.layers * self.ring_stride + within + 1

    def reached_runs(self) -> list[tuple[int, int]]:
        """Entry rows some (layer, position) reaches; the rest is interleave padding."""
        run_rows = self.layers * self.ring_stride
        whole, partial = divmod(self.ring, self.ring_stride)
        runs = [(self.entry_offset, whole * run_rows)] if whole else []
        base = self.entry_offset + whole * run_rows
        runs += [(base + i * self.ring_stride, partial) for i in range(self.layers)] if partial else []
        return runs


@dataclass(frozen=True)
class RowSpace:
    """Rows of one block's envelope and of one request's slot."""

    ratios: tuple[int, ...]
    ring: int
    block_size: int
    arena_rows: int

    def __post_init__(self) -> None:
        unknown = sorted({r for r in self.ratios if r not in (DENSE_RATIO, CSA_RATIO, HCA_RATIO)})
        if unknown:
            raise ValueError(f"compress ratios {unknown}: the plugin's V4 layout knows 0 (dense), "
                             f"{CSA_RATIO} (CSA) and {HCA_RATIO} (HCA)")
        ragged = sorted({r for r in self.ratios if r and self.block_size % r})
        if ragged:
            raise ValueError(f"block size {self.block_size} is not a multiple of compress ratios {ragged}")
        if self.ring < 1:
            raise ValueError(f"a sliding-window ring of {self.ring} rows")

    def layers_of(self, ratio: int) -> int:
        return sum(1 for r in self.ratios if r == ratio)

    @property
    def compressed_order(self) -> tuple[int, ...]:
        """Envelope order: fewest rows per layer first (HCA, then CSA)."""
        return tuple(sorted({r for r in self.ratios if r != DENSE_RATIO}, reverse=True))

    @property
    def envelope_rows(self) -> int:
        """Compressed rows one block adds across every compressed layer."""
        return sum(self.layers_of(r) * (self.block_size // r) for r in self.compressed_order)

    def ring_classes(self) -> list[RingClass]:
        classes, offset = [], 0
        for ratio in (DENSE_RATIO,) + self.compressed_order:
            layers = self.layers_of(ratio)
            if not layers:
                continue
            stride = self.ring if ratio == DENSE_RATIO else self.block_size // ratio
            cls = RingClass(ratio, layers, stride, self.ring, offset)
            classes.append(cls)
            offset += cls.entry_rows
        return classes

    @property
    def entry_rows(self) -> int:
        return sum(c.entry_rows for c in self.ring_classes())

    @property
    def slot_rows(self) -> int:
        """Compressor state + rings, rounded so every slot starts on an even row."""
        return _round_up(self.arena_rows + self.entry_rows, SLOT_ALIGN_ROWS)

    def window_runs(self) -> list[tuple[int, int]]:
        """Slot rows of every ring position (after the state), merged: what an image carries."""
        runs = [run for c in self.ring_classes() for run in c.reached_runs()]
        return [(self.arena_rows + s, n) for s, n in merge_runs(runs)]


#: Regions of the carve start on, and its total ends on, this many bytes (entry_arena ``_ALIGN``);
#: also ATOM's ``_V4_PROXY_ALIGNMENT``, the slack a packed allocation may start off it by.
REGION_ALIGN = 256


@dataclass(frozen=True)
class PlaneCarve:
    """How the plugin (ATOM) cuts one KV allocation into its planes and its indexer pool.

    Facts from ROCm/ATOM, in our own words (``atom/plugin/vllm/deepseek_v4_image.py``:
    ``V4ImageSizing.carve_bytes`` and ``V4ImageSizing.usable_blocks``; the plane's rows are
    ``UnifiedPoolGeometry.plane_rows`` in ``pool_layout/v4_pool_geometry.py``, the packing
    ``plan_regions`` in ``pool_layout/entry_arena.py``):

    * every **plane** holds the blocks' envelopes at the bottom and the slots at the top,
      in one row numbering: ``plane_rows = (slots + ceil(blocks * envelope_rows / slot_rows))
      * slot_rows`` -- the block region is rounded up to whole slots of rows;
    * the **regions** -- each plane (``plane_rows * width``), then the CSA indexer pool
      (``blocks * indexer_block_bytes``) -- are packed back to back, each start and the total
      rounded up to 256 B; the carve takes that total + 255 B (the allocation may start off
      the 256-B boundary);
    * the pool gets ``usable`` blocks: first ``physical - ceil((slots * slot + 256) / page)``,
      then one less at a time while the carve of ``usable`` blocks exceeds ``physical * page``
      (never below 0). ``withheld = physical - usable``.

    Usable blocks never decrease as the physical count grows (the carve grows with the block
    count; the budget with the physical count), which the KV-config hook's search relies on.
    """

    plane_widths: tuple[int, ...]
    envelope_rows: int
    slot_rows: int
    indexer_block_bytes: int

    def plane_rows(self, num_blocks: int, num_slots: int) -> int:
        block_rows = num_blocks * self.envelope_rows
        return (num_slots + -(-block_rows // self.slot_rows)) * self.slot_rows

    def regions(self, num_blocks: int, num_slots: int) -> list[int]:
        """Bytes of each region, in carve order: every plane, then the indexer pool."""
        rows = self.plane_rows(num_blocks, num_slots)
        return [rows * w for w in self.plane_widths] + [num_blocks * self.indexer_block_bytes]

    def carve_bytes(self, num_blocks: int, num_slots: int) -> int:
        """Bytes the carve of ``num_blocks`` pool blocks and ``num_slots`` slots takes."""
        end = 0
        for nbytes in self.regions(num_blocks, num_slots):
            end = _round_up(end, REGION_ALIGN) + nbytes
        return _round_up(end, REGION_ALIGN) + REGION_ALIGN - 1

    def usable_blocks(self, physical_blocks: int, num_slots: int, page_bytes: int, slot_bytes: int) -> int:
        budget = int(physical_blocks) * page_bytes
        usable = int(physical_blocks) - -(-(num_slots * slot_bytes + REGION_ALIGN) // page_bytes)
        while usable > 0 and self.carve_bytes(usable, num_slots) > budget:
            usable -= 1
        return max(usable, 0)

    def withheld_blocks(self, physical_blocks: int, num_slots: int, page_bytes: int, slot_bytes: int) -> int:
        return int(physical_blocks) - self.usable_blocks(physical_blocks, num_slots, page_bytes, slot_bytes)

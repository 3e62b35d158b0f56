"""The adapter protocol: what a model family supplies so vLLM can size and cache its state slots.

Some models keep, beside vLLM's paged history, a fixed state per running request
that no hashed block holds (DeepSeek-V4: a sliding-window ring and compressor
tails). A plugin serving such a model shows vLLM

* one opaque **proxy** attention layer for the paged history, priced at the
  model's real bytes per block (all of its layers' pages for one block);
* ``k`` single-layer Mamba-style **image** layers (``MambaSpec`` in ``align``
  mode, one vLLM group each, sharing the proxy's pool): ``k`` blocks hold one
  checkpoint *image* of a request's slot, filed under the prefix hash so a later
  prefix hit can restore the slot instead of recomputing;
* per-request **state slots**, carved from the tail of the same allocation and
  withheld from vLLM's block pool.

An adapter says all of that for one family: which model it is (exact
architecture and served by the plugin), the proxy layer name, the block size,
the checkpoint spec (slot bytes, image bytes, bytes per block) and the sizing
derived from it (``k = ceil(image bytes / bytes per block)``, blocks withheld),
the image layer names, where images go (placement defaults) and how an image is
copied (the copier). The KV-config hook (``patches/kv_config_hook``) and the
scheduler side read only this protocol, never a model's code.

Traps, next to the API that has them:

* the bytes per block are the *proxy's real* page, not vLLM's page of any one
  layer; image layers must be priced the same, or vLLM cannot put them in one
  pool;
* the slot area is withheld as a *tail* of the allocation: vLLM's pool gets
  ``physical - withheld`` blocks, the tensors still cover all ``physical``
  blocks, and slot ``i`` starts at byte ``(physical - withheld) * page + i * slot``;
  ``withheld`` is the spec's count for that ``physical``
  (``CheckpointSpec.withheld_blocks(slots, physical)``, ``Sizing.withheld_for``):
  the contiguous ``ceil(slots * slot / page)`` unless the model's layout carves more
  (DeepSeek-V4: ATOM's planes), so size with the physical count, not the lower bound;
* an image group holds two working blocks per request (the running image and the
  previous one), with or without async scheduling (the image-publish release pass
  frees older ones itself), whether or not images are published: an interval of 0
  publishes nothing but the groups still allocate.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

#: Env vars (declared in patches/kv_config_hook.yaml and image_publish.yaml) overriding the placement.
INTERVAL_ENV = "VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS"
DEMAND_ENV = "VLLM_PATCHKIT_IMAGE_DEMAND"

#: Every slot segment starts on this many bytes (DMA- and vector-friendly).
SEGMENT_ALIGN = 256


def round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


@dataclass(frozen=True)
class Segment:
    """One named byte range of a state slot; ``in_image`` if a checkpoint carries it."""

    name: str
    offset: int
    nbytes: int
    in_image: bool


@dataclass(frozen=True)
class CheckpointSpec:
    """What one request's state slot and one checkpoint image of it look like.

    ``page_bytes`` is the proxy's real bytes per vLLM block (one block of paged
    history for every layer of the model); ``slot_bytes`` one request's slot;
    ``image_bytes`` the part of the slot an image carries (the segments marked
    ``in_image``, in order). ``layout_id`` names the byte layout, so images of a
    different layout are never restored.
    """

    page_bytes: int
    slot_bytes: int
    image_bytes: int
    layout_id: str
    segments: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        if self.page_bytes <= 0 or self.slot_bytes <= 0 or self.image_bytes <= 0:
            raise ValueError(f"checkpoint spec sizes must be positive: {self}")
        if self.image_bytes > self.slot_bytes:
            raise ValueError(f"image ({self.image_bytes} B) larger than its slot ({self.slot_bytes} B)")
        if self.segments:
            end = max(s.offset + s.nbytes for s in self.segments)
            carried = sum(s.nbytes for s in self.segments if s.in_image)
            if end > self.slot_bytes or carried != self.image_bytes:
                raise ValueError(f"segments disagree with the sizes: end {end} > slot {self.slot_bytes} "
                                 f"or carried {carried} != image {self.image_bytes}")

    @property
    def units_per_checkpoint(self) -> int:
        """k: vLLM blocks (one per image group) that hold one image."""
        return math.ceil(self.image_bytes / self.page_bytes)

    def withheld_blocks(self, num_slots: int, physical_blocks: Optional[int] = None) -> int:
        """Blocks withheld at the tail of an allocation of ``physical_blocks`` for ``num_slots`` slots.

        The protocol's rule, for one contiguous slot area: ``ceil(num_slots * slot / page)``,
        whatever the physical count (and the count when none is given). A spec whose layout
        carves the allocation otherwise overrides it; its count must be at least this one
        while the pool is not empty (this is the lower bound), and ``physical - withheld``
        must never decrease as ``physical`` grows (the KV-config hook searches the minimum
        pool on it).
        """
        return math.ceil(num_slots * self.slot_bytes / self.page_bytes)

    def image_segments(self) -> tuple[Segment, ...]:
        if self.segments:
            return tuple(s for s in self.segments if s.in_image)
        return (Segment("image", 0, self.image_bytes, True),)

    @staticmethod
    def from_segments(page_bytes: int, layout_id: str, parts: Sequence[tuple[str, int, bool]]) -> "CheckpointSpec":
        """Lay out ``(name, nbytes, in_image)`` parts one after another, each start aligned."""
        segs, offset = [], 0
        for name, nbytes, in_image in parts:
            if nbytes <= 0:
                continue
            size = round_up(nbytes, SEGMENT_ALIGN)
            segs.append(Segment(name, offset, size, in_image))
            offset += size
        image = sum(s.nbytes for s in segs if s.in_image)
        return CheckpointSpec(page_bytes, offset, image, layout_id, tuple(segs))


@dataclass(frozen=True)
class Placement:
    """Where a request's checkpoint images go: the plugin's (ATOM's) native placement.

    ``interval_tokens``: > 0 an interval rung every N prompt tokens (a multiple of the block size); 0 no
    image at all; -1 no rungs, but the prompt-end anchor and the demand rung still place images.
    ``demand``: also place a rung where a prefix hit's paged history reaches past its last image (the demand
    rung), so the next request with that prefix resumes there. In a prefill, a forward is cut to end on the
    earliest of the interval rung, the demand rung and the anchor (``cut``); the image is kept there
    (``keeps``). While decoding, an image is kept at the first block boundary at least one interval past the
    request's last image (``decode_keeps``). A request holds at most ``max_images_per_request`` images' blocks
    at once (the running one and the previous one), one per boundary.
    """

    interval_tokens: int = 8192
    demand: bool = True
    max_images_per_request: int = 2
    images_per_boundary: int = 1

    @property
    def publishes(self) -> bool:
        return self.interval_tokens != 0

    @property
    def working_blocks_per_group(self) -> int:
        """Blocks one request holds in each image group at its peak, published or not, with or without
        async scheduling: the running block and the previous one. The image-publish release pass frees the
        older ones before every allocation (vLLM's own pass frees on processed tokens and lags a step in
        flight); an interval of 0 publishes nothing, but the groups still allocate."""
        return self.max_images_per_request

    # -- the native rules, each a pure function of positions --------------------------------------
    def limit(self, num_prompt_tokens: int) -> int:
        """The last interval rung within the prompt (0: none)."""
        if self.interval_tokens <= 0:
            return 0
        return num_prompt_tokens // self.interval_tokens * self.interval_tokens

    def anchor_at(self, num_prompt_tokens: int, num_tokens: int, block_size: int) -> int:
        """The prompt-end anchor: the prompt's last full block, but never past the last block a prefix
        lookup can match (vLLM always recomputes the last token: one block short of a block-aligned end)."""
        if not self.publishes:
            return 0
        end = num_prompt_tokens // block_size * block_size
        end = min(end, (-(-num_tokens // block_size) - 1) * block_size)
        return max(end, 0)

    def demand_at(self, hit: int, compressed_hit: int, has_room: bool) -> int:
        """The demand rung: the paged-history hit when it lies past the image hit and the pool has room."""
        if not self.publishes or not self.demand or compressed_hit <= hit or not has_room:
            return 0
        return compressed_hit

    def cut(self, start: int, end: int, num_prompt_tokens: int, demand: int, anchor: int) -> int:
        """The earliest position in ``(start, end]`` a prefill forward must end on (0: none)."""
        rung = 0
        limit = self.limit(num_prompt_tokens)
        if limit:
            rung = min(end, limit)
            rung -= rung % self.interval_tokens
        candidates = [p for p in (rung, demand, anchor) if p and start < p <= end]
        return min(candidates) if candidates else 0

    def keeps(self, pos: int, num_prompt_tokens: int, demand: int, anchor: int) -> Optional[str]:
        """Which image a prefill forward ending at ``pos`` keeps: "rung", "demand", "anchor" or None."""
        if not self.publishes or pos <= 0 or pos > num_prompt_tokens:
            return None
        if self.interval_tokens > 0 and pos % self.interval_tokens == 0:
            return "rung"
        if pos == demand:
            return "demand"
        return "anchor" if pos == anchor else None

    def decode_keeps(self, pos: int, last_image: int, block_size: int) -> bool:
        """Whether a decode step ending at ``pos`` keeps an image: a block boundary at least one interval
        past the request's last image (0 when it has none)."""
        return self.interval_tokens > 0 and pos % block_size == 0 and pos - last_image >= self.interval_tokens

    def validated(self, block_size: int) -> "Placement":
        if self.interval_tokens < -1 or (self.interval_tokens > 0 and self.interval_tokens % block_size):
            raise ValueError(f"{INTERVAL_ENV}={self.interval_tokens}: the image interval must be -1 (no rungs; "
                             f"the anchor and the demand rung only), 0 (no images) or a positive multiple of "
                             f"the {block_size}-token block")
        return self


@dataclass(frozen=True)
class Sizing:
    """The checkpoint spec applied to one configuration: slots, k, blocks withheld."""

    spec: CheckpointSpec
    block_size: int
    num_slots: int

    @property
    def k(self) -> int:
        return self.spec.units_per_checkpoint

    @property
    def page_bytes(self) -> int:
        return self.spec.page_bytes

    @property
    def slot_area_bytes(self) -> int:
        return self.num_slots * self.spec.slot_bytes

    @property
    def withheld_blocks(self) -> int:
        """The protocol's contiguous count, ``ceil(slots * slot / page)``: the fewest blocks the slot area
        takes. It is the count for a contiguous spec at any physical block count; a spec that carves more
        (``CheckpointSpec.withheld_blocks`` overridden) withholds ``withheld_for(physical)``, never fewer
        while its pool is not empty, so this stays a lower bound."""
        return math.ceil(self.slot_area_bytes / self.spec.page_bytes)

    def withheld_for(self, physical_blocks: int) -> int:
        """Blocks at the tail of an allocation of ``physical_blocks`` that back the slots (never in vLLM's
        pool): the spec's count (``CheckpointSpec.withheld_blocks``)."""
        return self.spec.withheld_blocks(self.num_slots, int(physical_blocks))

    def usable_blocks(self, physical_blocks: int) -> int:
        """Blocks vLLM's pool gets (its null block included)."""
        return physical_blocks - self.withheld_for(physical_blocks)

    def physical_for(self, usable_blocks: int) -> int:
        """The fewest physical blocks whose pool gets at least ``usable_blocks`` blocks.

        Contiguous: ``usable_blocks + withheld_blocks``. A carve that withholds more is searched (it need
        not be invertible): up from that lower bound by doubling steps, then bisected, since the usable
        count never decreases as the physical count grows (``CheckpointSpec.withheld_blocks``).
        """
        lo = max(0, int(usable_blocks)) + self.withheld_blocks
        if self.usable_blocks(lo) >= usable_blocks:
            return lo
        step = max(1, self.withheld_blocks)
        hi = lo + step
        while self.usable_blocks(hi) < usable_blocks:
            if step > 1 << 40:
                raise ValueError(f"no physical block count gives {usable_blocks} usable blocks: the spec's "
                                 "withheld_blocks grows with the physical count")
            lo, step = hi, step * 2
            hi = lo + step
        while hi - lo > 1:  # usable(lo) < usable_blocks <= usable(hi)
            mid = (lo + hi) // 2
            if self.usable_blocks(mid) >= usable_blocks:
                hi = mid
            else:
                lo = mid
        return hi

    def slot_offset(self, physical_blocks: int, slot: int) -> int:
        """Byte offset of slot ``slot`` in an allocation of ``physical_blocks`` blocks."""
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.num_slots - 1}")
        return self.usable_blocks(physical_blocks) * self.spec.page_bytes + slot * self.spec.slot_bytes


@runtime_checkable
class StateCopier(Protocol):
    """Moves one checkpoint image between a request's slot and its ``k`` image blocks.

    ``block_ids`` are the request's image blocks in image-group order (group 0's
    block first), as vLLM's block tables hold them.
    """

    def store(self, slot: int, block_ids: Sequence[int]) -> None:
        """Slot -> blocks: take an image of the slot's state."""

    def restore(self, block_ids: Sequence[int], slot: int) -> None:
        """Blocks -> slot: put an image back before the request resumes."""


class ByteImageCopier:
    """Reference copier over one flat byte buffer (the shared KV allocation).

    The image is the spec's ``in_image`` segments of the slot, in order, cut into
    ``k`` pages; page ``i`` goes to ``block_ids[i]``. A plugin with its own
    layout supplies its own copier (usually a device kernel); this one is what
    the protocol means, and runs on any torch device.
    """

    def __init__(self, buffer, sizing: Sizing, physical_blocks: int):
        if buffer.dim() != 1 or buffer.numel() < physical_blocks * sizing.page_bytes:
            raise ValueError(f"buffer of {buffer.numel()} bytes does not cover {physical_blocks} blocks "
                             f"of {sizing.page_bytes} B")
        self.buffer = buffer
        self.sizing = sizing
        self.physical_blocks = physical_blocks
        self.usable_blocks = sizing.usable_blocks(physical_blocks)

    def _ranges(self, slot: int) -> list[tuple[int, int]]:
        base = self.sizing.slot_offset(self.physical_blocks, slot)
        return [(base + s.offset, s.nbytes) for s in self.sizing.spec.image_segments()]

    def _check_blocks(self, block_ids: Sequence[int]) -> None:
        if len(block_ids) != self.sizing.k:
            raise ValueError(f"an image takes k={self.sizing.k} blocks, got {len(block_ids)}")
        bad = [b for b in block_ids if not 0 < b < self.usable_blocks]
        if bad:
            raise ValueError(f"image blocks {bad} outside the pool 1..{self.usable_blocks - 1} "
                             "(0 is vLLM's null block; the tail holds the slots)")

    def store(self, slot: int, block_ids: Sequence[int]) -> None:
        import torch

        self._check_blocks(block_ids)
        image = torch.cat([self.buffer[o:o + n] for o, n in self._ranges(slot)])
        page = self.sizing.page_bytes
        for i, b in enumerate(block_ids):
            part = image[i * page:(i + 1) * page]
            self.buffer[b * page:b * page + part.numel()] = part

    def restore(self, block_ids: Sequence[int], slot: int) -> None:
        self._check_blocks(block_ids)
        page = self.sizing.page_bytes
        cursor = 0
        for o, n in self._ranges(slot):
            done = 0
            while done < n:
                i, within = divmod(cursor, page)
                take = min(n - done, page - within)
                src = block_ids[i] * page + within
                self.buffer[o + done:o + done + take] = self.buffer[src:src + take]
                done += take
                cursor += take


class ModelAdapter(ABC):
    """One model family's side of the slot/image mechanism.

    Subclasses set the class attributes and implement ``checkpoint_spec``.
    Instances may override names (a plugin whose proxy layer is named
    differently passes ``proxy_layer_name=...``).
    """

    #: Family name in logs and errors.
    name: str = "model"
    #: Exact architecture names (any of); never substrings.
    architectures: tuple[str, ...] = ()
    #: Who must serve them: "out_of_tree" (any plugin) or the plugin's module prefix.
    served_by: str = "out_of_tree"
    #: The proxy attention layer's name in the KV specs.
    proxy_layer_name: str = ""
    #: Suffix of a speculative draft model's own proxy layer ("" if the family has none). A draft proxy has
    #: its own tensor of the same block count; it is priced like the proxy and carves its own slots from its
    #: own tail (the same withheld count: the draft's ring lives in the target's slot layout).
    draft_proxy_layer_suffix: str = ""
    #: Suffix of the image layer names (``model.layers.{1+i}.<suffix>``).
    image_layer_suffix: str = ""
    #: Tokens per block of the proxy and of every image group.
    block_size: int = 0
    #: Placement defaults; ``INTERVAL_ENV`` and ``DEMAND_ENV`` override them.
    placement_defaults: Placement = Placement()

    def __init__(self, **overrides: Any):
        for key, value in overrides.items():
            if not hasattr(type(self), key):
                raise TypeError(f"{type(self).__name__} has no attribute {key!r} to override")
            setattr(self, key, value)

    # -- model match -------------------------------------------------------
    def matches(self, vllm_config: Any) -> bool:
        """Exact architecture and vLLM's registry resolving it to the plugin's class."""
        from vllm_patchkit import model_matches

        return model_matches(vllm_config, list(self.architectures), self.served_by)

    # -- layer names -------------------------------------------------------
    def image_layer_names(self, k: int) -> list[str]:
        # Layer index 1+i: index 0 is the proxy.
        return [f"model.layers.{1 + i}.{self.image_layer_suffix}" for i in range(k)]

    def is_image_layer(self, name: str) -> bool:
        return name.endswith("." + self.image_layer_suffix)

    def is_proxy_layer(self, name: str) -> bool:
        """The proxy, or a draft model's proxy: one opaque layer priced at the real bytes per block."""
        suffix = self.draft_proxy_layer_suffix
        return name == self.proxy_layer_name or bool(suffix) and name.endswith("." + suffix)

    def has_proxy(self, kv_cache_specs: Sequence[Mapping[str, Any]]) -> bool:
        return any(self.proxy_layer_name in worker for worker in kv_cache_specs)

    # -- sizing ------------------------------------------------------------
    @abstractmethod
    def checkpoint_spec(self, vllm_config: Any) -> CheckpointSpec:
        """The slot and image layout for this configuration."""

    def num_slots(self, vllm_config: Any) -> int:
        """One slot per request vLLM may run at once."""
        return max(1, int(vllm_config.scheduler_config.max_num_seqs))

    def sizing(self, vllm_config: Any) -> Sizing:
        return Sizing(self.checkpoint_spec(vllm_config), self.block_size, self.num_slots(vllm_config))

    # -- placement ---------------------------------------------------------
    def placement(self, env: Optional[Mapping[str, str]] = None) -> Placement:
        """The placement defaults with ``INTERVAL_ENV`` and ``DEMAND_ENV`` applied, validated."""
        env = os.environ if env is None else env
        p = self.placement_defaults
        raw = env.get(INTERVAL_ENV)
        if raw not in (None, ""):
            try:
                p = replace(p, interval_tokens=int(raw))
            except ValueError:
                raise ValueError(f"{INTERVAL_ENV}={raw!r} is not an integer") from None
        raw = env.get(DEMAND_ENV)
        if raw not in (None, ""):
            if raw not in ("0", "1"):
                raise ValueError(f"{DEMAND_ENV}={raw!r}: 1 places demand rungs, 0 does not")
            p = replace(p, demand=raw == "1")
        return p.validated(self.block_size)

    # -- copier ------------------------------------------------------------
    def make_copier(self, buffer, sizing: Sizing, physical_blocks: int) -> StateCopier:
        return ByteImageCopier(buffer, sizing, physical_blocks)


@dataclass
class Registry:
    """Adapters the KV-config hook consults, first match wins."""

    adapters: list[ModelAdapter] = field(default_factory=list)

    def register(self, adapter: ModelAdapter) -> ModelAdapter:
        clash = [a for a in self.adapters if a.proxy_layer_name == adapter.proxy_layer_name]
        if clash and clash[0] is not adapter:
            raise ValueError(f"proxy layer {adapter.proxy_layer_name!r} already belongs to adapter {clash[0].name!r}")
        if not clash:
            self.adapters.append(adapter)
        return adapter

    def unregister(self, adapter: ModelAdapter) -> None:
        self.adapters = [a for a in self.adapters if a is not adapter]

    def for_kv_specs(self, kv_cache_specs: Sequence[Mapping[str, Any]]) -> Optional[ModelAdapter]:
        """The adapter whose proxy layer is among the KV specs, else None."""
        return next((a for a in self.adapters if a.has_proxy(kv_cache_specs)), None)

    def for_config(self, vllm_config: Any) -> Optional[ModelAdapter]:
        return next((a for a in self.adapters if a.matches(vllm_config)), None)

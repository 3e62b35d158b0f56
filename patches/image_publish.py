"""Image publication: the scheduler-side book of a model's checkpoint images (via its adapter).

A model with a per-request state slot (DeepSeek-V4 in the plugin) files checkpoint *images* of the slot into
``k`` single-layer image groups (the adapter's ``image_layer_names(k)``; vLLM manages each as a Mamba
``align`` group; ``image_publish_release`` keeps a request's running block and the previous one, 2 per group
with or without async scheduling: the working blocks the KV-config hook counts). This module decides which of
those blocks are images (the plugin's native placement, ``Placement``) and publishes them
under the prefix hash with vLLM's own ``BlockPool.cache_full_blocks``; vLLM's own caching of the image groups
is switched off (``image_publish_suppress``), since only the blocks the plugin's copier filled hold an image.

The book (one per ``KVCacheManager``, kept on it) is driven from these places, each its own patch:

* ``KVCacheManager.allocate_slots`` (this module): before vLLM's call, publish this request's deferred image
  if its boundary hash exists now; after it, file the image this step makes (``Book.image_kind``: a prefill
  keep at a rung, the demand rung or the anchor, or a decode keep one interval past the last image; a
  duplicate of a cached image is not published again), pin its blocks (one per image group) and publish it at once if its boundary hash exists, else
  **defer** it (a decode keep whose boundary block is closed by a token still in flight: async scheduling);
* ``MambaManager.cache_blocks`` (``image_publish_suppress``): not for image groups;
* ``Scheduler._free_request`` (``image_publish_finish``): natural completion publishes a deferred image; an
  abort publishes it only if its hash exists, else **drops** it (publishing it raised ``IndexError`` in
  ``cache_full_blocks`` and took EngineCore down); then vLLM frees the request as usual;
* ``Scheduler._preempt_request`` (``image_publish_preempt``): an image published for the step the request is
  preempted from is **taken back**, a deferred one **dropped**; the request resumes (and hits its own last
  published image);
* ``Scheduler._mamba_block_aligned_split`` (``image_publish_split``): a prefill chunk ends on the earliest
  rung, demand rung or anchor inside it (``Placement.cut``), so each is a step's end;
* ``KVCacheManager.get_computed_blocks`` (``image_publish_admit``): the request's anchor and demand rung;
* ``MambaManager.remove_skipped_blocks`` (``image_publish_release``): all but the last image block freed.

Every read of a boundary hash goes through ``boundary_hash``: vLLM's ``resolve_block_hashes`` at the image
block size, the view ``cache_full_blocks`` itself indexes (vLLM may hash at a finer ``hash_block_size``; the
raw list is then longer than the view, and a check on it would let the ``IndexError`` through).

Blocks: the book pins (``BlockPool.touch``) an image's blocks from filing until its publication is decided,
so a deferred image's block cannot be handed to another request while it waits; a request has at most one
undecided image (filing a new one decides the previous one first), so all but the last image are released
and a request holds at most 2 blocks per image group (vLLM's running block, and the previous one or the
pinned image, which is the same block: the image at a step's end is that step's running block). Decided
images are released: a published one stays in vLLM's prefix cache (evictable, last) for later hits.

Counters (this patch's record, ``detail``): ``filed.{rung,demand,anchor,keep}``, ``published``, ``deferred``,
``published_deferred``, ``duplicates_skipped``, ``unpublished_not_run``, ``demands_declined_no_room``,
``dropped_on_abort``, ``dropped_on_preemption``, ``dropped_superseded``, ``dropped_unhashed_on_finish``,
``skipped_no_block``; ``placed``: the first 64 filings as ``[kind, boundary]``, in order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from patchkit_deepseek_v4.adapters import REGISTRY
from vllm_patchkit import PatchContext

log = logging.getLogger("vllm.patchkit")

PLACED_KEPT = 64  # filings noted in the record, in order (where the images fell; bounded)
BOOK_ATTR = "_vllm_patchkit_image_book"  # on the KVCacheManager: the Book, or None (no adapter's images)
IMAGE_GROUP_ATTR = "_vllm_patchkit_image_group"  # on each image group's MambaManager: True
LAYOUT_ATTR = "_vllm_patchkit_image_layout"  # on a Scheduler: its Layout, or None


@dataclass(frozen=True)
class Layout:
    """Where a KV-cache config keeps an adapter's images: the image groups and their block size."""

    adapter: Any
    placement: Any
    group_ids: tuple[int, ...]
    block_size: int
    proxy_group_id: int = 0


def image_layout(kv_cache_config: Any, registry: Any) -> Optional[Layout]:
    """The adapter whose proxy layer is in this config, its image groups and placement; None without one."""
    groups = kv_cache_config.kv_cache_groups
    adapter = registry.for_kv_specs([{name: None for g in groups for name in g.layer_names}])
    if adapter is None:
        return None
    ids = tuple(i for i, g in enumerate(groups) if any(adapter.is_image_layer(n) for n in g.layer_names))
    if not ids:
        return None
    sizes = {groups[i].kv_cache_spec.block_size for i in ids}
    if sizes != {adapter.block_size}:
        raise ValueError(f"vllm-patchkit: image-publish: {adapter.name} image groups have block sizes "
                         f"{sorted(sizes)}, the adapter's images are per {adapter.block_size}-token block")
    proxy = next(i for i, g in enumerate(groups) if adapter.proxy_layer_name in g.layer_names)
    return Layout(adapter, adapter.placement(), ids, adapter.block_size, proxy)


@dataclass
class Image:
    """One filed image: its boundary (tokens), its kind and its pinned blocks (one per image group)."""

    boundary: int
    kind: str
    blocks: dict[int, Any]  # group id -> KVCacheBlock
    deferred: bool = False


@dataclass
class Book:
    """The images of every running request of one KVCacheManager (see the module docstring)."""

    ctx: PatchContext
    layout: Layout
    manager: Any  # vLLM's KVCacheManager
    pending: dict[str, Image] = field(default_factory=dict)  # request id -> its undecided image
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)  # request id -> (demand rung, anchor)
    last_image: dict[str, int] = field(default_factory=dict)  # request id -> its last image's boundary
    published: dict[str, Image] = field(default_factory=dict)  # request id -> its last published image
    placed: list = field(default_factory=list)  # the first PLACED_KEPT filings: [kind, boundary] (the record)

    @property
    def pool(self) -> Any:
        return self.manager.block_pool

    # -- the one view every hash read goes through ----------------------------------------------
    def boundary_hash(self, request: Any, boundary: int) -> Any:
        """The prefix hash at ``boundary`` tokens at the image block size, or None while it does not exist."""
        view = self.ctx.use("resolve_block_hashes")(request.block_hashes, self.pool.hash_block_size,
                                                   self.layout.block_size)
        n = boundary // self.layout.block_size
        return view[n - 1] if len(view) >= n else None

    # -- admission -------------------------------------------------------------------------------
    def admit(self, request: Any, blocks: Any, hit: int, shared_prefix_boundary: int) -> None:
        """At each prefix lookup (``get_computed_blocks``): the request's anchor and demand rung.

        vLLM reports the paged-history hit past the image hit as ``shared_prefix_boundary`` (the image groups
        cut the hit short there); a demand rung goes there when the pool has room for the rest of the request
        and one more image (its live blocks, less the hit blocks other requests hold, + k)."""
        p, bs = self.layout.placement, self.layout.block_size
        anchor = p.anchor_at(request.num_prompt_tokens, request.num_tokens, bs)
        compressed_hit = shared_prefix_boundary or hit
        has_room = True
        if p.demand and p.publishes and compressed_hit > hit:
            hit_blocks = blocks.blocks[self.layout.proxy_group_id][:hit // bs] if hit else []
            live = -(-request.num_tokens // bs) - sum(1 for b in hit_blocks if b.ref_cnt > 0)
            has_room = self.pool.get_num_free_blocks() >= live + len(self.layout.group_ids)
            if not has_room:
                self.ctx.count("demands_declined_no_room")
        demand = p.demand_at(hit, compressed_hit, has_room)
        self.marks[request.request_id] = (demand, anchor)

    def image_kind(self, request: Any, start: int, end: int) -> Optional[str]:
        """Which image, if any, a step from ``start`` to ``end`` tokens keeps (the placement's rules)."""
        p, bs, rid = self.layout.placement, self.layout.block_size, request.request_id
        if start >= max(request.num_prompt_tokens, request.num_tokens - 1):  # decoding
            return "keep" if p.decode_keeps(end, self.last_image.get(rid, 0), bs) else None
        demand, anchor = self.marks.get(rid) or (0, p.anchor_at(request.num_prompt_tokens, request.num_tokens, bs))
        return p.keeps(end, request.num_prompt_tokens, demand, anchor)

    # -- filing ------------------------------------------------------------------------------------
    def file(self, request: Any, start: int, end: int) -> None:
        """After vLLM allocated a step from ``start`` to ``end`` tokens: file its image, if the placement says so."""
        kind = self.image_kind(request, start, end)
        if kind is None:
            return
        rid = request.request_id
        self.last_image[rid] = end
        previous = self.pending.get(rid)
        if previous is not None:
            if previous.boundary == end:
                return  # one image per boundary
            self.decide(request, previous, on_missing="dropped_superseded")
        idx = end // self.layout.block_size - 1
        blocks = {}
        for gid in self.layout.group_ids:
            table = self.manager.coordinator.single_type_managers[gid].req_to_blocks.get(rid, [])
            block = table[idx] if idx < len(table) else None
            if block is None or block.is_null or block.block_hash is not None:
                self.ctx.count("skipped_no_block")
                return
            blocks[gid] = block
        self.pool.touch(list(blocks.values()))
        image = Image(end, kind, blocks)
        self.ctx.count("filed." + kind)
        if len(self.placed) < PLACED_KEPT:
            self.placed.append([kind, end])
            self.ctx.note(flush=False, placed=list(self.placed))
        if self.boundary_hash(request, end) is not None:
            self.publish(request, image)
            self.release(image)
        else:
            image.deferred = True
            self.pending[rid] = image
            self.ctx.count("deferred")

    # -- deciding ----------------------------------------------------------------------------------
    def retry(self, request: Any) -> None:
        """Publish this request's deferred image if its boundary hash exists now (it keeps running)."""
        image = self.pending.get(request.request_id)
        if image is not None and self.boundary_hash(request, image.boundary) is not None:
            self.decide(request, image, on_missing="")

    def decide(self, request: Any, image: Image, on_missing: str) -> bool:
        """Publish ``image`` if its boundary hash exists, else drop it (counted as ``on_missing``); release it."""
        self.pending.pop(request.request_id, None)
        published = self.boundary_hash(request, image.boundary) is not None
        if published:
            published = self.publish(request, image)
            if published and image.deferred:
                self.ctx.count("published_deferred")
        elif on_missing:
            self.ctx.count(on_missing)
        self.release(image)
        return published

    def drop(self, request: Any, counter: str) -> None:
        """Drop this request's undecided image without publishing it."""
        image = self.pending.pop(request.request_id, None)
        if image is not None:
            self.ctx.count(counter)
            self.release(image)

    def cached(self, request: Any, boundary: int) -> bool:
        """Whether every image group already has a block under this boundary's hash (a duplicate image)."""
        h = self.boundary_hash(request, boundary)
        return h is not None and self.pool.get_cached_block(h, list(self.layout.group_ids)) is not None

    def publish(self, request: Any, image: Image) -> bool:
        """File the image's blocks under the prefix hash at its boundary, through vLLM's cache_full_blocks;
        not when that boundary already has a whole image (a duplicate: skipped, as native does)."""
        if self.cached(request, image.boundary):
            self.ctx.count("duplicates_skipped")
            return False
        n = image.boundary // self.layout.block_size
        cache_full_blocks = self.ctx.use("cache_full_blocks")
        for gid, block in image.blocks.items():
            if block.block_hash is not None:
                continue  # this group's block survived a partial eviction of the same boundary
            cache_full_blocks(self.pool, request, [self.pool.null_block] * (n - 1) + [block], n - 1, n,
                              self.layout.block_size, gid)
            manager = self.manager.coordinator.single_type_managers[gid]
            # vLLM's own guard for Mamba groups: a state cached in this step is not hit in this step.
            getattr(manager, "cached_blocks_this_step", set()).add(block.block_hash)
        self.published[request.request_id] = image
        self.ctx.count("published")
        return True

    def take_back(self, request: Any) -> None:
        """A request preempted in the step that scheduled its image's forward: that forward will not run, so
        the image was never written; unpublish it (native ``take_store_plan``). The forward of an image whose
        boundary the request's computed tokens already reached was scheduled, and stays published."""
        image = self.published.pop(request.request_id, None)
        if image is not None and request.num_computed_tokens < image.boundary:
            self.pool.evict_blocks({b.block_id for b in image.blocks.values()})
            self.ctx.count("unpublished_not_run")

    def forget(self, request: Any) -> None:
        """The request left (finished) or starts over (preempted): forget its marks and last image."""
        for book in (self.marks, self.last_image, self.published):
            book.pop(request.request_id, None)

    def release(self, image: Image) -> None:
        self.pool.free_blocks(list(image.blocks.values()))


def book_of(manager: Any, ctx: PatchContext) -> Optional[Book]:
    """The KVCacheManager's book, made on first use (None: no adapter's image groups, or no prefix caching)."""
    d = manager.__dict__
    if BOOK_ATTR in d:
        return d[BOOK_ATTR]
    layout = image_layout(manager.kv_cache_config, REGISTRY) if manager.enable_caching else None
    book = Book(ctx, layout, manager) if layout is not None else None
    if book is not None:
        for gid in layout.group_ids:
            manager.coordinator.single_type_managers[gid].__dict__[IMAGE_GROUP_ATTR] = True
        for name in ("published", "deferred", "dropped_on_abort", "dropped_on_preemption", "duplicates_skipped",
                     "unpublished_not_run"):
            ctx.count(name, 0)  # in the record from the start
    ctx.note(flush=False, layout=None if layout is None else {
        "adapter": layout.adapter.name, "image_groups": list(layout.group_ids), "block_size": layout.block_size,
        "interval_tokens": layout.placement.interval_tokens, "demand": layout.placement.demand,
        "hash_block_size": manager.block_pool.hash_block_size})
    d[BOOK_ATTR] = book
    return book


def existing_book(manager: Any) -> Optional[Book]:
    """The book another patch made on this KVCacheManager, if any (never makes one)."""
    return manager.__dict__.get(BOOK_ATTR)


def allocate_slots(wrapped, instance, args, kwargs, ctx):
    """Wrap of KVCacheManager.allocate_slots (instance: the KVCacheManager)."""
    book = book_of(instance, ctx)
    if book is None:
        return wrapped(*args, **kwargs)
    request = ctx.arg(args, kwargs, "request")
    book.retry(request)  # before vLLM may free the previous state block
    new_blocks = wrapped(*args, **kwargs)
    if new_blocks is not None:
        start = (request.num_computed_tokens + ctx.arg(args, kwargs, "num_new_computed_tokens")
                 + ctx.arg(args, kwargs, "num_external_computed_tokens"))
        book.file(request, start, start + ctx.arg(args, kwargs, "num_new_tokens"))
    return new_blocks

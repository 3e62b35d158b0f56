"""Differential test: the project's placement, carve and minimum pool against the native plugin's rules.

``Native`` below is this test's own transcription, from reading the public source of ROCm/ATOM at commit
9be05a9846ae282603d10e31f44c97aeae1f8e82 (the stored version of each file):

* ``atom/plugin/vllm/paged_state_image_scheduler.py``: ``ImagePlacement.limit``, ``.anchor``, ``.demand_pos``,
  ``.cut``, ``.keeps``, ``.decode_keeps``, ``.images_per_request``; ``SchedulerImages.chunk_len`` (prefill vs
  decode: ``start >= max(prompt, num_tokens - 1)``), ``._decide`` (a prefill keep sets the last checkpoint,
  duplicate or not) and ``._keep_decode`` (a decode keep sets it);
* ``atom/plugin/vllm/deepseek_v4_image.py``: ``V4ImageSizing.usable_blocks`` over ``carve_bytes`` (planes then
  the indexer pool, packed at 256 B, + 255 B);
* ``atom/plugin/vllm/paged_state_image.py``: ``_kv_cache_configs_hook`` (the minimum pool: ``usable <
  ceil(max_model_len / block) + images_per_request * k`` refuses; 0 images without prefix caching).

It is run against the project's ``Placement`` (the rules the image-publish patches call), ``Book.image_kind``
(prefill vs decode, the last image), ``Book.boundary_hash`` (the prefix hash an image is filed under, at hash
block sizes 16..256: vLLM's ``resolve_block_hashes``), ``Sizing`` (withheld blocks) and the KV-config hook's ``plan_pool`` /
``PoolPlan`` (minimum pool, refusal, the re-fit budget), on seeded random cases. Two minimum-pool terms are
kept different on purpose, each measured on vLLM's real scheduler (tests/patches/test_image_publish.py) and
written in docs/adapters/image-publish.md: vLLM's null block (+1) and, at interval 0, the image groups' 2
working blocks that still allocate (+2k). They are added to native's figure explicitly (``CORRECTIONS``);
everything else must be equal.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace as NS

from tests.adapters.test_deepseek_v4 import FLASH, TINY, spec_of
from pathlib import Path

from patchkit_deepseek_v4.adapters import DeepseekV4Adapter, Placement, Sizing
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.declaration.declare import parse_patch
from patchkit_deepseek_v4 import image_publish as ip
from patchkit_deepseek_v4 import kv_config_hook as hook

CASES = int(__import__("os").environ.get("DIFF_CASES", 10_000))
SEED = 22
REGION = 256


class Native:
    """ATOM's placement (``ImagePlacement``) and its scheduler-side use of it, transcribed."""

    def __init__(self, interval: int, demand: bool, block: int):
        self.interval, self.demand, self.block = interval, demand, block

    def limit(self, prompt):
        return prompt // self.interval * self.interval if self.interval > 0 else 0

    def anchor(self, prompt, num_tokens):
        if self.interval == 0:
            return 0
        last_matchable = (math.ceil(num_tokens / self.block) - 1) * self.block
        return max(min(prompt // self.block * self.block, last_matchable), 0)

    def demand_pos(self, hit, compressed_hit, has_room):
        if self.interval == 0 or not self.demand or compressed_hit <= hit:
            return 0
        return compressed_hit if has_room else 0

    def cut(self, start, end, prompt, demand, anchor):
        rung = 0
        if self.limit(prompt):
            rung = min(end, self.limit(prompt))
            rung -= rung % self.interval
        inside = [p for p in (rung, demand, anchor) if p and start < p <= end]
        return min(inside) if inside else 0

    def keeps(self, pos, prompt, demand, anchor):
        if self.interval == 0 or not 0 < pos <= prompt:
            return False
        return (self.interval > 0 and pos % self.interval == 0) or pos in (demand, anchor)

    def decode_keeps(self, pos, last):
        return self.interval > 0 and pos % self.block == 0 and pos - last >= self.interval

    def images_per_request(self):
        return 0 if self.interval == 0 else 2


def native_usable(carve, physical, slots, page, slot):
    """``V4ImageSizing.usable_blocks``: a first guess, then one block less while the carve does not fit."""
    def carve_bytes(blocks):
        rows = (slots + -(-blocks * carve.envelope_rows // carve.slot_rows)) * carve.slot_rows
        offset = 0
        for nbytes in [rows * w for w in carve.plane_widths] + [blocks * carve.indexer_block_bytes]:
            offset = -(-offset // REGION) * REGION + nbytes
        return -(-offset // REGION) * REGION + REGION - 1

    usable = physical - math.ceil((slots * slot + REGION) / page)
    while usable > 0 and carve_bytes(usable) > physical * page:
        usable -= 1
    return max(usable, 0)


def decode_step(start, num_tokens, *, block):
    """Tokens in a decode step of the drive: 1 for the first 512 generated tokens, then up to the next block
    boundary (only a step ending on a boundary can keep an image, on either side, and the first 512 tokens show
    that one token at a time)."""
    if start - num_tokens < 512:
        return 1
    return block - start % block


# -- one request through prefill and decode, on each side -------------------------------------------------

def native_images(n: Native, prompt, num_tokens, hit, compressed_hit, has_room, budget, generated):
    anchor, demand = n.anchor(prompt, num_tokens), n.demand_pos(hit, compressed_hit, has_room)
    images, last, start = [], 0, hit
    while start < num_tokens + generated:
        tokens = num_tokens if start < num_tokens else start + 1  # the last sampled token sits at `start`
        if start < max(prompt, tokens - 1):  # chunk_len: prefill
            end = start + min(budget, num_tokens - start)
            end = n.cut(start, end, prompt, demand, anchor) or end
            if n.keeps(end, prompt, demand, anchor):
                images.append(end)
                last = end
        else:
            end = start + decode_step(start, num_tokens, block=n.block)
            if n.decode_keeps(end, last):
                images.append(end)
                last = end
        start = end
    return anchor, demand, images


BOOK_CTX = PatchContext.detached(parse_patch(Path(ip.__file__).with_suffix(".yaml")))


def native_boundary_hash(block_hashes, end, hash_block):
    """Native reads ``request.block_hashes[end // block - 1]``: vLLM hashes V4 at its image block (128), so the
    entry is the chained hash of the prefix ending at ``end``; at a finer hash block that prefix's entry is
    ``[end // hash_block - 1]``."""
    return block_hashes[end // hash_block - 1]


def project_boundary_hashes(block, hash_block, num_tokens, ends):
    """What the book reads (``Book.boundary_hash``: vLLM's ``resolve_block_hashes`` at the image block size)
    for each image boundary, over a hash list of ``num_tokens`` tokens at ``hash_block``; and native's."""
    hashes = [("h", i) for i in range(num_tokens // hash_block)]
    book = object.__new__(ip.Book)
    book.ctx, book.layout = BOOK_CTX, ip.Layout(None, None, (1,), block)
    book.manager = NS(block_pool=NS(hash_block_size=hash_block))
    req = NS(block_hashes=hashes)
    return ([book.boundary_hash(req, e) for e in ends],
            [native_boundary_hash(hashes, e, hash_block) if e <= num_tokens else None for e in ends])


def project_images(p: Placement, block, prompt, num_tokens, hit, compressed_hit, has_room, budget, generated):
    book = object.__new__(ip.Book)
    book.layout = ip.Layout(None, p, (1,), block)
    anchor, demand = p.anchor_at(prompt, num_tokens, block), p.demand_at(hit, compressed_hit, has_room)
    book.marks, book.last_image = {"r": (demand, anchor)}, {}
    req = NS(request_id="r", num_prompt_tokens=prompt, num_tokens=num_tokens)
    images, start = [], hit
    while start < num_tokens + generated:
        req.num_tokens = num_tokens if start < num_tokens else start + 1
        if start < num_tokens:  # a prefill chunk, as image-publish-split cuts it
            end = start + min(budget, num_tokens - start)
            end = p.cut(start, end, prompt, demand, anchor) or end
        else:
            end = start + decode_step(start, num_tokens, block=block)
        if book.image_kind(req, start, end) is not None:  # what Book.file records
            images.append(end)
            book.last_image["r"] = end
        start = end
    return anchor, demand, images


# -- the pool, on each side ------------------------------------------------------------------------------

def project_pool(sizing, block, placement, *, images_on, draft, max_model_len, auto_fit, batches, memory):
    adapter = DeepseekV4Adapter(block_size=block)
    specs = {adapter.proxy_layer_name: NS(block_size=block)}
    if draft:
        specs["model.layers.4.atom_deepseek_v4_draft_proxy"] = NS(block_size=block)
    if images_on:
        specs.update({n: NS(block_size=block) for n in adapter.image_layer_names(sizing.k)})
    vc = NS(cache_config=NS(num_gpu_blocks_override=None), max_concurrent_batches=batches,
            model_config=NS(max_model_len=max_model_len, original_max_model_len=-1 if auto_fit else max_model_len),
            scheduler_config=NS(max_num_seqs=sizing.num_slots, async_scheduling=batches > 1))
    try:
        plan = hook.plan_pool(adapter, vc, [specs], [memory], sizing=sizing, placement=placement)
    except hook.PoolTooSmall:
        return None
    return plan


def test_placement_carve_and_minimum_pool_equal_the_native_plugins():
    rng = random.Random(SEED)
    specs = {name: spec_of(cfg, kv_fp8=fp8, spec_tokens=s) for name, cfg, fp8, s in
             [("tiny-fp8", TINY, True, 0), ("tiny-bf16", TINY, False, 0), ("tiny-mtp", TINY, True, 1),
              ("flash-fp8", FLASH, True, 0), ("flash-bf16", FLASH, False, 1)]}
    diffs, counted = [], {"cases": 0, "images": 0, "refused": 0, "draft": 0, "async": 0, "hash_blocks": set()}
    for case in range(CASES):
        block = rng.choice([64, 128, 256])
        interval = rng.choice([-1, 0, block, 4 * block, 8192 // block * block, rng.randrange(1, 40) * block])
        demand = rng.random() < 0.5
        prompt = rng.randrange(1, 30_000)
        resumed = rng.randrange(0, 600) if rng.random() < 0.2 else 0  # a preempted request: output to replay
        num_tokens = prompt + resumed
        hit = rng.randrange(0, (num_tokens - 1) // block + 1) * block
        compressed_hit = min(hit + rng.choice([0, 0, block, rng.randrange(0, 40) * block]),
                             (num_tokens - 1) // block * block)
        has_room, budget = rng.random() < 0.8, rng.choice([block, 2048, 8192, 100_000])
        generated = rng.randrange(0, 40_000)

        p = Placement(interval, demand).validated(block)
        n = Native(interval, demand, block)
        a = native_images(n, prompt, num_tokens, hit, compressed_hit, has_room, budget, generated)
        b = project_images(p, block, prompt, num_tokens, hit, compressed_hit, has_room, budget, generated)
        if a != b:
            diffs.append(("placement", case, block, interval, demand, prompt, num_tokens, hit, compressed_hit, a, b))
        counted["images"] += len(a[2])
        hash_block = rng.choice([h for h in (16, 32, 64, 128, 256) if block % h == 0])
        ends = a[2][:3]
        got, want = project_boundary_hashes(block, hash_block, num_tokens + generated, ends)
        if got != want:
            diffs.append(("boundary hash", case, block, hash_block, ends, got, want))
        counted["hash_blocks"].add(hash_block)

        # the pool: V4 spec at a random slot count and pool size, sync or async, with or without a draft proxy
        name = rng.choice(list(specs))
        spec, slots = specs[name], rng.choice([1, 2, 4, 16, 64, 256])
        sizing = Sizing(spec, block, slots)
        draft = rng.random() < 0.3
        images_on = not draft and rng.random() < 0.8  # native refuses MTP with prefix caching (so do we)
        batches = rng.choice([1, 2])
        max_model_len = rng.randrange(1, 200_000)
        auto_fit = rng.random() < 0.3
        physical = sizing.withheld_for(10**6) * rng.choice([1, 2]) + rng.randrange(0, 5_000) if slots > 16 \
            else sizing.withheld_blocks + rng.randrange(0, 3_000)
        tensors = 2 if draft else 1
        memory = physical * spec.page_bytes * tensors + rng.randrange(0, spec.page_bytes)
        plan = project_pool(sizing, block, p, images_on=images_on, draft=draft, max_model_len=max_model_len,
                            auto_fit=auto_fit, batches=batches, memory=memory)
        usable = native_usable(spec.carve, physical, slots, spec.page_bytes, spec.slot_bytes)
        k = sizing.k
        native_images_per_req = n.images_per_request() if images_on else 0
        corrections = hook.NULL_BLOCKS + (2 * k if images_on and interval == 0 else 0)
        need_history = 1 if auto_fit else math.ceil(max_model_len / block)
        native_refuses = usable < need_history + native_images_per_req * k + corrections
        got = None if plan is None else (plan.physical, plan.physical - plan.usable)
        if (plan is None) != native_refuses:
            diffs.append(("refusal", case, name, slots, physical, max_model_len, auto_fit, usable, got))
        elif plan is not None:
            refit = (usable - native_images_per_req * k - corrections) * block
            if (plan.physical, plan.usable, plan.left_for_history * block) != (physical, usable, refit):
                diffs.append(("pool", case, name, slots, physical, (plan.physical, plan.usable), usable,
                              plan.left_for_history * block, refit))
            target = max_model_len if not auto_fit else block
            native_min = next_physical(spec, slots, math.ceil(target / block) + native_images_per_req * k
                                       + corrections, physical)
            if plan.minimum_physical(target) != native_min:
                diffs.append(("minimum", case, name, slots, plan.minimum_physical(target), native_min))
            other = project_pool(sizing, block, p, images_on=images_on, draft=draft, max_model_len=max_model_len,
                                 auto_fit=auto_fit, batches=3 - batches, memory=memory)
            if other is None or other.left_for_history != plan.left_for_history:
                diffs.append(("sync-async", case, name, batches))
        counted["refused"] += native_refuses
        counted["draft"] += draft
        counted["async"] += batches == 2
        counted["cases"] += 1
    print(f"native differential: {counted['cases']} cases ({counted['images']} images placed, "
          f"{counted['refused']} pools refused, {counted['draft']} with a draft proxy, {counted['async']} async, "
          f"hash blocks {sorted(counted['hash_blocks'])}), "
          f"{len(diffs)} differences")
    assert counted["cases"] == CASES >= 10_000
    assert counted["images"] > CASES and 0 < counted["refused"] < CASES and counted["draft"] and counted["async"]
    assert counted["hash_blocks"] == {16, 32, 64, 128, 256}
    assert diffs == [], diffs[:5]


def next_physical(spec, slots, need, hint):
    """The fewest physical blocks whose native carve leaves ``need`` usable blocks (searched)."""
    def ok(physical):
        return native_usable(spec.carve, physical, slots, spec.page_bytes, spec.slot_bytes) >= need
    lo, hi = 0, max(1, hint)
    while not ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi

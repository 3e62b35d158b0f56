"""The image-publish patches on vLLM's real scheduler, on the CPU.

Everything vLLM does here is vLLM's own code: ``Scheduler`` and ``AsyncScheduler`` (scheduling, chunking,
preemption, finishing, aborting), their ``KVCacheManager`` / hybrid coordinator / ``MambaManager`` /
``BlockPool`` (allocation, hashing, ``cache_full_blocks``, ``resolve_block_hashes``, prefix hits), and
``get_kv_cache_configs`` (through the KV-config hook, which sizes the toy pool). The patches are installed by
the real loader in the engine_core role for the DeepSeek-V4 stand-in (exact architecture, out-of-tree class,
prefix caching), as in a server. What stands in for what cannot run here:

* the model's forward: sampled tokens are faked (token 7, or a stop token where a test says so), and under
  ``AsyncScheduler`` a step's output is delivered after the next step is scheduled, as EngineCore's batch
  queue does; so a decode step's boundary token is in flight while the next step is scheduled;
* the plugin's model and copier: a toy adapter (the KV-config hook test's ``ToyAdapter``: block 256, k = 3
  image groups) with a fake proxy layer spec and ``MambaSpec(align)`` image layers. Nothing copies bytes:
  these tests are about which blocks are published under which hash, and when.
"""

from __future__ import annotations

import pytest

from tests.conftest import process_loader
from tests.patches.test_kv_config_hook import BS, ToyAdapter, make_config, toy_specs
from vllm_patchkit.runtime import state as runtime
from patchkit_deepseek_v4.adapters import INTERVAL_ENV, REGISTRY
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
from patchkit_deepseek_v4 import image_publish as ip

IDS = ["image-publish", "image-publish-suppress", "image-publish-finish", "image-publish-preempt",
       "image-publish-split", "image-publish-admit", "image-publish-release", "image-kv-zeroing-off",
       "image-cow-refuse"]
STOP = 99


@pytest.fixture
def toy():
    adapter = REGISTRY.register(ToyAdapter())
    yield adapter
    REGISTRY.unregister(adapter)


@pytest.fixture(scope="module")
def v4_checkpoint(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("imgpub-v4"), "DeepseekV4ForCausalLM")


@pytest.fixture
def patched(v4_checkpoint, toy, standin_registered, monkeypatch):
    """The loader in EngineCore, config stage run for the stand-in V4 with prefix caching (interval 512)."""
    monkeypatch.setenv(INTERVAL_ENV, "512")
    loader = process_loader("engine_core")
    loader.run_config_stage(make_config(v4_checkpoint, 4096, override=100))
    for pid in IDS:
        assert loader.records[pid].state == "applied", (pid, loader.records[pid].reason)
    yield loader
    loader.unpatch()
    runtime.reset()


def build(v4_checkpoint, toy, *, hash_block_size=BS, asynchronous=True, blocks=100, max_model_len=4096,
          bypass=0, pipeline_stages=1):
    """vLLM's scheduler over a pool the KV-config hook sized (4 slots withheld, 3 image groups); the config says
    async scheduling exactly when the scheduler is an AsyncScheduler, as in EngineCore. ``bypass``: that many
    blocks taken off the pool after the hook's check, to watch what vLLM does below the minimum."""
    import vllm.v1.engine.core as core
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    vc = make_config(v4_checkpoint, max_model_len, override=blocks, async_scheduling=asynchronous)
    vc.parallel_config.pipeline_parallel_size = pipeline_stages  # what the scheduler and the hook read of it
    configs = core.get_kv_cache_configs(vc, [toy_specs(toy)], [blocks * 4096])  # EngineCore's copy: the hook
    for cfg in configs:
        cfg.num_blocks -= bypass
    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks
    cls = AsyncScheduler if asynchronous else Scheduler
    return cls(vllm_config=vc, kv_cache_config=sched_cfg, structured_output_manager=StructuredOutputManager(vc),
               block_size=BS, hash_block_size=hash_block_size, log_stats=False)


def new_request(sched, rid, prompt, max_tokens=64):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[STOP]),
                  None, block_hasher=kv_cache_utils.get_request_block_hasher(sched.hash_block_size, hash_fn))
    sched.add_request(req)
    return req


class Engine:
    """Drives a scheduler in EngineCore's order; the forward is faked (see the module docstring).

    With an AsyncScheduler, as ``EngineCore.step_with_batch_queue`` does: schedule step N, then take step
    N-1's output, process the aborts that came in meanwhile (``abort``), then deliver that output. With a
    Scheduler: schedule a step and deliver its output. ``depth``: EngineCore's batch queue size
    (``vllm_config.max_concurrent_batches``; default 2 with an AsyncScheduler, 1 with a Scheduler); a Scheduler
    with depth 2 is pipeline parallelism of 2 stages. ``stop_at[rid] = n``: the token sampled at position n of
    that request is the stop token."""

    def __init__(self, sched, depth=None):
        self.sched = sched
        self.asynchronous = type(sched).__name__ == "AsyncScheduler"
        self.depth = depth or (2 if self.asynchronous else 1)
        self.queue: list = []
        self.stop_at: dict[str, int] = {}

    def _output(self, out):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests.get(rid)
            if req is None or req.is_prefill_chunk:
                sampled.append([])
                continue
            position = req.num_computed_tokens  # the token this step samples sits at this position
            sampled.append([STOP if self.stop_at.get(rid) == position else 7])
        return out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                      sampled_token_ids=sampled)

    def schedule(self):
        out = self.sched.schedule()
        self.queue.append(self._output(out))
        if self.depth == 1:
            self.deliver()
        return out

    def deliver(self, abort=()):
        """The oldest step's output arrives; `abort`: request ids aborted just before (the aborts queue)."""
        from vllm.v1.request import RequestStatus

        if abort:
            self.sched.finish_requests(list(abort), RequestStatus.FINISHED_ABORTED)
        self.sched.update_from_output(*self.queue.pop(0))

    def step(self):
        out = self.schedule()
        while len(self.queue) > self.depth - 1:
            self.deliver()
        return out

    def until(self, predicate, limit=1000):
        for _ in range(limit):
            if predicate():
                return
            self.step()
        raise AssertionError("condition not reached")


def first_schedule_hit(engine, req, limit=10):
    """Step until `req` is scheduled; the tokens it started from (its prefix hit)."""
    for _ in range(limit):
        out = engine.step()
        if req.request_id in out.num_scheduled_tokens:
            return req.num_computed_tokens - out.num_scheduled_tokens[req.request_id]
    raise AssertionError(f"{req.request_id} not scheduled")


def book(sched):
    return ip.existing_book(sched.kv_cache_manager)


def counts(loader):
    loader.sync_calls()
    return loader.records["image-publish"].detail


def image_blocks(sched, boundary, key_request):
    """The blocks cached under the image boundary's hash, per image group (None where absent)."""
    from vllm.v1.core.kv_cache_utils import resolve_block_hashes

    pool = sched.kv_cache_manager.block_pool
    view = resolve_block_hashes(key_request.block_hashes, pool.hash_block_size, BS)
    n = boundary // BS
    if len(view) < n:
        return None
    gids = book(sched).layout.group_ids
    return pool.get_cached_block(view[n - 1], list(gids))


def hook_plan(loader):
    """The pool plan of the KV-config hook's last call (its record), i.e. what it counted."""
    loader.sync_calls()
    last = loader.records["kv-config-hook"].detail["last_call"]
    assert last["decision"] == "sized", last
    return last["plan"]


def held_image_blocks(sched, rid):
    """Per image group, the non-null blocks the request's block table holds."""
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    return [sum(1 for b in mgrs[g].req_to_blocks.get(rid, []) if not b.is_null) for g in book(sched).layout.group_ids]


def run_to_deferred_keep(sched, engine, prompt_len=1000, boundary=1280):
    """A request decoding under async scheduling until the step whose end is the keep at `boundary` is
    scheduled: the token that closes that block is in flight, so the keep is deferred."""
    req = new_request(sched, "r0", range(1, prompt_len + 1), max_tokens=400)
    engine.until(lambda: req.num_computed_tokens == boundary - 1)
    engine.schedule()  # the step ending on the boundary; the previous step's output is not delivered yet
    pending = book(sched).pending.get("r0")
    assert pending is not None and (pending.boundary, pending.kind, pending.deferred) == (boundary, "keep", True)
    assert req.num_tokens == boundary - 1  # the closing token is in flight
    return req


# ---------------------------------------------------------------------------
# Placement, publication, hits
# ---------------------------------------------------------------------------


def test_rungs_anchor_and_keeps_are_published_under_the_prefix_hash(patched, v4_checkpoint, toy):
    """Prompt 1000, interval 512: rung 512 (a chunk cut there), anchor 768 (the prompt's last full block),
    keep 1280 (decode: the first block boundary one interval past the anchor, native's spacing; deferred under
    async, published while the request runs). Not 1024 (a multiple of the interval: the old rule)."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=300)
    first = engine.step()
    assert first.num_scheduled_tokens["r0"] == 512  # vLLM alone runs to 768 (its last cacheable boundary)
    engine.until(lambda: req.is_finished())
    for boundary in (512, 768, 1280):
        assert image_blocks(sched, boundary, req) is not None, boundary
    assert image_blocks(sched, 1024, req) is None
    assert image_blocks(sched, 256, req) is None  # not an image boundary: vLLM's own caching is off
    c = counts(patched)
    assert c["filed"] == {"rung": 1, "anchor": 1, "keep": 1}
    assert (c["published"], c["deferred"], c["published_deferred"]) == (3, 1, 1)
    assert patched.records["image-publish-split"].detail["chunks_cut_for_rung"] == 1


def test_a_deferred_keep_is_published_while_its_request_runs_and_a_second_request_hits_it(patched, v4_checkpoint,
                                                                                           toy):
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    r0 = run_to_deferred_keep(sched, engine)
    assert image_blocks(sched, 1280, r0) is None
    engine.deliver()  # the closing token arrives: the hash exists, the keep waits for the next step
    assert book(sched).pending["r0"].boundary == 1280 and image_blocks(sched, 1280, r0) is None
    engine.step()  # r0's next step is scheduled: its keep is published first
    assert "r0" not in book(sched).pending and not r0.is_finished()
    published = image_blocks(sched, 1280, r0)
    assert published is not None
    # a second request with the same 1280-token prefix (r0's prompt and 280 sampled tokens) and more
    r1 = new_request(sched, "r1", r0.all_token_ids[:1280] + [5] * 100, max_tokens=4)
    assert first_schedule_hit(engine, r1) == 1280  # the prefix hit ends on the image
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    assert [mgrs[g].req_to_blocks["r1"][4] for g in book(sched).layout.group_ids] == published
    engine.until(lambda: r0.is_finished() and r1.is_finished(), limit=400)
    c = counts(patched)
    assert c["published_deferred"] >= 1 and c["dropped_on_abort"] == 0


def test_sync_scheduling_publishes_keeps_at_once(patched, v4_checkpoint, toy):
    sched = build(v4_checkpoint, toy, asynchronous=False)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=300)
    engine.until(lambda: req.num_computed_tokens == 1280)
    assert "r0" not in book(sched).pending and image_blocks(sched, 1280, req) is not None
    assert counts(patched)["deferred"] == 0


# ---------------------------------------------------------------------------
# Abort with a deferred keep (the IndexError), natural completion, preemption
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("hash_block_size", [256, 128])
def test_abort_with_a_deferred_keep_drops_it_and_frees_the_request(patched, v4_checkpoint, toy, hash_block_size):
    sched = build(v4_checkpoint, toy, hash_block_size=hash_block_size)
    engine = Engine(sched)
    pool = sched.kv_cache_manager.block_pool
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    assert book(sched).boundary_hash(req, 1280) is None
    if hash_block_size == 128:
        # the raw list is at the finer granularity: reading it at the image block size says "exists"
        assert len(req.block_hashes) >= 1280 // BS
    engine.deliver(abort=["r0"])  # EngineCore: the aborts queue, then the output (no IndexError)
    assert "r0" not in sched.requests and "r0" not in book(sched).pending
    assert all(b.ref_cnt == 0 and b.block_hash is None for b in image.blocks.values())
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # everything back but vLLM's null block
    c = counts(patched)
    assert (c["dropped_on_abort"], c["deferred"]) == (1, 1)
    assert patched.records["image-publish-finish"].detail["abort_dropped"] == 1
    engine.step()  # the aborted request's last in-flight output arrives and is ignored; the engine goes on


@pytest.mark.parametrize("hash_block_size", [256, 128])
def test_negative_control_publishing_the_deferred_keep_raises_index_error(patched, v4_checkpoint, toy,
                                                                          hash_block_size):
    """Without the rule: the naive publication calls vLLM's cache_full_blocks for the keep's block as soon as
    the request ends (at 128, after checking the raw hash list, which says the hash is there)."""
    from vllm.v1.core.block_pool import BlockPool

    sched = build(v4_checkpoint, toy, hash_block_size=hash_block_size)
    engine = Engine(sched)
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    pool = sched.kv_cache_manager.block_pool
    n = 1280 // BS
    naive_check = len(req.block_hashes) >= n if hash_block_size == 128 else True
    assert naive_check
    gid, block = next(iter(image.blocks.items()))
    with pytest.raises(IndexError):
        BlockPool.cache_full_blocks(pool, req, [pool.null_block] * (n - 1) + [block], n - 1, n, BS, gid)


def test_natural_completion_with_a_deferred_keep_publishes_it(patched, v4_checkpoint, toy):
    """The in-flight token that closes the keep's block is a stop token: the request finishes when it lands,
    and then the keep's hash exists."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    engine.stop_at["r0"] = 1279
    req = run_to_deferred_keep(sched, engine)
    engine.deliver()  # the stop token closes the keep's block and finishes the request
    assert req.is_finished() and req.status.name == "FINISHED_STOPPED" and req.num_tokens == 1280
    assert image_blocks(sched, 1280, req) is not None
    c = counts(patched)
    assert (c["published_deferred"], c["dropped_on_abort"]) == (1, 0)
    assert patched.records["image-publish-finish"].detail["finish_published"] == 1


def test_preemption_drops_the_deferred_keep_and_the_request_resumes_from_its_last_image(patched, v4_checkpoint,
                                                                                         toy):
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    # what the scheduler's own preemption does: off the running queue, then _preempt_request
    sched.running.remove(req)
    sched._preempt_request(req, 0.0)
    assert "r0" not in book(sched).pending and all(b.block_hash is None for b in image.blocks.values())
    assert counts(patched)["dropped_on_preemption"] == 1
    assert first_schedule_hit(engine, req) == 768  # it resumes from its last published image (the anchor)
    engine.until(lambda: req.is_finished(), limit=400)
    assert req.num_tokens == 1000 + 400 and req.num_preemptions == 1


@pytest.mark.parametrize("asynchronous, stages", [(True, 1), (False, 1), (False, 2)], ids=["async", "sync", "sync-pp2"])
def test_the_book_never_holds_a_block_beyond_vllms_own_table(patched, v4_checkpoint, toy, asynchronous, stages):
    """All but the last image are released: a pinned (undecided) image is always a block the request's own
    table still holds, so the book adds no block to what vLLM's align-mode manager holds.

    And vLLM's own table peaks at what the KV-config hook counts per image group: under AsyncScheduler (prompt
    1000 cut at 512 and 768) 3 for one step (the states at 512 and 768 and the running block at 1000: vLLM
    frees on processed tokens, and the chunk to 768 is in flight), 2 otherwise; under the synchronous Scheduler
    2; under the synchronous Scheduler with 2 pipeline stages (EngineCore's batch queue of 2) 3 again: a
    request's next prefill chunk is scheduled while the previous one is in flight."""
    sched = build(v4_checkpoint, toy, asynchronous=asynchronous, pipeline_stages=stages)
    counted = hook_plan(patched)["working_per_group"]
    in_flight = asynchronous or stages > 1
    engine = Engine(sched, depth=sched.vllm_config.max_concurrent_batches)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=600)
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    extra_peak, table_peak, at_peak = 0, 0, []
    while not req.is_finished():
        engine.step()
        pinned = book(sched).pending.get("r0")
        if pinned is not None:
            extra_peak = max(extra_peak, sum(1 for gid, b in pinned.blocks.items()
                                             if b not in mgrs[gid].req_to_blocks.get("r0", [])))
        if "r0" in sched.requests:
            held = max(held_image_blocks(sched, "r0"))
            if held > 2:
                at_peak.append(req.num_computed_tokens)
            table_peak = max(table_peak, held)
    # image-publish-release frees all but the last image block before each allocation: 2, in flight or not
    # (vLLM's own pass, on processed tokens, held 3 for one step under async and with two pipeline stages)
    assert extra_peak == 0 and table_peak == counted == 2 and at_peak == []
    assert counts(patched)["filed"] == {"rung": 1, "anchor": 1, "keep": 1}  # 1280 (then 1792 > 1600)


def test_interval_zero_publishes_nothing_and_still_holds_working_blocks(patched, v4_checkpoint, toy,
                                                                        monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=40)
    held = []
    while not req.is_finished():
        engine.step()
        if "r0" in sched.requests:
            held.append(held_image_blocks(sched, "r0"))
    assert any(min(h) >= 1 for h in held) and all(max(h) <= 2 for h in held)
    for boundary in (256, 512, 768, 1024):
        assert image_blocks(sched, boundary, req) is None
    c = counts(patched)
    assert c["published"] == 0 and "filed" not in c


# ---------------------------------------------------------------------------
# The minimum pool +-1 with images on and async scheduling (vLLM's real AsyncScheduler)
# ---------------------------------------------------------------------------

L_MAX = 20_992  # 82 blocks of 256


def serve(engine, requests, limit=3000):
    """Step until every request finished; the peak image blocks any request held per group, the fewest free
    blocks seen. Raises if a step schedules nothing while nothing is in flight (stuck) or the limit is hit."""
    sched, pool = engine.sched, engine.sched.kv_cache_manager.block_pool
    peak, min_free = 0, pool.get_num_free_blocks()
    for _ in range(limit):
        if all(r.is_finished() for r in requests):
            return peak, min_free
        out = engine.step()
        if not out.num_scheduled_tokens and not engine.queue:
            raise AssertionError(f"stuck: nothing scheduled, nothing in flight; "
                                 f"{[(r.request_id, r.status.name, r.num_computed_tokens) for r in requests]}")
        min_free = min(min_free, pool.get_num_free_blocks())
        peak = max([peak] + [max(held_image_blocks(sched, r.request_id)) for r in requests
                             if r.request_id in sched.requests])
    raise AssertionError("not finished within the step limit")


def minimum_physical(v4_checkpoint, toy, max_model_len):
    """The physical block count the KV-config hook asks for (images on, async scheduling on)."""
    from patchkit_deepseek_v4 import kv_config_hook as hook

    vc = make_config(v4_checkpoint, max_model_len, async_scheduling=True)
    plan = hook.plan_pool(toy, vc, [toy_specs(toy)], [10**4 * 4096], placement=toy.placement())
    assert (plan.working_per_group, plan.image_groups, plan.withheld) == (2, 3, 11)
    return plan.minimum_physical(max_model_len)


@pytest.mark.parametrize("n", [1, 3])
def test_exact_minimum_pool_serves_max_length_requests_under_async_scheduling(patched, v4_checkpoint, toy, n):
    """The pool is exactly the hook's minimum (82 history + 2 x 3 image + null + 11 withheld = 100 physical
    blocks, the synchronous figure: 2 per image group under async too): one max-length request runs without a preemption and uses the pool to the last block; n of them at
    once (distinct prompts, no shared prefix) all finish too, preempting each other but never stuck."""
    physical = minimum_physical(v4_checkpoint, toy, L_MAX)
    assert physical == 82 + 6 + 1 + 11
    sched = build(v4_checkpoint, toy, blocks=physical, max_model_len=L_MAX)
    assert hook_plan(patched)["usable"] == sched.kv_cache_manager.block_pool.num_gpu_blocks == physical - 11
    engine = Engine(sched)
    reqs = [new_request(sched, f"r{i}", range(1 + i * L_MAX, 1 + i * L_MAX + L_MAX - 64), max_tokens=64)
            for i in range(n)]
    peak, min_free = serve(engine, reqs)
    assert all(r.num_tokens == L_MAX and r.status.name == "FINISHED_LENGTH_CAPPED" for r in reqs)
    assert peak == 2
    if n == 1:
        assert reqs[0].num_preemptions == 0 and min_free == 0  # exactly the peak: no block to spare
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1 and not book(sched).pending
    assert counts(patched)["published"] >= n  # images were on: rungs every 512 tokens published


def test_one_block_below_the_minimum_is_refused_and_vllm_would_preempt(patched, v4_checkpoint, toy):
    """One block less than the hook's minimum: start-up is refused with the numbers. Below the check (the
    block taken off after it), vLLM's AsyncScheduler cannot run the lone max-length request straight: at the
    step with a block-aligned chunk in flight it finds no block and preempts the request itself."""
    from patchkit_deepseek_v4 import kv_config_hook as hook

    physical = minimum_physical(v4_checkpoint, toy, L_MAX)
    with pytest.raises(hook.PoolTooSmall) as info:
        build(v4_checkpoint, toy, blocks=physical - 1, max_model_len=L_MAX)
    msg = str(info.value)
    for part in (f"{physical - 1} blocks of 4096 B", "11 withheld for 4 state slots",
                 "6 image working blocks (2 x 3 image groups", "= 81 blocks",
                 "ceil(20992/256) = 82", "1 block(s) short", f"--num-gpu-blocks-override to at least {physical}"):
        assert part in msg, (part, msg)

    # 1 block short (native's figure, which counts vLLM's null block as usable: the measured reason for the +1)
    for short in (1,):
        sched = build(v4_checkpoint, toy, blocks=physical, max_model_len=L_MAX, bypass=short)
        engine = Engine(sched)
        req = new_request(sched, "r0", range(1, L_MAX - 64 + 1), max_tokens=64)
        with pytest.raises(AssertionError, match="not finished|stuck"):
            serve(engine, [req])  # the lone request is preempted again and again: it never finishes
        assert req.num_preemptions >= 1 and req.num_tokens < L_MAX, short


def test_a_duplicate_image_is_not_published_again(patched, v4_checkpoint, toy):
    """Issue 22 item 6. A block-aligned 1,024-token prompt files its anchor 768 (one block short) and the rung
    1,024 (one chunk: the cut is the earliest of the anchor and the last rung inside it, as native's). The same prompt again can match at most 1,023 tokens: it resumes at 768 and ends on 1,024
    again, whose boundary already has a whole image: not published again (native ``_image_cached``); the
    cached image stays the first request's blocks."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    r0 = new_request(sched, "r0", range(1, 1025), max_tokens=4)
    engine.until(lambda: r0.is_finished())
    first = image_blocks(sched, 1024, r0)
    assert first is not None and counts(patched)["filed"] == {"rung": 1, "anchor": 1}
    r1 = new_request(sched, "r1", range(1, 1025), max_tokens=4)
    assert first_schedule_hit(engine, r1) == 768
    engine.until(lambda: r1.is_finished())
    c = counts(patched)
    assert c["filed"]["rung"] == 2 and c["duplicates_skipped"] == 1 and c["published"] == 2
    assert image_blocks(sched, 1024, r1) == first


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_an_image_published_for_a_step_its_request_is_preempted_from_is_taken_back(patched, v4_checkpoint, toy,
                                                                                   asynchronous):
    """Issue 22 item 7, reachable on vLLM's scheduler: with priority scheduling, ``Scheduler.schedule`` preempts
    the lowest-priority running request even after it scheduled it in the same step (and drops that step). Here
    "low" (priority 10) is scheduled first, its prefill chunk cut at the rung 3,584 whose image the book
    publishes at allocation; then "high" (priority 0) crosses into a new block and finds none (3 free: "low"
    took 2), so vLLM preempts "low". That step's forward never runs, so the image is never written: it is taken
    back (its blocks leave the prefix cache). Without the rule it stayed published under the prefix hash."""
    sched = build(v4_checkpoint, toy, blocks=200, asynchronous=asynchronous, max_model_len=16_384)
    sched.policy = type(sched.policy).PRIORITY
    sched.max_num_scheduled_tokens = 612  # "low" gets 512 a step (cut at its rungs), "high" its decode token
    pool = sched.kv_cache_manager.block_pool
    engine = Engine(sched)
    low = new_request(sched, "low", range(1, 12_001), max_tokens=8)
    low.priority = 10
    engine.step()  # "low" runs first: it precedes "high" in the running list
    high = new_request(sched, "high", range(20_001, 20_255), max_tokens=100)
    high.priority = 0
    engine.until(lambda: high.num_computed_tokens >= 256)
    assert low.num_computed_tokens == 3072 and low.num_preemptions == 0
    held = pool.get_new_blocks(pool.get_num_free_blocks() - 3)  # leave 3 free blocks
    out = engine.step()
    assert dict(out.num_scheduled_tokens) == {"high": 1} and low.num_preemptions == 1
    assert image_blocks(sched, 3584, low) is None  # published at allocation, taken back at the preemption
    assert image_blocks(sched, 3072, low) is not None  # the previous step's rung ran: it stays
    assert counts(patched)["unpublished_not_run"] == 1
    pool.free_blocks(held)
    engine.until(lambda: low.is_finished() and high.is_finished(), limit=400)
    assert image_blocks(sched, 3584, low) is not None  # filed again when "low" resumed and ran it


# ---------------------------------------------------------------------------
# Item 9: vLLM-side pieces of the worker path (zeroing off, copy-on-write refused)
# ---------------------------------------------------------------------------


def test_kv_zeroing_is_off_for_the_adapters_pool_and_on_without_the_patch(patched, v4_checkpoint, toy):
    """vLLM zeroes new blocks of a config with Mamba groups (its view of a block is not the adapter's layout):
    with the patch the scheduler, its coordinator and a worker read False and no block is listed to zero;
    after unpatching, vLLM's own answer for the same config is True."""
    sched = build(v4_checkpoint, toy)
    assert sched.needs_kv_cache_zeroing is False and sched.kv_cache_config.needs_kv_cache_zeroing is False
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 700), max_tokens=4)
    listed = []
    while not req.is_finished():
        listed += list(engine.step().new_block_ids_to_zero or [])
    assert listed == []
    assert counts(patched)["published"] >= 1
    patched.unpatch()
    assert sched.kv_cache_config.needs_kv_cache_zeroing is True  # vLLM alone: Mamba groups are zeroed


def test_copy_on_write_copies_on_the_adapters_pool_stop_engine_core(patched, v4_checkpoint, toy):
    """A copy-on-write pair pending in an image group (vLLM's own drain, take_kv_cache_block_copies, turns it
    into SchedulerOutput.kv_cache_block_copies): the step is refused with the blocks named. (vLLM makes such
    pairs on partial hits of hybrid groups; one is queued on the group's own list here, as its CoW path does.)"""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 300), max_tokens=2)
    engine.until(lambda: req.is_finished())
    gid = book(sched).layout.group_ids[0]
    mgr = sched.kv_cache_manager.coordinator.single_type_managers[gid]
    src, dst = sched.kv_cache_manager.block_pool.get_new_blocks(2)
    mgr._pending_cow_copies.append((src, dst))
    with pytest.raises(RuntimeError, match=f"image-cow-refuse@1: vLLM scheduled 1 copy-on-write block copies "
                                           rf"\(source, copy: \[\({src.block_id}, {dst.block_id}\)\]\)"):
        sched.schedule()


def test_at_interval_zero_the_working_blocks_still_count(patched, v4_checkpoint, toy, monkeypatch):
    """The measured reason the minimum pool keeps 2 blocks per image group at interval 0, where the native
    plugin counts none (``images_per_request() == 0``): the groups still allocate. At the hook's minimum (100
    physical) a lone max-length request runs through; with the 2 x 3 image blocks taken off after the check
    (native's figure plus vLLM's null block) it never finishes."""
    monkeypatch.setenv(INTERVAL_ENV, "0")
    physical = minimum_physical(v4_checkpoint, toy, L_MAX)
    assert physical == 100
    sched = build(v4_checkpoint, toy, blocks=physical, max_model_len=L_MAX)
    req = new_request(sched, "r0", range(1, L_MAX - 64 + 1), max_tokens=64)
    peak, _ = serve(Engine(sched), [req])
    assert req.num_tokens == L_MAX and req.num_preemptions == 0 and peak == 2
    assert counts(patched)["published"] == 0
    sched = build(v4_checkpoint, toy, blocks=physical, max_model_len=L_MAX, bypass=6)
    req = new_request(sched, "r0", range(1, L_MAX - 64 + 1), max_tokens=64)
    with pytest.raises(AssertionError, match="not finished|stuck") as info:
        serve(Engine(sched), [req])
    assert req.num_tokens < L_MAX, str(info.value)


# ---------------------------------------------------------------------------
# As patches: who gets them
# ---------------------------------------------------------------------------


def test_skipped_without_prefix_caching(v4_checkpoint, toy, standin_registered):
    vc = make_config(v4_checkpoint, 4096, override=100)
    vc.cache_config.enable_prefix_caching = False
    loader = process_loader("engine_core")
    try:
        loader.run_config_stage(vc)
        for pid in IDS:
            rec = loader.records[pid]
            assert (rec.state, rec.code) == ("skipped", "precondition") and "prefix_caching" in rec.reason, pid
    finally:
        loader.unpatch()
        runtime.reset()


def test_a_model_without_image_groups_is_passed_through(patched, v4_checkpoint):
    """Registered adapters' proxy layers absent from the KV config: no book, vLLM's own caching."""
    from tests.patches.test_kv_config_hook import _llama_specs

    import vllm.v1.engine.core as core
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.structured_output import StructuredOutputManager

    vc = make_config(v4_checkpoint, 4096)
    configs = core.get_kv_cache_configs(vc, [_llama_specs()], [10**8])
    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks
    sched = AsyncScheduler(vllm_config=vc, kv_cache_config=sched_cfg,
                           structured_output_manager=StructuredOutputManager(vc), block_size=BS, log_stats=False)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 600), max_tokens=8)
    engine.until(lambda: req.is_finished())
    assert book(sched) is None
    assert patched.records["image-publish"].detail["layout"] is None
